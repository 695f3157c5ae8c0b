#!/usr/bin/env python3
"""Choose an LM weight on a dev set: the candidate with the lowest WER, weight 0 (no
LM: the LM-free run's WER) among the candidates, ties to the smaller weight, so that an
LM that does not lower the dev WER is not used. Writes OUT (JSON): {"chosen": weight,
"dev_wer": {weight: WER}, "no_lm_wer": WER}; the report reads it.

Usage: choose_lm_weight.py --no_lm NO_LM_SCORE_JSON OUT W=SCORE_JSON [W=SCORE_JSON ...]
"""

import argparse
import json
import os


def wer(path):
    with open(path) as f:
        return float(json.load(f)["wer"])


def choose(candidates):
    """The weight of the lowest WER, the smaller weight on a tie.

    Args:
        candidates: {weight (str): WER}.
    """
    return min(candidates, key=lambda w: (candidates[w], float(w)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--no_lm", required=True, help="score.json of the LM-free run")
    p.add_argument("out")
    p.add_argument("weights", nargs="+", help="WEIGHT=score.json")
    a = p.parse_args()
    dev = {}
    for item in a.weights:
        w, sep, path = item.partition("=")
        if not sep:
            p.error(f"expected WEIGHT=score.json, got {item!r}")
        dev[w] = wer(path)
    no_lm = wer(a.no_lm)
    chosen = choose({"0": no_lm, **dev})
    result = {"chosen": chosen, "dev_wer": dev, "no_lm_wer": no_lm}
    with open(a.out + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(a.out + ".tmp", a.out)
    print(
        f"[lm weight] {a.out}: {chosen} (dev WER {dev.get(chosen, no_lm):.2f}%"
        f", without LM {no_lm:.2f}%)"
    )


if __name__ == "__main__":
    main()
