#!/usr/bin/env python3
"""Word and character error rates of a decoding (Kaldi-style `utt words...` files).

Writes OUT_DIR/score.json (wer, cer, ser, substitutions/deletions/insertions, counts)
and OUT_DIR/score.txt (summary + every utterance with errors). An utterance missing
from the hypotheses counts as all deletions. CER is computed on the characters of the
word strings with spaces kept (ESPnet's convention of scoring `<space>` as a token).

Usage: score.py REF_TEXT HYP_TEXT OUT_DIR
"""

import json
import os
import sys


def read(path):
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split(maxsplit=1)
            if parts:
                out[parts[0]] = parts[1].split() if len(parts) > 1 else []
    return out


def align(ref, hyp):
    """(substitutions, deletions, insertions) of a minimum edit-distance alignment."""
    # d[j] = (cost, sub, del, ins) for ref[:i] vs hyp[:j]
    prev = [(j, 0, 0, j) for j in range(len(hyp) + 1)]
    for i in range(1, len(ref) + 1):
        cur = [(i, 0, i, 0)]
        for j in range(1, len(hyp) + 1):
            c, s, d, n = prev[j - 1]
            if ref[i - 1] == hyp[j - 1]:
                best = (c, s, d, n)
            else:
                best = (c + 1, s + 1, d, n)
            c, s, d, n = prev[j]
            if c + 1 < best[0]:
                best = (c + 1, s, d + 1, n)
            c, s, d, n = cur[j - 1]
            if c + 1 < best[0]:
                best = (c + 1, s, d, n + 1)
            cur.append(best)
        prev = cur
    return prev[-1][1:]


def score(refs, hyps):
    tot = dict(sub=0, dele=0, ins=0, n_ref=0, c_err=0, c_ref=0, n_sent_err=0)
    bad = []
    for utt, ref in refs.items():
        hyp = hyps.get(utt, [])
        s, d, n = align(ref, hyp)
        tot["sub"] += s
        tot["dele"] += d
        tot["ins"] += n
        tot["n_ref"] += len(ref)
        rc, hc = list(" ".join(ref)), list(" ".join(hyp))
        tot["c_err"] += sum(align(rc, hc))
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
            f"{res['insertions']} ins, {res['deletions']} del, "
            f"{res['substitutions']} sub ]  CER {res['cer']:.2f}%  "
            f"SER {res['ser']:.2f}% ({res['num_utterances']} utterances)\n\n"
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
