#!/usr/bin/env python3
"""Word and character error rates of a decoding (Kaldi-style `utt words...` files).

Writes OUT_DIR/score.json (wer, cer, ser, substitutions/deletions/insertions, end
insertions, counts) and OUT_DIR/score.txt (summary + every utterance with errors). An
utterance missing from the hypotheses counts as all deletions. CER is computed on the
characters of the word strings with spaces kept (ESPnet's convention of scoring
`<space>` as a token).

Edit distances come from the `editdistance` package (as in ESPnet's error
calculator). The split into substitutions, deletions and insertions follows one
minimum-cost alignment, traced back from the end with edit distances of prefixes
(ties: match or substitution first, then deletion, then insertion). End insertions are
the hypothesis words that a minimum-cost alignment can place after the last reference
word: the largest k such that dropping the last k words costs exactly k fewer edits.

Usage: score.py REF_TEXT HYP_TEXT OUT_DIR
"""

import json
import os
import sys
from typing import Dict, List, Sequence, Tuple

import editdistance


def read(path: str) -> Dict[str, List[str]]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split(maxsplit=1)
            if parts:
                out[parts[0]] = parts[1].split() if len(parts) > 1 else []
    return out


def distance(ref: Sequence, hyp: Sequence) -> int:
    return editdistance.eval(ref, hyp)


def align(ref: Sequence, hyp: Sequence) -> Tuple[int, int, int]:
    """(substitutions, deletions, insertions) of a minimum-cost alignment."""
    sub = dele = ins = 0
    i, j = len(ref), len(hyp)
    cost = distance(ref, hyp)
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            diff = int(ref[i - 1] != hyp[j - 1])
            before = distance(ref[: i - 1], hyp[: j - 1])
            if before + diff == cost:
                sub += diff
                i, j, cost = i - 1, j - 1, before
                continue
        if i > 0:
            before = distance(ref[: i - 1], hyp[:j])
            if before + 1 == cost:
                dele += 1
                i, cost = i - 1, before
                continue
        ins += 1
        j, cost = j - 1, cost - 1
    return sub, dele, ins


def end_insertions(ref: Sequence, hyp: Sequence) -> int:
    """Hypothesis words a minimum-cost alignment can put after the last reference
    word (the largest k with distance(ref, hyp[:-k]) == distance(ref, hyp) - k)."""
    total = distance(ref, hyp)
    k = 0
    while k < len(hyp) and distance(ref, hyp[: len(hyp) - k - 1]) == total - k - 1:
        k += 1
    return k


def score(refs: Dict[str, List[str]], hyps: Dict[str, List[str]]):
    tot = dict(sub=0, dele=0, ins=0, end=0, n_ref=0, c_err=0, c_ref=0, n_sent_err=0)
    bad = []
    for utt, ref in refs.items():
        hyp = hyps.get(utt, [])
        s, d, n = align(ref, hyp)
        tot["sub"] += s
        tot["dele"] += d
        tot["ins"] += n
        tot["end"] += end_insertions(ref, hyp)
        tot["n_ref"] += len(ref)
        rc, hc = " ".join(ref), " ".join(hyp)
        tot["c_err"] += distance(rc, hc)
        tot["c_ref"] += len(rc)
        if s + d + n:
            tot["n_sent_err"] += 1
            bad.append((utt, " ".join(ref), " ".join(hyp), s + d + n))
    n_err = tot["sub"] + tot["dele"] + tot["ins"]
    res = dict(
        wer=100.0 * n_err / max(tot["n_ref"], 1),
        cer=100.0 * tot["c_err"] / max(tot["c_ref"], 1),
        ser=100.0 * tot["n_sent_err"] / max(len(refs), 1),
        num_utterances=len(refs),
        num_words=tot["n_ref"],
        word_errors=n_err,
        substitutions=tot["sub"],
        deletions=tot["dele"],
        insertions=tot["ins"],
        end_insertions=tot["end"],
        missing_hypotheses=sum(1 for u in refs if u not in hyps),
    )
    return res, bad


def main(ref_path, hyp_path, out_dir):
    res, bad = score(read(ref_path), read(hyp_path))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "score.json.tmp"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(out_dir, "score.txt"), "w") as f:
        f.write(
            f"WER {res['wer']:.2f}% [ {res['word_errors']} / {res['num_words']}, "
            f"{res['insertions']} ins ({res['end_insertions']} after the last word), "
            f"{res['deletions']} del, {res['substitutions']} sub ]  "
            f"CER {res['cer']:.2f}%  SER {res['ser']:.2f}% "
            f"({res['num_utterances']} utterances)\n\n"
        )
        for utt, ref, hyp, e in bad:
            f.write(f"{utt}\tREF: {ref}\n{' ' * len(utt)}\tHYP: {hyp}\t({e} errors)\n")
    os.replace(
        os.path.join(out_dir, "score.json.tmp"), os.path.join(out_dir, "score.json")
    )
    print(f"[score] {out_dir}: WER {res['wer']:.2f}%  CER {res['cer']:.2f}%")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
