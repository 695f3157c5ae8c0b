#!/usr/bin/env python3
"""Build the real-speech test set from recorded isolated digits in Debian packages.

Sources (unpacked with `apt-get download` + `dpkg -x` by run.sh, never installed):
  asterisk-core-sounds-en-wav: <root>/usr/share/asterisk/sounds/en*/digits/{0..9,oh}.wav
      (female speaker "Allison", 8 kHz 16 bit); the words are checked against the
      transcripts of asterisk-core-sounds-en (core-sounds-en.txt.gz) when present.
  saytime: <root>/usr/share/saytime/{0..9,oh}.au
      (male speaker, headerless 8 kHz mu-law).

Each recording is trimmed of leading/trailing silence (sox), then digit strings of 1-7
words are concatenated with random 50-300 ms pauses and 0.1-0.4 s padding.

Output: <out_dir>/wav/<utt>.wav, <out_dir>/manifest.tsv (utt, spk, path, text) and
<out_dir>/word_times: the known boundaries of every word, one utterance per line,
``<utt> <word> <start> <end> [<word> <start> <end> ...]`` in seconds (the trimmed
recording's first and last sample; the scoring of word timestamps,
``local/score_times.py``, and the streaming emission delays,
``local/emission_delay.py``, read it).
"""

import argparse
import glob
import gzip
import os
import random
import re
import subprocess
import sys
import tempfile

import numpy as np
import soundfile as sf

NAMES = {
    str(i): w
    for i, w in enumerate("zero one two three four five six seven eight nine".split())
}
NAMES["oh"] = "oh"
FS = 8000


def trim(src, fmt_args, tmpdir):
    dst = os.path.join(tmpdir, "t.wav")
    subprocess.run(
        ["sox", "-V1", "-R", *fmt_args, src, "-r", "8000", "-c", "1", "-b", "16", dst]
        + ["silence", "1", "0.01", "1%", "reverse", "silence", "1", "0.01", "1%"]
        + ["reverse"],
        check=True,
    )
    x, fs = sf.read(dst, dtype="float32")
    assert fs == FS, (src, fs)
    return x


def asterisk_words(root):
    """word -> path for Allison's isolated digits, checked against the transcripts."""
    dirs = sorted(glob.glob(os.path.join(root, "usr/share/asterisk/sounds/en*/digits")))
    if not dirs:
        return {}
    transcripts = {}
    for txt in glob.glob(
        os.path.join(root, "usr/share/doc/asterisk-core-sounds-en/*.txt*")
    ):
        opener = gzip.open if txt.endswith(".gz") else open
        with opener(txt, "rt", errors="replace") as f:
            for line in f:
                m = re.match(r"^digits/(\w+):\s*(.*)$", line.strip())
                if m:
                    transcripts[m.group(1)] = m.group(2).strip().lower()
    out = {}
    for key, word in NAMES.items():
        path = os.path.join(dirs[0], key + ".wav")
        if not os.path.exists(path):
            continue
        if transcripts and transcripts.get(key, word).rstrip(".") != word:
            print(f"[real] skip digits/{key}: transcript {transcripts.get(key)!r}")
            continue
        out[word] = (path, [])
    return out


def saytime_words(root):
    out = {}
    for key, word in NAMES.items():
        path = os.path.join(root, "usr/share/saytime", key + ".au")
        if os.path.exists(path):
            out[word] = (path, ["-t", "ul", "-r", "8000", "-c", "1"])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--root", required=True, help="directory the .deb files were unpacked in"
    )
    p.add_argument("--num_per_speaker", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("out_dir")
    a = p.parse_args()

    rng = random.Random(a.seed)
    wav_dir = os.path.abspath(os.path.join(a.out_dir, "wav"))
    os.makedirs(wav_dir, exist_ok=True)
    speakers = {
        "real-asterisk-allison": asterisk_words(a.root),
        "real-saytime-male": saytime_words(a.root),
    }
    rows, times = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for spk, words in speakers.items():
            if len(words) < 10:
                print(
                    f"[real] {spk}: only {len(words)} digit recordings found, skipped"
                )
                continue
            audio = {w: trim(path, fmt, tmp) for w, (path, fmt) in words.items()}
            vocab = sorted(audio)
            for i in range(a.num_per_speaker):
                seq = [rng.choice(vocab) for _ in range(rng.randint(1, 7))]
                parts = [np.zeros(int(rng.uniform(0.1, 0.4) * FS), np.float32)]
                bounds = []  # (word, first sample, end sample) in the utterance
                for k, w in enumerate(seq):
                    if k:
                        parts.append(
                            np.zeros(int(rng.uniform(0.05, 0.3) * FS), np.float32)
                        )
                    start = sum(len(x) for x in parts)
                    parts.append(audio[w])
                    bounds.append((w, start, start + len(audio[w])))
                parts.append(np.zeros(int(rng.uniform(0.1, 0.4) * FS), np.float32))
                utt = f"{spk}_real{i:06d}"
                path = os.path.join(wav_dir, utt + ".wav")
                sf.write(path, np.concatenate(parts), FS, subtype="PCM_16")
                rows.append((utt, spk, path, " ".join(seq)))
                times[utt] = " ".join(
                    f"{w} {b / FS:.4f} {e / FS:.4f}" for w, b, e in bounds
                )
            print(
                f"[real] {spk}: {a.num_per_speaker} utterances from {len(vocab)} words"
            )
    if not rows:
        print("[real] no recordings found", file=sys.stderr)
        return 1
    rows.sort()
    with open(os.path.join(a.out_dir, "manifest.tsv"), "w") as f:
        for r in rows:
            f.write("\t".join(r) + "\n")
    with open(os.path.join(a.out_dir, "word_times"), "w") as f:
        for utt in sorted(times):
            f.write(f"{utt} {times[utt]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
