"""Report section "Data": sizes of the data sets and how they were made."""

import os

import soundfile as sf
from report.common import fmt_time


def data_summary(data, sets):
    """[(set, utterances, speakers, words, seconds)] of the sets that exist."""
    rows = []
    for s in sets:
        scp = os.path.join(data, s, "wav.scp")
        if not os.path.exists(scp):
            continue
        n, secs = 0, 0.0
        with open(scp) as f:
            for line in f:
                utt, path = line.split(maxsplit=1)
                secs += sf.info(path.strip()).duration
                n += 1
        with open(os.path.join(data, s, "utt2spk")) as f:
            spk = {line.split()[1] for line in f if line.strip()}
        with open(os.path.join(data, s, "text")) as f:
            words = sum(len(line.split()) - 1 for line in f)
        rows.append((s, n, len(spk), words, secs))
    return rows


def _count(path):
    if not os.path.exists(path):
        return "-"
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def espeak_voices(data):
    path = os.path.join(data, "train", "spk2utt")
    if not os.path.exists(path):
        return "-"
    with open(path) as f:
        return sum(1 for line in f if line.startswith("espeak-"))


def section(data, wavdir, test_sets):
    """Markdown lines of the section."""
    L = ["## Data", ""]
    L.append("| set | utterances | speakers | words | hours | generation time |")
    L.append("|---|---|---|---|---|---|")
    sets = ["train", "dev"] + test_sets + ["dev_known", "test_known"]
    for s, n, nspk, words, secs in data_summary(data, sets):
        gen = os.path.join(wavdir, s, "synthesis_seconds")
        gen = fmt_time(open(gen).read()) if os.path.exists(gen) else "-"
        L.append(f"| {s} | {n} | {nspk} | {words} | {secs / 3600:.2f} | {gen} |")
    L.append("")
    L.append(
        "Generation: TTS + sox in parallel processes (`--nj`, default 2); the times "
        "depend on the machine's load."
    )
    L.append(
        f"\ntrain: espeak-ng ({espeak_voices(data)} accent+variant voices), "
        "flite (kal, kal16, awb, slt), festival (kal_diphone, "
        "cmu_us_slt_arctic_hts); dev/test: held-out voices "
        "(espeak-ng en-029 with unseen variants, flite rms, festival ked_diphone). "
        "test_real: isolated-digit recordings (asterisk Allison, saytime male speaker) "
        "concatenated into strings. dev_known / test_known: the voices of dev / test "
        "saying strings drawn from a list of "
        f"{_count(os.path.join(data, 'accounts', 'text'))} account numbers of 5-7 "
        "digits (`local/make_accounts.py`), the text of the `known` LM; the strings of "
        "the other synthetic sets are uniformly random."
    )
    L.append("")
    return L
