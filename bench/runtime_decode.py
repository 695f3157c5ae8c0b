#!/usr/bin/env python3
"""The torch-free runtime against the plug-in's PyTorch decoding, side by side.

For every model of ``EXP_ROOT/asr_{standard,multiblank,tdt}`` (the digits recipe's)
exported to ONNX (``EXP_ROOT/asr_<model>/onnx_<inference model>``, stage 13; made
here when missing), ``--utts`` utterances of ``DATA_DIR/wav.scp`` are decoded one
at a time, in interleaved rounds (``--rounds``; medians and minimums), one thread
each, with the shipped greedy settings (``mb_greedy`` / ``tdt_greedy``):

* ``pytorch``: the plug-in's ``MultiblankSpeech2Text`` (front end, encoder and
  search in PyTorch), called on each waveform as an ESPnet user would;
* ``runtime``: ``espnet_multiblank.runtime.Recognizer.recognize`` (ONNX Runtime and
  NumPy) on the same waveforms;
* ``runtime search``: the runtime's greedy search alone, on encoder outputs computed
  before the round (what big blanks and durations speed up).

Printed: per model the end-to-end seconds of both and their ratio (runtime /
PyTorch; the issue's goal: at most 0.7), the runtime's search seconds and the
standard model's over each other model's (goal: at least 1.7), and the hypotheses
that differ between the runtime and PyTorch (goal: 0). ``--json`` writes the figures.

Usage::

    python bench/runtime_decode.py egs/digits/asr1/exp egs/digits/asr1/data/test
    python bench/runtime_decode.py EXP DATA --utts 200 --rounds 5 --json out.json
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")

MODELS = ("standard", "multiblank", "tdt")
GREEDY = {
    "standard": {"search_type": "mb_greedy", "max_sym_per_frame": 1},
    "multiblank": {"search_type": "mb_greedy", "max_sym_per_frame": 1},
    "tdt": {"search_type": "tdt_greedy", "max_sym_per_frame": 10},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("exp", type=Path, help="the recipe's exp/ directory")
    p.add_argument("data", type=Path, help="a data directory with wav.scp")
    p.add_argument("--utts", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inference_model", default="valid.loss.ave")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    import espnet_multiblank.espnet.registration.quiet  # noqa: F401
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text
    from espnet_multiblank.export import export_model
    from espnet_multiblank.runtime import Recognizer, read_wav

    entries = [line.split() for line in (a.data / "wav.scp").read_text().splitlines()]
    step = max(len(entries) // a.utts, 1)
    waves = [read_wav(path)[0] for _, path in entries[::step][: a.utts]]
    audio = sum(w.size for w in waves) / 8000
    models = a.models.split(",")
    decoders = {}
    for m in models:
        exp = a.exp / f"asr_{m}"
        onnx_dir = exp / f"onnx_{a.inference_model}"
        if not onnx_dir.exists():
            export_model(
                exp / "config.yaml", exp / f"{a.inference_model}.pth", onnx_dir
            )
        s2t = MultiblankSpeech2Text(
            asr_train_config=str(exp / "config.yaml"),
            asr_model_file=str(exp / f"{a.inference_model}.pth"),
            device="cpu",
            transducer_conf=dict(GREEDY[m], blank_decision="total"),
        )
        rec = Recognizer(onnx_dir, num_threads=1)
        encoded = [rec.encode([w]) for w in waves]
        decoders[m] = (s2t, rec, encoded)

    times = {(m, k): [] for m in models for k in ("pytorch", "runtime", "search")}
    differ = {m: 0 for m in models}
    for r in range(a.rounds):
        for m in models:
            s2t, rec, encoded = decoders[m]
            start = time.perf_counter()
            with torch.no_grad():
                pt = [s2t(torch.from_numpy(w))[0][2] for w in waves]
            times[m, "pytorch"].append(time.perf_counter() - start)
            start = time.perf_counter()
            rt = [rec.recognize(w).token_ids for w in waves]
            times[m, "runtime"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for enc, lens in encoded:
                rec.search.search(enc, lens)
            times[m, "search"].append(time.perf_counter() - start)
            if r == 0:
                differ[m] = sum(x != y for x, y in zip(pt, rt))

    def med(m, k):
        return statistics.median(times[m, k])

    print(
        f"{len(waves)} utterances ({audio:.1f} s of audio), {a.rounds} rounds, one "
        "thread, batch 1; seconds: median (minimum)"
    )
    print(
        f"{'model':<11} {'pytorch':>16} {'runtime':>16} {'rt/pt':>6} "
        f"{'runtime search':>16} {'std/model':>9} {'differ':>7}"
    )
    out = {"utterances": len(waves), "audio_seconds": audio, "rounds": a.rounds}
    for m in models:
        ratio = med(m, "runtime") / med(m, "pytorch")
        speedup = (
            med("standard", "search") / med(m, "search")
            if "standard" in models
            else None
        )
        print(
            f"{m:<11} {med(m, 'pytorch'):7.3f} ({min(times[m, 'pytorch']):6.3f}) "
            f"{med(m, 'runtime'):7.3f} ({min(times[m, 'runtime']):6.3f}) {ratio:6.2f} "
            f"{med(m, 'search'):7.3f} ({min(times[m, 'search']):6.3f}) "
            + ("        -" if speedup is None else f"{speedup:9.2f}")
            + f" {differ[m]:>4}/{len(waves)}"
        )
        out[m] = {
            "pytorch_seconds": times[m, "pytorch"],
            "runtime_seconds": times[m, "runtime"],
            "runtime_search_seconds": times[m, "search"],
            "runtime_over_pytorch": ratio,
            "standard_search_over_this": speedup,
            "differing_hypotheses": differ[m],
        }
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
