#!/usr/bin/env python3
"""Word-level token list for ESPnet:
`<blank>` first, `<unk>`, the words, `<sos/eos>` last.

ESPnet reads the list line by line (index = line number); index 0 must be `<blank>`
and the last entry `<sos/eos>`. For the multi-blank model ESPnet's ASRTask inserts
`<blank8>`, `<blank4>`, `<blank2>` before `<blank>` itself, so the same list serves both
models. Words are collected from the training text (11 here: zero..nine, oh).

Usage: make_token_list.py TRAIN_TEXT TOKENS_TXT
"""

import os
import sys


def main(text, out):
    words = set()
    with open(text, encoding="utf-8") as f:
        for line in f:
            words.update(line.split()[1:])
    tokens = ["<blank>", "<unk>", *sorted(words), "<sos/eos>"]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    os.replace(out + ".tmp", out)
    print(f"[tokens] {out}: {len(tokens)} tokens ({len(words)} words)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
