"""``export_onnx --format sherpa_onnx``: what sherpa-onnx's NeMo transducer support
reads (``OfflineRecognizer.from_transducer(..., model_type="nemo_transducer")``).

sherpa-onnx reads its three graphs by position and its metadata by key
(``offline-transducer-nemo-model.cc``, ``offline-transducer-greedy-search-nemo-
decoder.cc``):

* ``encoder.onnx``: ``features`` (B, C, T) float32 (sherpa-onnx's own features:
  kaldi-native-fbank, which ``frontend: kaldi_fbank`` computes in training) and
  ``features_length`` (B,) int64 -> ``encoder_out`` (B, D, T), ``encoder_out_length``
  (B,) int64. The model's ``global_mvn`` (and pre-encoder) are folded into it;
  ``normalize_type`` is empty (sherpa-onnx normalises nothing);
* ``decoder.onnx``: ``targets`` (N, 1) int32 (sherpa-onnx's token ids),
  ``target_length`` (N,) int32, ``states.1``, ``states.2`` (layers, N, H) (LSTM h,
  c) -> ``decoder_output`` (N, H, 1), ``target_length_out``, the two new states;
* ``joiner.onnx``: ``encoder_output`` (N, D, 1), ``decoder_output`` (N, H, 1) ->
  ``logits`` (N, 1, 1, V') raw: the V tokens (blank last) and, for a TDT, the
  duration logits;
* ``tokens.txt``: ``<token> <id>`` per line with the blank last as ``<blk>`` (NeMo's
  order: the exporter permutes the vocabulary, the graphs map ids back); word and
  ``<space>`` tokens get SentencePiece's ``▁`` so that sherpa-onnx's text has spaces;
* metadata on the encoder: ``vocab_size`` (V - 1: NeMo counts without the blank),
  ``subsampling_factor``, ``normalize_type``, ``pred_rnn_layers``, ``pred_hidden``,
  ``feat_dim`` and ``url`` (containing "tdt" for a TDT: sherpa-onnx's marker).

Refused, with the reason and the format to use instead: multi-blank models
(sherpa-onnx has one blank), TDT durations other than 0, 1, 2, ..., K (sherpa-onnx
takes a duration's index as the frames it skips), a front end other than
``kaldi_fbank`` with sherpa-onnx's settings (its features would differ from the
training's), GRU prediction networks (sherpa-onnx passes two LSTM states).
"""

from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

from espnet_multiblank.export.encoder import OfflineEncoder
from espnet_multiblank.export.support import ExportError, unwrap_frontend
from espnet_multiblank.export.tracing import export_graph
from espnet_multiblank.runtime.metadata import ModelInfo

NATIVE = (
    "export it with --format native and decode it with espnet_multiblank.runtime "
    "(python -m espnet_multiblank.runtime.decode), which supports every lattice"
)
GRAPHS = {"encoder": "encoder.onnx", "decoder": "decoder.onnx", "joiner": "joiner.onnx"}
WORD_START = "\u2581"
BLANK = "<blk>"


def check_sherpa(model: Any, info: ModelInfo) -> None:
    """Refuse (:class:`ExportError`) what sherpa-onnx would decode wrongly."""
    if info.lattice == "multiblank":
        raise ExportError(
            f"sherpa-onnx has no big blanks: a multi-blank model (durations "
            f"{info.big_blank_durations}) cannot be decoded by it; {NATIVE}"
        )
    if info.lattice == "tdt" and info.tdt_durations != list(
        range(len(info.tdt_durations))
    ):
        raise ExportError(
            f"sherpa-onnx takes a TDT duration's index as the frames it skips, so "
            f"only durations 0, 1, 2, ..., K decode right; this model's are "
            f"{info.tdt_durations}; {NATIVE}"
        )
    if info.decoder_rnn_type != "lstm":
        raise ExportError(
            f"sherpa-onnx's NeMo decoder passes two LSTM states; this prediction "
            f"network is a {info.decoder_rnn_type.upper()}; {NATIVE}"
        )
    frontend = unwrap_frontend(model)
    if type(frontend).__name__ != "KaldiFbankFrontend":
        raise ExportError(
            "sherpa-onnx computes its own features (kaldi-native-fbank), so the model "
            "must have been trained on them: frontend: kaldi_fbank (this model's "
            f"front end is {type(frontend).__name__}); {NATIVE}"
        )
    f32 = np.float32
    fs = f32(info.sample_rate)
    sherpa = {  # kaldi-native-fbank's sizes at this rate, and sherpa-onnx's options
        "frame_length": int(fs * f32(0.001) * f32(25.0)),
        "frame_shift": int(fs * f32(0.001) * f32(10.0)),
        "preemph_coeff": 0.97,
        "window": "povey",
        "low_freq": 0.0,
        "high_freq": -400.0,
        "remove_dc_offset": False,
    }
    got = {key: getattr(frontend, key) for key in sherpa}
    if got != sherpa:
        differ = {k: v for k, v in got.items() if v != sherpa[k]}
        raise ExportError(
            "frontend_conf differs from the features sherpa-onnx computes for NeMo "
            "transducers (25 ms frames every 10 ms, pre-emphasis 0.97, povey window, "
            f"0 Hz to Nyquist - 400 Hz, no DC offset removal): {differ}; {NATIVE}"
        )
    if model.normalize is not None and type(model.normalize).__name__ != "GlobalMVN":
        raise ExportError(
            f"normalize {type(model.normalize).__name__} cannot be folded into the "
            "encoder for sherpa-onnx (global_mvn or none can); " + NATIVE
        )


def vocabulary(info: ModelInfo, tokens: List[str]):
    """(sherpa-onnx's token list, ``order``): NeMo's order puts the blank last;
    ``order[i]`` is the model's id of sherpa-onnx's token i."""
    blank = info.blank_id
    order = [k for k in range(len(tokens)) if k != blank] + [blank]
    out = []
    for k in order:
        tok = tokens[k]
        if k == blank:
            tok = BLANK
        elif info.token_type == "word":
            tok = WORD_START + tok
        elif info.token_type == "char" and tok == "<space>":
            tok = WORD_START
        out.append(tok)
    return out, order


class SherpaEncoder(torch.nn.Module):
    """(B, C, T) features + (B,) lengths -> (B, D, T) + (B,) lengths."""

    def __init__(self, model: Any, kind: str):
        super().__init__()
        self.encoder = OfflineEncoder(model, kind)
        self.streaming = kind == "chunk_conformer"

    def forward(self, features, features_length):
        feats = features.transpose(1, 2)  # (B, T, C)
        feats = self.encoder.frontend.normalized(feats, features_length)
        chunk = torch.zeros((), dtype=torch.int64) if self.streaming else None
        out, olens = self.encoder.encode_features(feats, features_length, chunk)
        return out.transpose(1, 2), olens


class SherpaDecoder(torch.nn.Module):
    """(N, 1) int32 sherpa-onnx ids, (N,) int32 lengths, LSTM states -> (N, H, 1)
    prediction output, the lengths, the new states."""

    def __init__(self, model: Any, order: List[int]):
        super().__init__()
        decoder = model.decoder
        self.embed = decoder.embed
        self.layers = decoder.decoder
        self.register_buffer("order", torch.tensor(order, dtype=torch.int64))

    def forward(self, targets, target_length, state_h, state_c):
        labels = self.order[targets[:, 0].long()]  # sherpa-onnx ids -> the model's
        x = self.embed(labels).unsqueeze(1)
        hs, cs = [], []
        for n, rnn in enumerate(self.layers):
            x, (h, c) = rnn(x, (state_h[n : n + 1], state_c[n : n + 1]))
            hs.append(h)
            cs.append(c)
        out = x.transpose(1, 2)  # (N, H, 1)
        return out, target_length, torch.cat(hs, 0), torch.cat(cs, 0)


class SherpaJoiner(torch.nn.Module):
    """(N, D, 1) encoder frames, (N, H, 1) prediction outputs -> (N, 1, 1, V') raw
    logits with the tokens in sherpa-onnx's order."""

    def __init__(self, model: Any, order: List[int], num_durations: int):
        super().__init__()
        joint = model.joint_network
        self.joint = joint
        V = len(order)
        columns = list(order) + list(range(V, V + num_durations))
        self.register_buffer("columns", torch.tensor(columns, dtype=torch.int64))

    def forward(self, encoder_output, decoder_output):
        enc = self.joint.lin_enc(encoder_output[..., 0])
        dec = self.joint.lin_dec(decoder_output[..., 0])
        logits = self.joint.lin_out(self.joint.joint_activation(enc + dec))
        return logits[:, self.columns].unsqueeze(1).unsqueeze(1)


def metadata(info: ModelInfo, feat_dim: int) -> Dict[str, str]:
    url = "espnet-multiblank " + ("tdt" if info.lattice == "tdt" else "rnnt")
    return {
        "vocab_size": str(info.vocab_size - 1),
        "subsampling_factor": str(info.subsampling),
        "normalize_type": "",
        "pred_rnn_layers": str(info.decoder_layers),
        "pred_hidden": str(info.decoder_hidden),
        "feat_dim": str(feat_dim),
        "url": url,
        "model_type": "EncDecRNNTBPEModel",
        "version": info.version,
    }


def write_sherpa(model: Any, info: ModelInfo, out: Path) -> None:
    """The three graphs and tokens.txt (module docstring) into ``out``."""
    check_sherpa(model, info)
    tokens, order = vocabulary(info, list(model.token_list))
    (out / "tokens.txt").write_text(
        "".join(f"{t} {i}\n" for i, t in enumerate(tokens)), encoding="utf-8"
    )
    C = unwrap_frontend(model).n_mels
    T = info.receptive_field + 8 * info.subsampling
    export_graph(
        SherpaEncoder(model, info.encoder_type),
        (torch.randn(2, C, T), torch.tensor([T, T - 5])),
        out / GRAPHS["encoder"],
        ["features", "features_length"],
        ["encoder_out", "encoder_out_length"],
        {
            "features": {0: "batch", 2: "frames"},
            "features_length": {0: "batch"},
            "encoder_out": {0: "batch", 2: "out_frames"},
            "encoder_out_length": {0: "batch"},
        },
        metadata(info, C),
    )
    L, H = info.decoder_layers, info.decoder_hidden
    export_graph(
        SherpaDecoder(model, order),
        (
            torch.tensor([[len(order) - 1], [0]], dtype=torch.int32),
            torch.tensor([1, 1], dtype=torch.int32),
            torch.zeros(L, 2, H),
            torch.zeros(L, 2, H),
        ),
        out / GRAPHS["decoder"],
        ["targets", "target_length", "states.1", "states.2"],
        ["decoder_output", "target_length_out", "states_out.1", "states_out.2"],
        {
            "targets": {0: "rows"},
            "target_length": {0: "rows"},
            "states.1": {1: "rows"},
            "states.2": {1: "rows"},
            "decoder_output": {0: "rows"},
            "target_length_out": {0: "rows"},
            "states_out.1": {1: "rows"},
            "states_out.2": {1: "rows"},
        },
        {},
    )
    D = info.encoder_size
    export_graph(
        SherpaJoiner(model, order, len(info.tdt_durations)),
        (torch.randn(2, D, 1), torch.randn(2, H, 1)),
        out / GRAPHS["joiner"],
        ["encoder_output", "decoder_output"],
        ["logits"],
        {
            "encoder_output": {0: "rows"},
            "decoder_output": {0: "rows"},
            "logits": {0: "rows"},
        },
        {},
    )
