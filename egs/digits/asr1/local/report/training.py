"""Report section "Training": ESPnet's train.log per model, and the loss plot."""

import os
import re

from report.common import fmt_time

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


def _read_number(exp, model, name):
    path = os.path.join(exp, f"asr_{model}", name)
    return float(open(path).read()) if os.path.exists(path) else None


def train_seconds(exp, model):
    return _read_number(exp, model, "train_seconds")


def train_procs(exp, model):
    """DDP processes the model was trained with (run.sh --train_procs; 1 if unknown)."""
    return int(_read_number(exp, model, "train_procs") or 1)


def section(exp, models, train_jobs):
    """Markdown lines of the section, and the validation-loss curves per model."""
    L = ["## Training", ""]
    L.append(
        "| model | parameters | epochs | updates | best valid loss (epoch) "
        "| final valid loss | training time |"
    )
    L.append("|---|---|---|---|---|---|---|")
    curves = {}
    for m in models:
        epochs, params = parse_train_log(os.path.join(exp, f"asr_{m}", "train.log"))
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
            + f" | {fmt_time(train_seconds(exp, m))} |"
        )
    L.append("")
    procs = sorted({train_procs(exp, m) for m in models})
    each = "one torch thread each"
    if procs != [1]:
        counts = " or ".join(str(n) for n in procs)
        L.append(
            f"Each model was trained with {counts} DDP processes on this machine "
            "(`--train_procs`; gloo, CPU workers started by the plug-in)."
        )
        L.append("")
        each = "one torch thread per process"
    if train_jobs > 1:
        L.append(
            f"The models were trained side by side, at most {train_jobs} at a time, "
            f"{each} (wall-clock training times of each, sharing the machine)."
        )
        L.append("")
    L.append(
        "The losses are not directly comparable: the multi-blank loss includes "
        "the big-blank paths, the TDT loss the duration log-probabilities (and "
        "omega's plain RNN-T batches in training), both the sigma logit "
        "under-normalisation. (ESPnet's "
        "in-training `wer_transducer` in train.log is not a word error rate with "
        "word tokens: it joins the tokens without spaces, so it counts sentences.) "
        "Plot: `valid_loss.png`; ESPnet's own curves: `exp/asr_<model>/images/`."
    )
    L.append("")
    return L, curves


def plot(curves, out_png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (xs, ys) in curves.items():
        if xs:
            ax.plot(xs, ys, marker="o", label=name)
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
