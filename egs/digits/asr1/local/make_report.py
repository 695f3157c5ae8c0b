#!/usr/bin/env python3
"""Write EXP/RESULTS.md and EXP/valid_loss.png for the digits recipe.

Reads: data sizes (DATA/<set>/wav.scp, text), the synthesis time (WAVDIR), per model
EXP/asr_<model>/{train.log, train_seconds}, and per decoding
EXP/asr_<model>/decode_<search>_<inference_model>/<set>/
{score.json, decoding_stats.json}. The validation losses per epoch come from ESPnet's
"Nepoch results: ... [valid] loss=..." lines in train.log.
"""

import argparse
import json
import os
import platform
import re
import sys
import time

import soundfile as sf

EPOCH_RE = re.compile(r"(\d+)epoch results: (.*)$")
PARAMS_RE = re.compile(r"Total Number of model parameters: ([\d.]+ ?[KMG]?)")


def parse_fields(part):
    out = {}
    for kv in part.split(", "):
        if "=" in kv:
            k, v = kv.split("=", 1)
            try:
                out[k.strip()] = float(v)
            except ValueError:
                out[k.strip()] = v
    return out


def parse_train_log(path):
    """{epoch: {"train": {...}, "valid": {...}}}, number of parameters."""
    epochs, params = {}, None
    if not os.path.exists(path):
        return epochs, params
    with open(path, errors="replace") as f:
        for line in f:
            m = PARAMS_RE.search(line)
            if m and params is None:
                params = m.group(1).strip()
            m = EPOCH_RE.search(line)
            if not m:
                continue
            ep = int(m.group(1))
            parts = re.split(r"(?:^|, )\[(\w+)\] ", m.group(2))
            # parts = ["", "train", "k=v, ...", "valid", "k=v, ..."]
            d = {}
            for i in range(1, len(parts) - 1, 2):
                d[parts[i]] = parse_fields(parts[i + 1])
            epochs[ep] = d
    return epochs, params


def data_summary(data, sets):
    rows = []
    for s in sets:
        scp = os.path.join(data, s, "wav.scp")
        if not os.path.exists(scp):
            continue
        n, secs, spk = 0, 0.0, set()
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


def espeak_voices(data):
    path = os.path.join(data, "train", "spk2utt")
    if not os.path.exists(path):
        return "-"
    with open(path) as f:
        return sum(1 for line in f if line.startswith("espeak-"))


def fmt_time(s):
    if s is None:
        return "-"
    s = float(s)
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.1f} s"


def load_json(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def run_span(done_dir):
    """Seconds from the first stage's start to the last stage's finish (stages 1-9).

    Each ``exp/.done/<N>`` holds ``<finish time ISO>, <seconds> s``; None when a marker
    is missing or unreadable (stages run in separate invocations still give a span,
    which then includes the time between them).
    """
    import datetime

    starts, ends = [], []
    for k in range(1, 10):
        try:
            with open(os.path.join(done_dir, str(k))) as f:
                stamp, secs = f.read().strip().split(", ")
            end = datetime.datetime.fromisoformat(stamp).timestamp()
            secs = float(secs.split()[0])
        except (OSError, ValueError):
            return None
        starts.append(end - secs)
        ends.append(end)
    return max(ends) - min(starts)


def plot(curves, out_png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (xs, ys) in curves.items():
        if xs:
            ax.plot(xs, ys, marker="o", label=name)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation loss (transducer + 0.3 CTC, per utterance)")
    ax.set_title("Digits (8 kHz): validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png + ".tmp.png", dpi=100)
    plt.close(fig)
    os.replace(out_png + ".tmp.png", out_png)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exp", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--wavdir", required=True)
    p.add_argument("--inference_model", default="valid.loss.ave")
    p.add_argument("--decode_jobs", required=True, help="'model:search ...'")
    p.add_argument("--test_sets", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--train_jobs", type=int, default=1)
    a = p.parse_args()

    test_sets = a.test_sets.split()
    jobs = [j.split(":") for j in a.decode_jobs.split()]
    models = []
    for m, _ in jobs:
        if m not in models:
            models.append(m)

    L = []
    L.append("# Results: connected digits (8 kHz), standard vs multi-blank RNN-T")
    L.append("")
    L.append(
        f"Generated by `egs/digits/asr1/run.sh{' --smoke' if a.smoke else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()}, {os.cpu_count()} CPU cores, CPU only."
        + (
            " **Smoke run: tiny data and model, numbers are meaningless.**"
            if a.smoke
            else ""
        )
    )
    L.append("")

    # ---- data
    L.append("## Data")
    L.append("")
    L.append("| set | utterances | speakers | words | hours | generation time |")
    L.append("|---|---|---|---|---|---|")
    for s, n, nspk, words, secs in data_summary(a.data, ["train", "dev"] + test_sets):
        gen = os.path.join(a.wavdir, s, "synthesis_seconds")
        gen = fmt_time(open(gen).read()) if os.path.exists(gen) else "-"
        L.append(f"| {s} | {n} | {nspk} | {words} | {secs / 3600:.2f} | {gen} |")
    L.append("")
    L.append(
        "Generation: TTS + sox in parallel processes (`--nj`, default 2); the times "
        "depend on the machine's load."
    )
    L.append(
        f"\ntrain: espeak-ng ({espeak_voices(a.data)} accent+variant voices), "
        "flite (kal, kal16, awb, slt), festival (kal_diphone, "
        "cmu_us_slt_arctic_hts); dev/test: held-out voices "
        "(espeak-ng en-029 with unseen variants, flite rms, festival ked_diphone). "
        "test_real: isolated-digit recordings (asterisk Allison, saytime male speaker) "
        "concatenated into strings."
    )
    L.append("")

    # ---- training
    L.append("## Training")
    L.append("")
    L.append(
        "| model | parameters | epochs | updates | best valid loss (epoch) "
        "| final valid loss | training time |"
    )
    L.append("|---|---|---|---|---|---|---|")
    curves, train_secs = {}, {}
    for m in models:
        d = os.path.join(a.exp, f"asr_{m}")
        epochs, params = parse_train_log(os.path.join(d, "train.log"))
        ts = os.path.join(d, "train_seconds")
        train_secs[m] = float(open(ts).read()) if os.path.exists(ts) else None
        xs = [e for e in sorted(epochs) if "loss" in epochs[e].get("valid", {})]
        ys = [epochs[e]["valid"]["loss"] for e in xs]
        curves[m] = (xs, ys)
        best = min(zip(ys, xs)) if xs else None
        count = epochs[xs[-1]].get("train", {}).get("total_count") if xs else None
        L.append(
            f"| {m} | {params or '-'} | {len(xs)} | "
            + (f"{int(count)}" if isinstance(count, float) else "-")
            + " | "
            + (f"{best[0]:.3f} ({best[1]})" if best else "-")
            + " | "
            + (f"{ys[-1]:.3f}" if ys else "-")
            + f" | {fmt_time(train_secs[m])} |"
        )
    L.append("")
    if a.train_jobs > 1:
        L.append(
            "The two models were trained at the same time, one torch thread each "
            "(wall-clock training times of each, sharing the machine)."
        )
        L.append("")
    L.append(
        "The two losses are not directly comparable: the multi-blank loss includes "
        "the big-blank paths and the sigma logit under-normalisation. (ESPnet's "
        "in-training `wer_transducer` in train.log is not a word error rate with "
        "word tokens: it joins the tokens without spaces, so it counts sentences.) "
        "Plot: `valid_loss.png`; ESPnet's own curves: `exp/asr_<model>/images/`."
    )
    L.append("")

    # ---- decoding
    L.append("## Decoding")
    L.append("")
    head = "| model | search | " + " | ".join(f"WER {s}" for s in test_sets)
    head += (
        f" | decode time ({test_sets[0]}) | RTF | search time"
        " | frames skipped by big blanks | big-blank emissions | training time |"
    )
    L.append(head)
    L.append("|" + "---|" * (head.count("|") - 1))
    res = {}
    for m, search in jobs:
        row = f"| {m} | {search} |"
        for s in test_sets:
            dd = os.path.join(
                a.exp, f"asr_{m}", f"decode_{search}_{a.inference_model}", s
            )
            sc = load_json(os.path.join(dd, "score.json"))
            st = load_json(os.path.join(dd, "decoding_stats.json"))
            res[(m, search, s)] = (sc, st)
            row += f" {sc['wer']:.2f}% |" if sc else " - |"
        sc, st = res[(m, search, test_sets[0])]
        if st:
            tf = st.get("total_frames") or 0
            sk = st.get("frames_skipped_by_big_blanks") or 0
            search = st.get("search_seconds")
            search = f"{search:.1f} s" if search is not None else "-"
            row += (
                f" {st['decode_seconds']:.1f} s | {st['rtf']:.4f} | {search} | "
                f"{sk} / {tf} ({100 * sk / max(tf, 1):.1f}%) | "
                f"{st.get('big_blank_emissions', 0)} |"
            )
        else:
            row += " - | - | - | - | - |"
        row += f" {fmt_time(train_secs.get(m))} |"
        L.append(row)
    L.append("")
    L.append(
        "All searches decode one utterance at a time (`--batch_size 1`) in one process "
        "with one torch thread; decode time and RTF are the inference tool's "
        "(`decoding_stats.json`: encoder + search, without model loading); search "
        "time is the transducer search alone, the part big blanks shorten. "
        "`test_real` is real speech, out of domain for a TTS-trained model: reported, "
        "not a goal."
    )
    L.append("")

    # ---- goals
    t0 = test_sets[0]
    g = res.get(("standard", "greedy", t0))
    mb = res.get(("multiblank", "mb_greedy", t0))
    L.append("## Multi-blank vs standard (greedy, held-out voices)")
    L.append("")
    if g and mb and g[0] and mb[0] and g[1] and mb[1]:
        speed = g[1]["decode_seconds"] / max(mb[1]["decode_seconds"], 1e-9)
        dwer = mb[0]["wer"] - g[0]["wer"]
        ok = lambda c: "yes" if c else "**no**"  # noqa: E731
        L.append(
            f"- decoding speed-up, mb_greedy vs greedy: **{speed:.2f}x** "
            f"(goal >= 1.9x: {ok(speed >= 1.9)})"
        )
        L.append(
            f"- WER: standard {g[0]['wer']:.2f}%, multi-blank {mb[0]['wer']:.2f}% "
            f"(difference {dwer:+.2f} absolute; goal <= +1: {ok(dwer <= 1.0)}; "
            f"both < 15%: {ok(max(g[0]['wer'], mb[0]['wer']) < 15)})"
        )
        if g[1].get("search_seconds") and mb[1].get("search_seconds"):
            s_speed = g[1]["search_seconds"] / max(mb[1]["search_seconds"], 1e-9)
            L.append(
                f"- search alone (encoder excluded), mb_greedy vs greedy: "
                f"**{s_speed:.2f}x**"
            )
    else:
        L.append("- not available (decodings missing)")
    sg = res.get(("standard", "mb_greedy", t0))
    if sg and mb and sg[1] and mb[1] and sg[0]:
        speed2 = sg[1]["decode_seconds"] / max(mb[1]["decode_seconds"], 1e-9)
        line = (
            "- same greedy implementation (mb_greedy) on both models: "
            f"**{speed2:.2f}x** end to end"
        )
        if sg[1].get("search_seconds") and mb[1].get("search_seconds"):
            s2 = sg[1]["search_seconds"] / max(mb[1]["search_seconds"], 1e-9)
            line += f", **{s2:.2f}x** for the search alone"
        line += (
            f" (standard model with mb_greedy: WER {sg[0]['wer']:.2f}%, "
            f"{sg[1]['decode_seconds']:.1f} s): the gain of the big blanks alone"
        )
        L.append(line)
    if g and mb and g[1] and mb[1] and g[1].get("search_seconds"):
        n = max(g[1].get("num_utterances") or 1, 1)
        rest = [
            (st["decode_seconds"] - st["search_seconds"]) / n * 1e3
            for st in (g[1], mb[1])
        ]
        L.append(
            f"- per utterance, outside the search (data loading, feature extraction, "
            f"encoder, output): {rest[0]:.1f} ms (greedy run), {rest[1]:.1f} ms "
            f"(mb_greedy run); search: {g[1]['search_seconds'] / n * 1e3:.1f} ms "
            f"(greedy), {mb[1]['search_seconds'] / n * 1e3:.1f} ms (mb_greedy). Big "
            f"blanks shorten only the search, so the end-to-end speed-up is at most "
            f"(rest + greedy search) / rest."
        )
    L.append("")
    done = os.path.join(a.exp, ".done")
    if os.path.isdir(done):
        L.append("## Stage times")
        L.append("")
        L.append("| stage | finished, seconds |")
        L.append("|---|---|")
        stages = [k for k in os.listdir(done) if k.isdigit() and int(k) < 10]
        for k in sorted(stages, key=int):
            L.append(f"| {k} | {open(os.path.join(done, k)).read().strip()} |")
        L.append("")
        L.append("(the report stage itself is not listed.)")
        span = run_span(done)
        if span:
            L.append("")
            L.append(f"Stages 1-9, first start to last finish: {span / 60:.1f} min.")
        L.append("")

    plot(curves, os.path.join(a.exp, "valid_loss.png"))
    out = os.path.join(a.exp, "RESULTS.md")
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(L) + "\n")
    os.replace(out + ".tmp", out)
    print(f"[report] {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
