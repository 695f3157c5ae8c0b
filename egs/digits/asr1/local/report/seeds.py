"""Report section "WER spread over training seeds" (local/seed_spread.sh).

``python -m report.seeds --test_set T MODEL=SEARCH=SEED=DECODE_DIR ...`` prints the
section's markdown: the WER of every (model, seed), per model the mean and the spread
(max - min) over the seeds, and per seed the difference of each model to the standard
model, with its mean and range: a difference between two models is real when it
exceeds what the seed alone moves them.
"""

import argparse
import os
import statistics
import sys

from report.common import fmt_pct, load_json

MODELS = ("standard", "multiblank", "tdt")


def read_runs(specs):
    """{(model, seed): (search, wer or None)} from MODEL=SEARCH=SEED=DECODE_DIR."""
    runs = {}
    for spec in specs:
        model, search, seed, decode_dir = spec.split("=", 3)
        score = load_json(os.path.join(decode_dir, "score.json")) or {}
        runs[model, int(seed)] = (search, score.get("wer"))
    return runs


def _pm(value):
    return "n/a" if value is None else f"{value:+.2f}"


def section(runs, test_set, train_args=""):
    """The markdown lines of the section."""
    seeds = sorted({seed for _, seed in runs})
    models = [m for m in MODELS if any((m, s) in runs for s in seeds)]
    searches = {m: next(runs[m, s][0] for s in seeds if (m, s) in runs) for m in models}
    L = ["## WER spread over training seeds", ""]
    listed = ", ".join(map(str, seeds))
    L.append(
        f"The three models trained again with ESPnet's `--seed` {listed}"
        " on the same data, side by side as in stages 6-8 (one torch thread each"
        + (
            f"; extra training arguments `{train_args.strip()}`"
            if train_args.strip()
            else ""
        )
        + f"), greedy search on `{test_set}` (local/seed_spread.sh)."
    )
    L += ["", "| seed | " + " | ".join(f"{m} / {searches[m]}" for m in models)]
    L[-1] += " | " + " | ".join(f"{m} - standard" for m in models if m != "standard")
    L[-1] += " |"
    L.append("|" + "---|" * (1 + len(models) + len(models) - 1))
    diffs = {m: [] for m in models if m != "standard"}
    for s in seeds:
        wer = {m: runs.get((m, s), (None, None))[1] for m in models}
        cells = [fmt_pct(wer[m]) for m in models]
        for m in diffs:
            d = None
            if wer[m] is not None and wer.get("standard") is not None:
                d = wer[m] - wer["standard"]
                diffs[m].append(d)
            cells.append(_pm(d))
        L.append(f"| {s} | " + " | ".join(cells) + " |")
    means, spreads = [], []
    for m in models:
        wers = [
            runs[m, s][1] for s in seeds if runs.get((m, s), (0, None))[1] is not None
        ]
        means.append(fmt_pct(statistics.mean(wers)) if wers else "n/a")
        spreads.append(f"{max(wers) - min(wers):.2f}" if len(wers) > 1 else "n/a")
    mean_diffs = [_pm(statistics.mean(d)) if d else "n/a" for d in diffs.values()]
    range_diffs = [
        f"{min(d):+.2f} .. {max(d):+.2f}" if d else "n/a" for d in diffs.values()
    ]
    L.append("| mean | " + " | ".join(means + mean_diffs) + " |")
    L.append("| spread (max - min) | " + " | ".join(spreads + range_diffs) + " |")
    L.append("")
    return L


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--test_set", default="test")
    p.add_argument("--train_args", default="")
    p.add_argument("runs", nargs="+", help="MODEL=SEARCH=SEED=DECODE_DIR")
    a = p.parse_args(argv)
    print("\n".join(section(read_runs(a.runs), a.test_set, a.train_args)))


if __name__ == "__main__":
    sys.exit(main())
