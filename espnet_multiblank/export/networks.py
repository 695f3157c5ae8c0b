"""The prediction network's step and the joint network as exportable modules.

* :class:`PredictionStep` (``decoder.onnx``): ESPnet's ``TransducerDecoder`` one
  label at a time for N rows: embedding, the LSTM / GRU layers, then the joint
  network's ``lin_dec`` (the search adds the projections, as the plug-in's do);
* :class:`JointLogProbs` (``joint.onnx``): ``lin_out(act(enc_proj + dec_proj))``
  then the log-probabilities the searches read: a log-softmax over the V tokens (the
  big blanks included) and, for a TDT, one over the D duration outputs.

N rows, E embedding size, H hidden size, Ly layers, J joint space, V tokens.
"""

from typing import Any

import torch


class PredictionStep(torch.nn.Module):
    """Inputs: labels (N,) int64, state_h (Ly, N, H) float32 and, for an LSTM,
    state_c (Ly, N, H). Outputs: decoder_proj (N, J), then the new states in the
    same order. The first label of a hypothesis is the blank (``blank_id``), whose
    embedding the plug-in keeps at zero."""

    def __init__(self, model: Any):
        super().__init__()
        decoder = model.decoder
        self.embed = decoder.embed
        self.layers = decoder.decoder
        self.lstm = decoder.dtype == "lstm"
        self.lin_dec = model.joint_network.lin_dec

    def forward(self, labels, state_h, state_c=None):
        x = self.embed(labels).unsqueeze(1)  # (N, 1, E)
        hs, cs = [], []
        for n, rnn in enumerate(self.layers):
            if self.lstm:
                x, (h, c) = rnn(x, (state_h[n : n + 1], state_c[n : n + 1]))
                cs.append(c)
            else:
                x, h = rnn(x, state_h[n : n + 1])
            hs.append(h)
        proj = self.lin_dec(x[:, 0])
        if self.lstm:
            return proj, torch.cat(hs, 0), torch.cat(cs, 0)
        return proj, torch.cat(hs, 0)


class JointLogProbs(torch.nn.Module):
    """Inputs: encoder_proj (N, J), decoder_proj (N, J) float32 (either may have
    one row, broadcast against the other). Output: log_probs (N, V') float32:
    log_softmax over V for a (multi-blank) RNN-T; for a TDT the V token
    log-probabilities then the D duration log-probabilities."""

    def __init__(self, model: Any, num_durations: int = 0):
        super().__init__()
        joint = model.joint_network
        self.activation = joint.joint_activation
        self.lin_out = joint.lin_out
        self.num_durations = int(num_durations)
        self.num_tokens = int(self.lin_out.out_features) - self.num_durations

    def forward(self, encoder_proj, decoder_proj):
        logits = self.lin_out(self.activation(encoder_proj + decoder_proj))
        if not self.num_durations:
            return torch.log_softmax(logits, -1)
        V = self.num_tokens
        tok = torch.log_softmax(logits[:, :V], -1)
        dur = torch.log_softmax(logits[:, V:], -1)
        return torch.cat([tok, dur], -1)
