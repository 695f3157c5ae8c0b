#!/usr/bin/env python3
"""A list of "account numbers": the digit strings callers of a phone service say.

Writes OUT (Kaldi-style ``acc<NNN> words...`` lines): NUM strings of MIN_LEN to
MAX_LEN digits, each digit spoken as its word (0 as "zero" or "oh", chosen once per
digit of the list, as a caller would read the number). The dev_known / test_known sets
are synthesised from these strings, and the "known" LM is trained on this text: an LM
has something to learn there, unlike in the uniformly random strings of the other
sets.

Usage: make_accounts.py --num 100 --seed 4 OUT
"""

import argparse
import os
import random

from synth_digits import WORDS  # the recipe's words

DIGITS = WORDS[:10]  # zero .. nine ("oh", the last word, is the other way to say 0)


def accounts(num, seed, min_len, max_len):
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < num:
        digits = tuple(rng.randrange(10) for _ in range(rng.randint(min_len, max_len)))
        if digits in seen:
            continue
        seen.add(digits)
        words = [
            ("oh" if rng.random() < 0.5 else "zero") if d == 0 else DIGITS[d]
            for d in digits
        ]
        out.append(" ".join(words))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num", type=int, default=100)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--min_len", type=int, default=5)
    p.add_argument("--max_len", type=int, default=7)
    p.add_argument("out")
    a = p.parse_args()
    lines = [
        f"acc{i:04d} {t}"
        for i, t in enumerate(accounts(a.num, a.seed, a.min_len, a.max_len))
    ]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(a.out + ".tmp", a.out)
    print(f"[accounts] {a.out}: {len(lines)} account numbers")


if __name__ == "__main__":
    main()
