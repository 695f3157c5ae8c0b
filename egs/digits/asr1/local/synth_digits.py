#!/usr/bin/env python3
"""Synthesise connected-digit utterances with Debian TTS engines (8 kHz, 16 bit).

Engines: espeak-ng (English accents x voice variants, speed, pitch), flite (built-in
voices) and festival (diphone / HTS voices). Every utterance is then perturbed with sox
(tempo, speed, band limit, gain, leading/trailing padding) and written at 8 kHz.

The speakers (engine + voice + variant) of the training set and of the held-out sets
(dev, test) are disjoint: see SPEAKERS below.

Output: <out_dir>/wav/<utt>.wav and <out_dir>/manifest.tsv (utt, spk, path, text).
The caller writes to a temporary directory and renames it on success.

The digit strings are uniformly random (1-7 words), except with ``--texts FILE``
(``key words...`` lines, e.g. local/make_accounts.py's account numbers): each
utterance then says one of those strings, drawn at random. dev_known / test_known use
the voices of dev / test.

Usage: synth_digits.py --set train --num 8000 --seed 1 --nj 2 OUT_DIR
       synth_digits.py --set test_known --texts accounts.txt --num 400 --seed 6 OUT
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool

WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "oh",
]

ESPEAK_TRAIN_ACCENTS = [
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-us-nyc",
]
# espeak-ng voice variants used for training; m4, m7, f4, klatt2 are held out for
# dev/test; novelty variants (whisper, robosoft*, Demonic, ...) are not used
ESPEAK_TRAIN_VARIANTS = (
    ["", "m1", "m2", "m3", "m5", "m6", "m8", "f1", "f2", "f3", "f5"]
    + ["klatt", "klatt3", "klatt4", "klatt5", "klatt6"]
    + "Alex Alicia Andrea Andy Annie Denis Diogo Gene Gene2 Henrique Hugo Jacky Lee "
    "Marco Mario Michael Mike Nguyen adam anika announcer antonio aunty belinda "
    "benjamin boris caleb david ed edward edward2 grandma grandpa gustave iven iven2 "
    "iven3 iven4 john kaukovalta linda marcelo max michel miguel norbert pablo paul "
    "pedro quincy rob robert sandro shelby steph steph2 steph3 travis victor "
    "zac".split()
)

# (engine, voice, share of the set).  espeak voices are "accent+variant".
SPEAKERS = {
    "train": [
        *[
            ("espeak", f"{a}+{v}" if v else a, 0.55 / (7 * len(ESPEAK_TRAIN_VARIANTS)))
            for a in ESPEAK_TRAIN_ACCENTS
            for v in ESPEAK_TRAIN_VARIANTS
        ],
        ("flite", "kal", 0.06),
        ("flite", "kal16", 0.06),
        ("flite", "awb", 0.065),
        ("flite", "slt", 0.065),
        ("festival", "kal_diphone", 0.10),
        ("festival", "cmu_us_slt_arctic_hts", 0.10),
    ],
    # held-out voices: Caribbean accent with unseen variants, flite rms, festival ked
    "dev": [
        ("espeak", "en-029+m4", 0.25),
        ("espeak", "en-029+f4", 0.25),
        ("flite", "rms", 0.25),
        ("festival", "ked_diphone", 0.25),
    ],
    "test": [
        ("espeak", "en-029+m7", 0.17),
        ("espeak", "en-029+klatt2", 0.17),
        ("espeak", "en-029", 0.16),
        ("flite", "rms", 0.25),
        ("festival", "ked_diphone", 0.25),
    ],
}
# the known-list sets: the held-out voices of dev and test
SPEAKERS["dev_known"] = SPEAKERS["dev"]
SPEAKERS["test_known"] = SPEAKERS["test"]


def spk_id(engine, voice):
    return f"{engine}-{voice.replace('+', '-').replace('_', '-')}"


def make_jobs(set_name, num, seed, texts=None):
    """The utterances to synthesise; ``texts``: word lists to draw from (None:
    uniformly random strings of 1-7 words)."""
    rng = random.Random(seed)
    speakers = SPEAKERS[set_name]
    weights = [w for _, _, w in speakers]
    jobs = []
    for i in range(num):
        engine, voice, _ = rng.choices(speakers, weights)[0]
        if texts:
            words = list(rng.choice(texts))
        else:
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 7))]
        # TTS input: occasional commas give pauses between words
        tts = words[0]
        for w in words[1:]:
            tts += (", " if rng.random() < 0.15 else " ") + w
        spk = spk_id(engine, voice)
        job = dict(
            utt=f"{spk}_{set_name}{i:06d}",
            spk=spk,
            engine=engine,
            voice=voice,
            text=" ".join(words),
            tts=tts,
            # engine-side prosody
            rate=rng.randint(125, 215),  # espeak words per minute
            pitch=rng.randint(25, 75),  # espeak pitch 0-99
            stretch=round(rng.uniform(0.8, 1.25), 3),  # flite/festival duration
            f0=rng.randint(90, 180),  # flite mean f0
            # sox perturbation
            tempo=round(rng.uniform(0.85, 1.2), 3),
            speed=round(rng.uniform(0.88, 1.12), 3),
            pad=(round(rng.uniform(0.05, 0.3), 3), round(rng.uniform(0.05, 0.3), 3)),
            gain=round(rng.uniform(-14, -2), 1),
            band=rng.random() < 0.4,
            hp=rng.randint(100, 300),
            lp=rng.randint(3000, 3800),
        )
        jobs.append(job)
    return jobs


def sox_effects(job):
    # back to 8 kHz before the band filters: after `speed` on an 8 kHz voice the
    # Nyquist frequency can be below the low-pass cut-off
    eff = ["speed", str(job["speed"]), "tempo", "-s", str(job["tempo"]), "rate", "8000"]
    if job["band"]:
        eff += ["highpass", str(job["hp"]), "lowpass", str(job["lp"])]
    eff += [
        "gain",
        "-n",
        str(job["gain"]),
        "pad",
        str(job["pad"][0]),
        str(job["pad"][1]),
    ]
    return eff


def to_8k(src, dst, job):
    cmd = ["sox", "-V1", "-R", src, "-r", "8000", "-c", "1", "-b", "16", dst]
    cmd += sox_effects(job)
    subprocess.run(cmd, check=True)


def synth_chunk(args):
    jobs, wav_dir = args
    tmp = tempfile.mkdtemp(prefix="synth_")
    out = []
    try:
        fest = [j for j in jobs if j["engine"] == "festival"]
        if fest:
            scm = os.path.join(tmp, "batch.scm")
            with open(scm, "w") as f:
                for j in fest:
                    text = j["tts"].replace('"', "")
                    raw = os.path.join(tmp, j["utt"] + ".raw.wav")
                    f.write(f"(voice_{j['voice']})\n")
                    f.write(f"(Parameter.set 'Duration_Stretch {j['stretch']})\n")
                    f.write(
                        f'(utt.save.wave (utt.synth (Utterance Text "{text}")) '
                        f'"{raw}" \'riff)\n'
                    )
            subprocess.run(
                ["festival", "-b", scm],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for j in jobs:
            raw = os.path.join(tmp, j["utt"] + ".raw.wav")
            if j["engine"] == "espeak":
                subprocess.run(
                    [
                        "espeak-ng",
                        "-v",
                        j["voice"],
                        "-s",
                        str(j["rate"]),
                        "-p",
                        str(j["pitch"]),
                        "-w",
                        raw,
                        j["tts"],
                    ],
                    check=True,
                    stderr=subprocess.DEVNULL,
                )
            elif j["engine"] == "flite":
                subprocess.run(
                    [
                        "flite",
                        "-voice",
                        j["voice"],
                        "--setf",
                        f"duration_stretch={j['stretch']}",
                        "--setf",
                        f"int_f0_target_mean={j['f0']}",
                        "-t",
                        j["tts"],
                        "-o",
                        raw,
                    ],
                    check=True,
                )
            if not os.path.exists(raw) or os.path.getsize(raw) < 1000:
                raise RuntimeError(f"{j['engine']} produced no audio for {j['utt']}")
            dst = os.path.join(wav_dir, j["utt"] + ".wav")
            to_8k(raw, dst, j)
            os.remove(raw)
            out.append((j["utt"], j["spk"], dst, j["text"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", choices=sorted(SPEAKERS), required=True)
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nj", type=int, default=2)
    p.add_argument("--chunk", type=int, default=100)
    p.add_argument("--texts", help="'key words...' lines to draw the strings from")
    p.add_argument("out_dir")
    a = p.parse_args()

    t0 = time.time()
    wav_dir = os.path.abspath(os.path.join(a.out_dir, "wav"))
    os.makedirs(wav_dir, exist_ok=True)
    texts = None
    if a.texts:
        with open(a.texts, encoding="utf-8") as f:
            texts = [line.split()[1:] for line in f if len(line.split()) > 1]
        bad = sorted({w for t in texts for w in t} - set(WORDS))
        if not texts or bad:
            sys.exit(f"{a.texts}: no strings, or words outside {WORDS}: {bad}")
    jobs = make_jobs(a.set, a.num, a.seed, texts)
    chunks = [(jobs[i : i + a.chunk], wav_dir) for i in range(0, len(jobs), a.chunk)]
    rows = []
    with Pool(a.nj) as pool:
        for k, res in enumerate(pool.imap_unordered(synth_chunk, chunks), 1):
            rows.extend(res)
            if k % 10 == 0 or k == len(chunks):
                print(
                    f"[synth {a.set}] {len(rows)}/{len(jobs)} utterances "
                    f"({time.time() - t0:.0f} s)",
                    flush=True,
                )
    rows.sort()
    with open(os.path.join(a.out_dir, "manifest.tsv"), "w") as f:
        for r in rows:
            f.write("\t".join(r) + "\n")
    with open(os.path.join(a.out_dir, "synthesis_seconds"), "w") as f:
        f.write(f"{time.time() - t0:.1f}\n")
    n_spk = len({r[1] for r in rows})
    print(
        f"[synth {a.set}] done: {len(rows)} utterances, {n_spk} speakers, "
        f"{time.time() - t0:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
