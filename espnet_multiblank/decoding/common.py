"""Pieces shared by the multi-blank searches: hypothesis type, joint/decoder stepping,
symbol masks.

Notation: T = encoder frames, D_enc / D_dec = encoder / prediction-network output size,
J = joint space size, V = vocabulary size (all blanks included), A = rows of a step
(active utterances or hypotheses), N = decoder layers, H = decoder units.
"""

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import torch
from espnet2.asr.transducer.beam_search_transducer import Hypothesis

from espnet_multiblank.decoding.layout import BlankLayout


@contextlib.contextmanager
def single_thread_on_cpu(device: Any) -> Iterator[None]:
    """Run the block with one intra-op thread when decoding on CPU.

    A search step works on a handful of rows ((A, J) matrices, one LSTM step); intra-op
    threads cannot speed that up and, on a loaded machine, make each op wait for the
    other threads (measured here: 17 ms instead of 0.13 ms per LSTM step with 2
    threads under load). The encoder, which does benefit from threads, runs outside.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


DecState = Tuple[torch.Tensor, Optional[torch.Tensor]]  # ((N, A, H), (N, A, H) | None)


@dataclass
class MultiblankHypothesis(Hypothesis):
    """ESPnet transducer ``Hypothesis`` plus the multi-blank bookkeeping.

    ``yseq`` starts with the standard blank (the prediction network's start symbol) and
    then holds labels only; ``score`` is the log-probability of the search path (beam
    search: log-sum over the paths merged into this hypothesis).

    Attributes:
        dec_proj: Prediction-network output for ``yseq``, already projected into the
            joint space when the joint network allows it. (J,) or (D_dec,)
        frame: Frame position t (frames consumed); complete when t == T.
        num_sym_frame: Labels emitted at ``frame`` so far (max-symbols guard).
        big_blank_emissions: Big blanks emitted on the (best) path.
        frames_skipped: Sum over those emissions of (d_i - 1).
    """

    dec_proj: Optional[torch.Tensor] = None
    frame: int = 0
    num_sym_frame: int = 0
    big_blank_emissions: int = 0
    frames_skipped: int = 0


class JointStepper:
    """Batched prediction-network steps and joint log-probabilities.

    When the joint network is ESPnet's ``JointNetwork`` (it has ``lin_enc`` and
    ``lin_dec``) the encoder frames are projected once per utterance and every decoder
    output once per label; the joint is then called with ``no_projection=True``, which
    computes exactly ``lin_out(act(lin_enc(e) + lin_dec(d)))`` as in training.

    Args:
        decoder: ESPnet ``TransducerDecoder`` (``embed``, ``rnn_forward``,
            ``init_state``).
        joint_network: ESPnet ``JointNetwork`` (or any ``joint(enc, dec) -> logits``).
    """

    def __init__(self, decoder: Any, joint_network: Any):
        self.decoder = decoder
        self.joint_network = joint_network
        self.project = hasattr(joint_network, "lin_enc") and hasattr(
            joint_network, "lin_dec"
        )
        self.cells = rnn_cells(decoder)
        self.lstm = self.cells is not None and isinstance(
            decoder.decoder[0], torch.nn.LSTM
        )

    def set_device(self, device: torch.device) -> None:
        if hasattr(self.decoder, "set_device"):
            self.decoder.set_device(device)

    def project_enc(self, enc_out: torch.Tensor) -> torch.Tensor:
        """(..., D_enc) -> (..., J) (identity without projection layers)."""
        return self.joint_network.lin_enc(enc_out) if self.project else enc_out

    def project_dec(self, dec_out: torch.Tensor) -> torch.Tensor:
        """(..., D_dec) -> (..., J) (identity without projection layers)."""
        return self.joint_network.lin_dec(dec_out) if self.project else dec_out

    def log_probs(self, enc_proj: torch.Tensor, dec_proj: torch.Tensor) -> torch.Tensor:
        """Plain log-softmax of the joint output (no sigma at decoding time).

        Args:
            enc_proj: (A, J) projected encoder frames.
            dec_proj: (A, J) projected prediction-network outputs.

        Returns:
            (A, V) float32 log-probabilities.
        """
        if self.project:
            logits = self.joint_network(enc_proj, dec_proj, no_projection=True)
        else:
            logits = self.joint_network(enc_proj, dec_proj)
        return torch.log_softmax(logits.float(), dim=-1)

    def init_state(self, batch: int) -> DecState:
        """Zero decoder state. ((N, batch, H), (N, batch, H) | None)"""
        return self.decoder.init_state(batch)

    def step(
        self, labels: torch.Tensor, state: DecState
    ) -> Tuple[torch.Tensor, DecState]:
        """One prediction-network step for A rows.

        Args:
            labels: (A,) last symbol of each row (long).
            state: ((N, A, H), (N, A, H) | None) states before the step.

        Returns:
            dec_proj: (A, J) projected outputs; new state ((N, A, H), (N, A, H) | None).
        """
        if self.cells is not None and not self.decoder.training:
            return self._cell_step(labels, state)
        emb = self.decoder.embed(labels.view(-1, 1))  # (A, 1, E)
        dec_out, new_state = self.decoder.rnn_forward(emb, state)  # (A, 1, D_dec)
        return self.project_dec(dec_out[:, 0]), new_state

    def _cell_step(
        self, labels: torch.Tensor, state: DecState
    ) -> Tuple[torch.Tensor, DecState]:
        """``step`` with ``torch.lstm_cell`` / ``torch.gru_cell``, layer by layer.

        Same arithmetic as the decoder's ``rnn_forward`` in eval mode (dropout is the
        identity there), but one fused cell op per layer instead of a ``torch.nn.LSTM``
        call, whose fixed cost (measured about 3x the cell's on one CPU thread) is
        paid once per emitted label in every search.
        """
        x = self.decoder.embed(labels.view(-1))  # (A, H)
        h_prev, c_prev = state
        hs, cs = [], []
        for layer, weights in enumerate(self.cells):
            if self.lstm:
                h, c = torch.lstm_cell(x, (h_prev[layer], c_prev[layer]), *weights)
                cs.append(c)
            else:
                h = torch.gru_cell(x, h_prev[layer], *weights)
            hs.append(h)
            x = h
        new_state = (torch.stack(hs), torch.stack(cs) if cs else None)
        return self.project_dec(x), new_state


def rnn_cells(decoder: Any) -> Optional[List[Tuple[torch.Tensor, ...]]]:
    """Per-layer cell weights of an ESPnet ``TransducerDecoder``, or None.

    Returns ``[(w_ih, w_hh, b_ih, b_hh), ...]`` when every layer is a one-layer,
    unidirectional ``torch.nn.LSTM`` / ``torch.nn.GRU`` with biases and no projection
    (what ``TransducerDecoder`` builds); None for anything else, which then goes
    through the decoder's own ``rnn_forward``.
    """
    layers = getattr(decoder, "decoder", None)
    if not isinstance(layers, torch.nn.ModuleList) or not hasattr(decoder, "embed"):
        return None
    cells = []
    for rnn in layers:
        if (
            type(rnn) not in (torch.nn.LSTM, torch.nn.GRU)
            or rnn.num_layers != 1
            or rnn.bidirectional
            or not rnn.bias
            or getattr(rnn, "proj_size", 0)
        ):
            return None
        cells.append(
            (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
        )
    if not cells or len({type(rnn) for rnn in layers}) != 1:
        return None
    return cells


def select_state(state: DecState, idx: torch.Tensor) -> DecState:
    """Rows ``idx`` of a batched decoder state. idx: (A,) -> ((N, A, H), ...)."""
    h, c = state
    return h[:, idx], (c[:, idx] if c is not None else None)


def cat_states(states: List[DecState]) -> DecState:
    """Concatenate per-row states along the batch axis."""
    h = torch.cat([s[0] for s in states], dim=1)
    c = None if states[0][1] is None else torch.cat([s[1] for s in states], dim=1)
    return h, c


def scatter_state(state: DecState, idx: torch.Tensor, rows: DecState) -> None:
    """Write ``rows`` (A rows) into ``state`` at ``idx`` (in place)."""
    state[0][:, idx] = rows[0]
    if state[1] is not None:
        state[1][:, idx] = rows[1]


class SymbolTable:
    """Per-vocabulary tensors describing the blanks of a layout.

    Attributes:
        advance: (V,) long, frames advanced by each symbol (0 for labels);
            ``advance_list`` is the same as a Python list.
        is_label: (V,) bool.
        big_ids: (N,) long, index of big blank i.
        durations: (N,) long.
    """

    def __init__(self, layout: BlankLayout, device: torch.device):
        V = layout.vocab_size
        self.layout = layout
        self.advance = torch.zeros(V, dtype=torch.long, device=device)
        self.advance[layout.blank_id] = 1
        self.big_ids = torch.tensor(
            layout.big_blank_ids, dtype=torch.long, device=device
        )
        self.durations = torch.tensor(layout.durations, dtype=torch.long, device=device)
        if len(layout.durations):
            self.advance[self.big_ids] = self.durations
        self.is_label = self.advance == 0
        self.advance_list: List[int] = self.advance.tolist()

    def mask(
        self,
        logp: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        max_sym: int,
    ) -> torch.Tensor:
        """Set the log-probability of disallowed symbols to -inf.

        Disallowed: labels once ``max_sym`` labels were emitted at this frame, and big
        blank i when ``frame + d_i > length`` (a path must end exactly at T, as in the
        loss). The standard blank is always allowed.

        Args:
            logp: (A, V) log-probabilities (not modified).
            frame: (A,) current frame t of each row.
            length: (A,) encoder length T of each row.
            num_sym: (A,) labels already emitted at ``frame``.

        Returns:
            (A, V) masked copy.
        """
        neg = torch.tensor(float("-inf"), dtype=logp.dtype, device=logp.device)
        out = torch.where(
            (num_sym >= max_sym).unsqueeze(1) & self.is_label.unsqueeze(0), neg, logp
        )
        if self.big_ids.numel():
            over = (
                frame.unsqueeze(1) + self.durations.unsqueeze(0)
            ) > length.unsqueeze(1)
            cols = out[:, self.big_ids]
            out[:, self.big_ids] = torch.where(over, neg, cols)
        return out
