"""Report section "Training with several processes" (local/compare_procs.sh).

``python -m report.procs --model M --search S --test_set T N=TRAIN_DIR=DECODE_DIR ...``
prints the section's markdown: per number of DDP processes N, the wall time per epoch
(ESPnet's train.log: the train and valid ``time=`` of every epoch), the training time,
the best validation loss and the WER of the decoding.
"""

import argparse
import os
import statistics
import sys

from report.common import fmt_time, load_json
from report.training import parse_train_log, train_seconds


def epoch_seconds(epochs):
    """[train + valid seconds] of every epoch that has both."""
    out = []
    for e in sorted(epochs):
        tr = epochs[e].get("train", {}).get("time")
        va = epochs[e].get("valid", {}).get("time")
        if isinstance(tr, str) and isinstance(va, str):
            out.append(float(tr.split()[0]) + float(va.split()[0]))
    return out


def row(n, train_dir, decode_dir):
    """{"procs", "epochs", "per_epoch", "train", "best_valid", "wer"} of one run."""
    epochs, _ = parse_train_log(os.path.join(train_dir, "train.log"))
    secs = epoch_seconds(epochs)
    valid = [
        epochs[e]["valid"]["loss"]
        for e in epochs
        if "loss" in epochs[e].get("valid", {})
    ]
    score = load_json(os.path.join(decode_dir, "score.json")) or {}
    exp, name = os.path.split(train_dir.rstrip("/"))
    return {
        "procs": int(n),
        "epochs": len(secs),
        "per_epoch": statistics.median(secs) if secs else None,
        "train": train_seconds(exp, name[len("asr_") :]),
        "best_valid": min(valid) if valid else None,
        "wer": score.get("wer"),
    }


def section(rows, model, search, test_set):
    L = ["## Training with several processes (DDP on CPU)", ""]
    L.append(
        f"The `{model}` model trained again on the same data with `--train_procs N` "
        "(ESPnet's trainer, gloo, the global batch split among the processes), each "
        f"run alone on the machine (`--train_jobs 1`), then decoded on `{test_set}` "
        f"with `{search}` (`local/compare_procs.sh`). Time per epoch: median over "
        "the epochs of ESPnet's train + valid `time=`."
    )
    L.append("")
    L.append(
        "| processes | epochs | time per epoch | training time | best valid loss "
        f"| WER {test_set} | WER vs 1 process |"
    )
    L.append("|---|---|---|---|---|---|---|")
    base = next((r for r in rows if r["procs"] == 1), None)
    for r in rows:
        diff = (
            f"{r['wer'] - base['wer']:+.2f}"
            if base and r["wer"] is not None and base["wer"] is not None
            else "-"
        )
        L.append(
            f"| {r['procs']} | {r['epochs']} | {fmt_time(r['per_epoch'])} "
            f"| {fmt_time(r['train'])} | "
            + (f"{r['best_valid']:.3f}" if r["best_valid"] is not None else "-")
            + " | "
            + (f"{r['wer']:.2f}%" if r["wer"] is not None else "-")
            + f" | {diff} |"
        )
    L.append("")
    return L


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--search", required=True)
    p.add_argument("--test_set", required=True)
    p.add_argument("runs", nargs="+", help="N=TRAIN_DIR=DECODE_DIR")
    a = p.parse_args(argv)
    rows = [row(*r.split("=", 2)) for r in a.runs]
    print("\n".join(section(rows, a.model, a.search, a.test_set)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
