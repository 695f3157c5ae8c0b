"""The exporter's check that ONNX Runtime computes what PyTorch computes.

Every graph of an export runs in ONNX Runtime on inputs it was not traced with
(other batch sizes, lengths, padding, chunk sizes, cache lengths), and its outputs
are compared with the model's own PyTorch modules: ``model.encode`` of each utterance
alone (and, for ``chunk_conformer``, at chunk sizes 2 and 5), ESPnet's prediction
network step and joint network, and the chunk-masked encoder against the streaming
chunk graph run chunk after chunk by the runtime's stream encoder. A difference over
:data:`TOLERANCE` raises
:class:`~espnet_multiblank.export.support.ExportError`: the graph is wrong and is not
written.
"""

from pathlib import Path
from typing import Any, List

import numpy as np
import torch

from espnet_multiblank.export.sherpa import GRAPHS as SHERPA
from espnet_multiblank.export.sherpa import vocabulary
from espnet_multiblank.export.support import ExportError, unwrap_frontend
from espnet_multiblank.runtime.metadata import GRAPHS, ModelInfo

#: largest |ONNX Runtime - PyTorch| difference accepted by the verification, per
#: output (absolute; the encoder's outputs are O(1))
TOLERANCE = 1e-4


def test_waveforms(info: ModelInfo, seed: int = 0) -> List[np.ndarray]:
    """Tones and noise of several lengths, the shortest the encoder takes first."""
    rng = np.random.default_rng(seed)
    fs = info.sample_rate
    lengths = [
        info.min_samples,
        info.min_samples + 3 * info.framing["shift"] + 1,
        int(0.9 * fs) + 7,
        int(1.7 * fs) + 3,
    ]
    out = []
    for i, n in enumerate(lengths):
        t = np.arange(n) / fs
        tone = 0.2 * np.sin(2 * np.pi * (250 + 170 * i + 120 * t) * t)
        out.append((tone + 0.05 * rng.standard_normal(n)).astype(np.float32))
    return out


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


#: the largest difference seen (for the tests and logs)
_LARGEST = [0.0]


def largest_difference(reset: bool = False) -> float:
    """The largest ONNX Runtime - PyTorch difference the checks saw."""
    value = _LARGEST[0]
    if reset:
        _LARGEST[0] = 0.0
    return value


def _compare(what: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    if got.shape != want.shape:
        raise ExportError(
            f"{what}: ONNX Runtime gives shape {got.shape}, PyTorch {want.shape}"
        )
    if got.size == 0:
        return
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    _LARGEST[0] = max(_LARGEST[0], err)
    if not err <= tol:
        raise ExportError(
            f"{what}: ONNX Runtime differs from PyTorch by {err:.3g} (> {tol:g}); "
            "the graph is wrong and was not written"
        )


def verify_export(model: Any, info: ModelInfo, out: Path, tol: float = None) -> None:
    """Run every graph of ``out`` against the model (module docstring)."""
    tol = TOLERANCE if tol is None else tol
    waves = test_waveforms(info)
    chunks = [0] + ([2, 5] if info.streaming else [])
    _verify_encoder(model, info, out, waves, chunks, tol)
    _verify_networks(model, info, out, tol)
    if info.streaming:
        _verify_streaming(model, info, out, waves, tol)


def _reference_encode(model, wave: np.ndarray, chunk: int):
    enc = model.encoder
    if chunk:
        enc.set_decoding_chunk(chunk)
    try:
        with torch.no_grad():
            speech = torch.from_numpy(wave)[None]
            out, lens = model.encode(speech, torch.tensor([wave.size]))
            proj = model.joint_network.lin_enc(out)
    finally:
        if chunk:
            enc.set_decoding_chunk(0)
    n = int(lens[0])
    return out[0, :n].numpy(), proj[0, :n].numpy()


def _verify_encoder(model, info, out, waves, chunks, tol) -> None:
    sess = _session(out / GRAPHS["encoder"])
    B = len(waves)
    L = max(w.size for w in waves) + 37  # padding past the longest too
    speech = np.zeros((B, L), np.float32)
    for b, w in enumerate(waves):
        speech[b, : w.size] = w
    lengths = np.array([w.size for w in waves], np.int64)
    for chunk in chunks:
        feed = {"speech": speech, "speech_lengths": lengths}
        if info.encoder_type == "chunk_conformer":
            feed["chunk_size"] = np.array(chunk, np.int64)
        enc_out, enc_proj, enc_lens = sess.run(None, feed)
        for b, w in enumerate(waves):
            ref_out, ref_proj = _reference_encode(model, w, chunk)
            what = f"encoder.onnx (chunk {chunk}, utterance of {w.size} samples"
            if int(enc_lens[b]) != ref_out.shape[0]:
                raise ExportError(
                    f"{what}): {int(enc_lens[b])} frames, PyTorch "
                    f"{ref_out.shape[0]}"
                )
            n = ref_out.shape[0]
            _compare(what + ", batch of 4)", enc_out[b, :n], ref_out, tol)
            _compare(what + ", projection)", enc_proj[b, :n], ref_proj, tol)


def _verify_networks(model, info, out, tol) -> None:
    rng = np.random.default_rng(1)
    decoder = model.decoder
    N, H, Ly = 5, info.decoder_hidden, info.decoder_layers
    labels = rng.integers(0, info.vocab_size, N).astype(np.int64)
    labels[0] = info.blank_id
    h = rng.standard_normal((Ly, N, H)).astype(np.float32) * 0.5
    c = rng.standard_normal((Ly, N, H)).astype(np.float32) * 0.5
    sess = _session(out / GRAPHS["decoder"])
    feed = {"labels": labels, "state_h": h}
    if info.decoder_rnn_type == "lstm":
        feed["state_c"] = c
    got = sess.run(None, feed)
    with torch.no_grad():
        emb = decoder.embed(torch.from_numpy(labels)).unsqueeze(1)
        state = (torch.from_numpy(h), torch.from_numpy(c))
        dec_out, (h2, c2) = decoder.rnn_forward(emb, state)
        proj = model.joint_network.lin_dec(dec_out[:, 0])
    _compare("decoder.onnx (decoder_proj)", got[0], proj.numpy(), tol)
    _compare("decoder.onnx (new_state_h)", got[1], h2.numpy(), tol)
    if info.decoder_rnn_type == "lstm":
        _compare("decoder.onnx (new_state_c)", got[2], c2.numpy(), tol)
    J = info.joint_space
    enc = rng.standard_normal((N, J)).astype(np.float32)
    dec = rng.standard_normal((N, J)).astype(np.float32)
    sess = _session(out / GRAPHS["joint"])
    for e, d in ((enc, dec), (enc, dec[:1]), (enc[:1], dec)):
        (got,) = sess.run(None, {"encoder_proj": e, "decoder_proj": d})
        with torch.no_grad():
            logits = model.joint_network(
                torch.from_numpy(e), torch.from_numpy(d), no_projection=True
            )
            V = info.joint_size - len(info.tdt_durations)
            want = torch.cat(
                (
                    [
                        torch.log_softmax(logits[:, :V], -1),
                        torch.log_softmax(logits[:, V:], -1),
                    ]
                    if info.tdt_durations
                    else [torch.log_softmax(logits, -1)]
                ),
                -1,
            )
        _compare(
            f"joint.onnx (rows {e.shape[0]} x {d.shape[0]})", got, want.numpy(), tol
        )


def _verify_streaming(model, info, out, waves, tol) -> None:
    from espnet_multiblank.runtime.model import ExportedModel
    from espnet_multiblank.runtime.stream_encoder import StreamEncoder

    exported = ExportedModel(out, num_threads=1)
    for chunk in (2, 5):
        # two streams together (different lengths, so different cache lengths once
        # one has ended), fed in pieces that do not align with chunks
        streams = [StreamEncoder(exported, chunk) for _ in waves[2:]]
        outputs = [[] for _ in streams]
        piece = 3 * info.framing["shift"] + 11
        longest = max(w.size for w in waves[2:])
        for start in range(0, longest, piece):
            for s, w, o in zip(streams, waves[2:], outputs):
                if start < w.size:
                    s.accept(w[start : start + piece], final=start + piece >= w.size)
            for s, o, proj in zip(streams, outputs, StreamEncoder.run(streams)):
                o.extend(proj)
        for w, o in zip(waves[2:], outputs):
            _, ref_proj = _reference_encode(model, w, chunk)
            got = np.stack(o) if o else np.zeros((0, info.joint_space), np.float32)
            _compare(
                f"encoder_chunk.onnx (chunk {chunk}, {w.size} samples, streamed)",
                got,
                ref_proj,
                tol,
            )


def verify_sherpa(model: Any, info: ModelInfo, out: Path, tol: float = None) -> None:
    """The sherpa-onnx graphs of ``out`` against the model: the encoder on the
    model's own features of each test waveform (batched, padded), the decoder and
    the joiner on random inputs, with sherpa-onnx's token order."""
    tol = TOLERANCE if tol is None else tol
    waves = test_waveforms(info)
    frontend = unwrap_frontend(model)
    feats = []
    with torch.no_grad():
        for w in waves:
            f, n = frontend(torch.from_numpy(w)[None], torch.tensor([w.size]))
            feats.append(f[0, : int(n[0])].numpy())
    T = max(f.shape[0] for f in feats) + 7
    x = np.zeros((len(feats), feats[0].shape[1], T), np.float32)
    for b, f in enumerate(feats):
        x[b, :, : f.shape[0]] = f.T
    lengths = np.array([f.shape[0] for f in feats], np.int64)
    out_enc, out_lens = _session(out / SHERPA["encoder"]).run(
        None, {"features": x, "features_length": lengths}
    )
    for b, w in enumerate(waves):
        want, _ = _reference_encode(model, w, 0)
        n = want.shape[0]
        if int(out_lens[b]) != n:
            raise ExportError(
                f"sherpa-onnx encoder.onnx: {int(out_lens[b])} frames, PyTorch {n}"
            )
        _compare("sherpa-onnx encoder.onnx", out_enc[b, :, :n].T, want, tol)
    _, order = vocabulary(info, list(model.token_list))
    rng = np.random.default_rng(2)
    N, L, H = 4, info.decoder_layers, info.decoder_hidden
    ids = rng.integers(0, len(order), N).astype(np.int32)
    ids[0] = len(order) - 1  # the blank, sherpa-onnx's start symbol
    h = (0.5 * rng.standard_normal((L, N, H))).astype(np.float32)
    c = (0.5 * rng.standard_normal((L, N, H))).astype(np.float32)
    got = _session(out / SHERPA["decoder"]).run(
        None,
        {
            "targets": ids[:, None],
            "target_length": np.ones(N, np.int32),
            "states.1": h,
            "states.2": c,
        },
    )
    decoder = model.decoder
    with torch.no_grad():
        labels = torch.tensor([order[i] for i in ids])
        dec, (h2, c2) = decoder.rnn_forward(
            decoder.embed(labels).unsqueeze(1),
            (torch.from_numpy(h), torch.from_numpy(c)),
        )
    _compare("sherpa-onnx decoder.onnx", got[0][:, :, 0], dec[:, 0].numpy(), tol)
    _compare("sherpa-onnx decoder.onnx (h)", got[2], h2.numpy(), tol)
    _compare("sherpa-onnx decoder.onnx (c)", got[3], c2.numpy(), tol)
    enc = rng.standard_normal((N, info.encoder_size, 1)).astype(np.float32)
    dec_out = got[0]
    (logits,) = _session(out / SHERPA["joiner"]).run(
        None, {"encoder_output": enc, "decoder_output": dec_out}
    )
    with torch.no_grad():
        want = model.joint_network(
            torch.from_numpy(enc[:, :, 0])[:, None, None],
            torch.from_numpy(dec_out[:, :, 0])[:, None, None],
        )[:, 0, 0].numpy()
    V = len(order)
    columns = list(order) + list(range(V, want.shape[-1]))
    _compare("sherpa-onnx joiner.onnx", logits[:, 0, 0], want[:, columns], tol)
