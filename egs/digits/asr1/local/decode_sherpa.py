#!/usr/bin/env python3
"""Decode a wav.scp with sherpa-onnx (the PyPI wheel) and a model exported for it
(``python -m espnet_multiblank.bin.export_onnx --format sherpa_onnx``).

One utterance at a time, one thread, sherpa-onnx's greedy search for NeMo
transducers (``model_type="nemo_transducer"``; it computes its own features). Writes
``OUT/1best_recog/text`` (Kaldi format) and ``OUT/decoding_stats.json``
(utterances, audio seconds, decode seconds, real-time factor; model loading
excluded). Output files are written under temporary names and renamed.

Usage: decode_sherpa.py MODEL_DIR WAV_SCP OUT_DIR
"""

import json
import os
import sys
import time
from pathlib import Path


def main(model_dir: str, wav_scp: str, out_dir: str) -> int:
    import onnx
    import sherpa_onnx

    from espnet_multiblank.runtime import read_wav

    model = Path(model_dir)
    meta = {
        p.key: p.value for p in onnx.load(str(model / "encoder.onnx")).metadata_props
    }
    items = [line.split(maxsplit=1) for line in Path(wav_scp).read_text().splitlines()]
    waves = [(key, *read_wav(path)) for key, path in items]
    rate = waves[0][2]
    rec = sherpa_onnx.OfflineRecognizer.from_transducer(
        encoder=str(model / "encoder.onnx"),
        decoder=str(model / "decoder.onnx"),
        joiner=str(model / "joiner.onnx"),
        tokens=str(model / "tokens.txt"),
        num_threads=1,
        sample_rate=rate,
        feature_dim=int(meta["feat_dim"]),
        decoding_method="greedy_search",
        model_type="nemo_transducer",
    )
    lines, audio, start = [], 0.0, time.perf_counter()
    for key, samples, sr in waves:
        stream = rec.create_stream()
        stream.accept_waveform(sr, samples)
        rec.decode_stream(stream)
        lines.append(f"{key} {stream.result.text.strip()}\n")
        audio += samples.size / sr
    seconds = time.perf_counter() - start
    out = Path(out_dir)
    (out / "1best_recog").mkdir(parents=True, exist_ok=True)
    stats = {
        "num_utterances": len(waves),
        "audio_seconds": audio,
        "decode_seconds": seconds,
        "rtf": seconds / audio if audio else None,
        "decoder": f"sherpa-onnx {sherpa_onnx.__version__}, greedy_search, 1 thread",
    }
    for path, text in (
        (out / "1best_recog" / "text", "".join(lines)),
        (out / "decoding_stats.json", json.dumps(stats, indent=2) + "\n"),
    ):
        path.with_name(path.name + ".tmp").write_text(text, encoding="utf-8")
        os.replace(path.with_name(path.name + ".tmp"), path)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[-1])
    sys.exit(main(*sys.argv[1:]))
