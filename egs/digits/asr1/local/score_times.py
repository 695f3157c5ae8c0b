#!/usr/bin/env python3
"""Word timestamps of a decoding against known word boundaries.

Reads the reference boundaries (``<utt> <word> <start> <end> [...]``, seconds:
``local/make_real_digits.py``'s word_times) and the decoding's CTM (``<utt> 1 <start>
<duration> <word> <confidence>``), aligns each utterance's hypothesis words to its
reference words (a minimum-cost edit alignment, as local/score.py) and, over the
words that match (the same word at an aligned position), measures

* the word start error: hypothesis start - reference start (a word's start is the
  frame its first token was emitted at);
* the emission delay: hypothesis start (the time the word's token was emitted) -
  reference end: negative when the model emits a word before it has ended.

Writes OUT_DIR/times.json: matched / reference / hypothesis words, and the median and
90th percentile of |start error| and of the delay (seconds), plus the mean delay.

Usage: score_times.py REF_WORD_TIMES CTM OUT_DIR
"""

import json
import os
import sys
from typing import Dict, List, Sequence, Tuple

import editdistance

Word = Tuple[str, float, float]  # word, start, end (seconds)


def read_reference(path: str) -> Dict[str, List[Word]]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            rest = parts[1:]
            if len(rest) % 3:
                sys.exit(f"{path}: expected <utt> (<word> <start> <end>)*: {line!r}")
            out[parts[0]] = [
                (rest[i], float(rest[i + 1]), float(rest[i + 2]))
                for i in range(0, len(rest), 3)
            ]
    return out


def read_ctm(path: str) -> Dict[str, List[Word]]:
    out: Dict[str, List[Word]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 5 or line.startswith(";;"):  # ";;": NIST CTM comments
                continue
            start, dur = float(parts[2]), float(parts[3])
            out.setdefault(parts[0], []).append((parts[4], start, start + dur))
    return out


def matches(ref: Sequence[Word], hyp: Sequence[Word]) -> List[Tuple[Word, Word]]:
    """Pairs of equal words on one minimum-cost alignment (traced back from the end
    with the edit distances of prefixes; match or substitution first)."""
    r, h = [w for w, _, _ in ref], [w for w, _, _ in hyp]
    pairs = []
    i, j = len(r), len(h)
    while i > 0 and j > 0:
        here = editdistance.eval(r[:i], h[:j])
        if here == editdistance.eval(r[: i - 1], h[: j - 1]) + (r[i - 1] != h[j - 1]):
            if r[i - 1] == h[j - 1]:
                pairs.append((ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif here == editdistance.eval(r[: i - 1], h[:j]) + 1:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def percentile(values: Sequence[float], q: float):
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def score(ref: Dict[str, List[Word]], hyp: Dict[str, List[Word]]) -> dict:
    start_errors, delays = [], []
    for utt, words in ref.items():
        for (_, r_start, r_end), (_, h_start, _) in matches(words, hyp.get(utt, [])):
            start_errors.append(abs(h_start - r_start))
            delays.append(h_start - r_end)
    return {
        "reference_words": sum(len(w) for w in ref.values()),
        "hypothesis_words": sum(len(w) for u, w in hyp.items() if u in ref),
        "matched_words": len(start_errors),
        "start_error_median": percentile(start_errors, 0.5),
        "start_error_p90": percentile(start_errors, 0.9),
        "delay_median": percentile(delays, 0.5),
        "delay_p90": percentile(delays, 0.9),
        "delay_mean": sum(delays) / len(delays) if delays else None,
    }


def main(ref_path: str, ctm_path: str, out_dir: str) -> int:
    result = score(read_reference(ref_path), read_ctm(ctm_path))
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "times.json")
    with open(out + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(out + ".tmp", out)

    def ms(x):
        return "-" if x is None else f"{1000 * x:.0f} ms"

    print(
        f"[times] {out}: {result['matched_words']} of {result['reference_words']} "
        f"words matched, |start error| median {ms(result['start_error_median'])}, "
        f"p90 {ms(result['start_error_p90'])}; emission delay median "
        f"{ms(result['delay_median'])}, p90 {ms(result['delay_p90'])}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
