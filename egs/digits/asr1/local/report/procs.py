"""Report section "Training with several processes" (local/compare_procs.sh).

``python -m report.procs --model M --search S --test_set T N=SEED=TRAIN_DIR=DECODE_DIR
...`` prints the section's markdown: per training run (N DDP processes, ESPnet seed),
the wall time per epoch (ESPnet's train.log: the train and valid ``time=`` of every
epoch), the training time, the best validation loss and the WER of the decoding; with
several seeds, the mean WER per number of processes against 1 process and the spread of
the 1-process seeds (the noise the difference is compared with).
"""

import argparse
import os
import statistics
import sys

from report.common import fmt_pct, fmt_time, load_json
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


def row(n, seed, train_dir, decode_dir):
    """{"procs", "seed", "epochs", "per_epoch", "train", "best_valid", "wer"} of one
    training run and its decoding."""
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
        "seed": int(seed),
        "epochs": len(secs),
        "per_epoch": statistics.median(secs) if secs else None,
        "train": train_seconds(exp, name[len("asr_") :]),
        "best_valid": min(valid) if valid else None,
        "wer": score.get("wer"),
    }


def summary(rows):
    """Per number of processes (ascending): {"procs", "wers", "mean_wer",
    "per_epoch"}; mean_wer and per_epoch (the mean of the runs' medians) are None when
    a run lacks its number."""
    out = []
    for n in sorted({r["procs"] for r in rows}):
        runs = [r for r in rows if r["procs"] == n]
        wers = [r["wer"] for r in runs]
        secs = [r["per_epoch"] for r in runs]
        out.append(
            {
                "procs": n,
                "wers": wers,
                "mean_wer": None if None in wers else statistics.mean(wers),
                "per_epoch": None if None in secs else statistics.mean(secs),
            }
        )
    return out


def section(rows, model, search, test_set, max_diff=0.5):
    """The markdown lines: one row per run, then (several seeds) the mean per number of
    processes against 1 process, with the seeds' spread at 1 process as the noise."""
    L = ["## Training with several processes (DDP on CPU)", ""]
    L.append(
        f"The `{model}` model trained again on the same data with `--train_procs N` "
        "(ESPnet's trainer, gloo, the global batch split among the processes), each "
        f"run alone on the machine (`--train_jobs 1`), then decoded on `{test_set}` "
        f"with `{search}` (`local/compare_procs.sh`). Time per epoch: median over "
        "the epochs of ESPnet's train + valid `time=`. Seed: ESPnet's `--seed` "
        "(0 is the recipe's)."
    )
    L.append("")
    L.append(
        "| processes | seed | epochs | time per epoch | training time "
        f"| best valid loss | WER {test_set} |"
    )
    L.append("|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["procs"], r["seed"])):
        L.append(
            f"| {r['procs']} | {r['seed']} | {r['epochs']} "
            f"| {fmt_time(r['per_epoch'])} | {fmt_time(r['train'])} "
            f"| {'-' if r['best_valid'] is None else format(r['best_valid'], '.3f')} "
            f"| {fmt_pct(r['wer'])} |"
        )
    L.append("")
    groups = summary(rows)
    base = next((g for g in groups if g["procs"] == 1), None)
    if base is None or base["mean_wer"] is None or len(groups) < 2:
        return L
    L.append(
        f"| processes | runs | mean WER {test_set} | WER range | mean time per epoch "
        "| mean WER vs 1 process |"
    )
    L.append("|---|---|---|---|---|---|")
    for g in groups:
        known = [w for w in g["wers"] if w is not None]
        span = f"{min(known):.2f}-{fmt_pct(max(known))}" if known else "-"
        diff = (
            "-" if g["mean_wer"] is None else f"{g['mean_wer'] - base['mean_wer']:+.2f}"
        )
        L.append(
            f"| {g['procs']} | {len(g['wers'])} | {fmt_pct(g['mean_wer'])} "
            f"| {span} | {fmt_time(g['per_epoch'])} | {diff} |"
        )
    L.append("")
    noise = max(base["wers"]) - min(base["wers"])
    for g in groups:
        if g["procs"] == 1 or g["mean_wer"] is None:
            continue
        d = g["mean_wer"] - base["mean_wer"]
        ok = "yes" if abs(d) <= max_diff else "no"
        line = (
            f"- {g['procs']} processes: mean WER {d:+.2f} absolute against 1 process "
            f"(goal within +-{max_diff}: {ok})"
        )
        if len(base["wers"]) > 1:
            line += f"; the {len(base['wers'])} seeds of 1 process span {noise:.2f}"
        L.append(line + ".")
    L.append("")
    return L


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--search", required=True)
    p.add_argument("--test_set", required=True)
    p.add_argument("runs", nargs="+", help="N=SEED=TRAIN_DIR=DECODE_DIR")
    a = p.parse_args(argv)
    rows = [row(*r.split("=", 3)) for r in a.runs]
    print("\n".join(section(rows, a.model, a.search, a.test_set)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
