#!/usr/bin/env python3
"""Write a Kaldi-style data directory (wav.scp, text, utt2spk, spk2utt) from a manifest.

The manifest (from synth_digits.py / make_real_digits.py) has tab-separated lines
`utt  spk  wav_path  text`. Utterance ids start with the speaker id, so sorting by
utterance also sorts by speaker, as Kaldi and ESPnet expect. The directory is written
to DIR.tmp and renamed to DIR once complete and validated.

Usage: data_prep.py MANIFEST DIR
"""

import os
import shutil
import sys
from collections import defaultdict


def main(manifest, out_dir):
    rows = []
    with open(manifest, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                sys.exit(f"{manifest}:{n}: expected 4 tab-separated fields")
            utt, spk, path, text = parts
            if not utt.startswith(spk) or " " in utt or not text.strip():
                sys.exit(f"{manifest}:{n}: bad entry {parts!r}")
            if not os.path.isfile(path):
                sys.exit(f"{manifest}:{n}: missing audio {path}")
            rows.append((utt, spk, os.path.abspath(path), " ".join(text.split())))
    rows.sort()
    if len({r[0] for r in rows}) != len(rows):
        sys.exit(f"{manifest}: duplicate utterance ids")
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    spk2utt = defaultdict(list)
    with (
        open(os.path.join(tmp, "wav.scp"), "w") as scp,
        open(os.path.join(tmp, "text"), "w") as txt,
        open(os.path.join(tmp, "utt2spk"), "w") as u2s,
    ):
        for utt, spk, path, text in rows:
            scp.write(f"{utt} {path}\n")
            txt.write(f"{utt} {text}\n")
            u2s.write(f"{utt} {spk}\n")
            spk2utt[spk].append(utt)
    with open(os.path.join(tmp, "spk2utt"), "w") as f:
        for spk in sorted(spk2utt):
            f.write(f"{spk} {' '.join(spk2utt[spk])}\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(tmp, out_dir)
    print(f"[data] {out_dir}: {len(rows)} utterances, {len(spk2utt)} speakers")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
