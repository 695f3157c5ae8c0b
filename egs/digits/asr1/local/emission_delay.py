#!/usr/bin/env python3
"""Emission delays of a streaming decoding against known word boundaries.

For every word of a hypothesis that a minimum-cost alignment matches to the same word
of the reference, the delay is the audio (seconds) the streaming decoder had received
when it emitted the word (``1best_recog/emission``: the word appeared for good in
the partial hypotheses; ``1best_recog/decided``: it was decided) minus the time the
word ends in the audio (``word_times`` of make_real_digits.py): icefall's
"symbol delay". A negative delay is a word emitted before its recording ended.

Writes DECODE_DIR/emission_delay.json: the number of matched words and the mean,
median and 90th percentile of both delays (seconds).

Usage: emission_delay.py REF_TEXT WORD_TIMES DECODE_DIR
"""

import json
import os
import statistics
import sys
from typing import Dict, List, Sequence, Tuple


def read_table(path: str) -> Dict[str, List[str]]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if parts:
                out[parts[0]] = parts[1:]
    return out


def word_ends(path: str) -> Dict[str, List[float]]:
    """utt -> the end time (seconds) of each word (``word_times``: ``<utt> <word>
    <start> <end> [<word> <start> <end> ...]``)."""
    out = {}
    for utt, fields in read_table(path).items():
        if len(fields) % 3:
            raise ValueError(f"{path}: {utt}: expected <word> <start> <end> triples")
        out[utt] = [float(end) for end in fields[2::3]]
    return out


def matches(ref: Sequence[str], hyp: Sequence[str]) -> List[Tuple[int, int]]:
    """(ref index, hyp index) of the equal words a minimum-cost alignment pairs
    (Levenshtein; ties: match or substitution first, then deletion)."""
    n, m = len(ref), len(hyp)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(
                d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]),
                d[i - 1][j] + 1,
                d[i][j - 1] + 1,
            )
    pairs = []
    i, j = n, m
    while i > 0 and j > 0:
        diff = ref[i - 1] != hyp[j - 1]
        if d[i][j] == d[i - 1][j - 1] + diff:
            if not diff:
                pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif d[i][j] == d[i - 1][j] + 1:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def summary(values: List[float]) -> Dict[str, float]:
    if not values:
        return {"mean": None, "median": None, "p90": None}
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
    }


def delays(ref_text, ends, hyps, emitted, decided):
    """(emission delays, decision delays) of the matched words."""
    out_e, out_d = [], []
    for utt, hyp in hyps.items():
        if utt not in ref_text or utt not in ends:
            continue
        ref = ref_text[utt]
        e_times = [float(t) for t in emitted.get(utt, [])]
        d_times = [float(t) for t in decided.get(utt, [])]
        if len(e_times) != len(hyp) or len(d_times) != len(hyp):
            raise ValueError(f"{utt}: {len(hyp)} words, emission times do not match")
        for r, h in matches(ref, hyp):
            out_e.append(e_times[h] - ends[utt][r])
            out_d.append(d_times[h] - ends[utt][r])
    return out_e, out_d


def main(ref_path: str, times_path: str, decode_dir: str) -> int:
    best = os.path.join(decode_dir, "1best_recog")
    hyps = read_table(os.path.join(best, "text"))
    emitted = read_table(os.path.join(best, "emission"))
    decided = read_table(os.path.join(best, "decided"))
    e, d = delays(read_table(ref_path), word_ends(times_path), hyps, emitted, decided)
    result = {"matched_words": len(e), "emission": summary(e), "decided": summary(d)}
    out = os.path.join(decode_dir, "emission_delay.json")
    with open(out + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(out + ".tmp", out)
    mean = result["emission"]["mean"]
    print(
        f"[delay] {decode_dir}: {len(e)} words, mean emission delay "
        + ("-" if mean is None else f"{mean:.3f} s")
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
