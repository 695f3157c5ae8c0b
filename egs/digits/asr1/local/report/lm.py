"""Report section "Language models": the two LMs, the weights chosen on dev, and WER
without and with them for every beam search (run.sh stages 10 and 12)."""

import os

from report.common import fmt_pct, fmt_time, load_json
from report.training import parse_train_log

#: LM name -> (its dev set, what it was trained on, the data dir of its text)
LMS = {
    "train": ("dev", "the training transcripts", "train"),
    "known": ("dev_known", "the account list", "accounts"),
}


def lm_tests(lm, test_sets):
    return list(test_sets) if lm == "train" else ["test_known"]


def decode_dir(exp, model, search, inference_model, lm=None, weight=None):
    name = f"decode_{search}_{inference_model}"
    if lm is not None:
        name = f"decode_{search}_lm_{lm}_w{weight}_{inference_model}"
    return os.path.join(exp, f"asr_{model}", name)


def wer_of(path):
    sc = load_json(os.path.join(path, "score.json"))
    return None if sc is None else float(sc["wer"])


def load(exp, lm_searches, inference_model, test_sets):
    """{(model, search, lm): {"choice": chooser JSON or None, "tests": {set: (WER
    without, WER with the LM at the chosen weight)}}}."""
    out = {}
    for m, search in lm_searches:
        for lm in LMS:
            choice = load_json(
                os.path.join(
                    exp, f"asr_{m}", f"lm_{lm}_weight_{search}_{inference_model}.json"
                )
            )
            tests = {}
            for s in lm_tests(lm, test_sets):
                plain = wer_of(
                    os.path.join(decode_dir(exp, m, search, inference_model), s)
                )
                fused = None
                if choice is not None:
                    d = decode_dir(
                        exp, m, search, inference_model, lm, choice["chosen"]
                    )
                    fused = wer_of(os.path.join(d, s))
                tests[s] = (plain, fused)
            out[m, search, lm] = {"choice": choice, "tests": tests}
    return out


def _delta(plain, fused):
    if plain is None or fused is None:
        return "-"
    return f"{fmt_pct(plain)} -> {fmt_pct(fused)} ({fused - plain:+.2f})"


def training_rows(exp, data):
    rows = []
    for lm, (_, what, text_dir) in LMS.items():
        epochs, _ = parse_train_log(os.path.join(exp, f"lm_{lm}", "train.log"))
        text = os.path.join(data, text_dir, "text")
        n = sum(1 for _ in open(text)) if os.path.exists(text) else None
        valid = [
            e["valid"]["loss"] for e in epochs.values() if "loss" in e.get("valid", {})
        ]
        secs = os.path.join(exp, f"lm_{lm}", "train_seconds")
        secs = float(open(secs).read()) if os.path.exists(secs) else None
        best = min(valid) if valid else None
        rows.append((lm, what, n, len(epochs), best, secs))
    return rows


def goals(res, lm_searches):
    """Markdown bullet lines: the two goals of the LM section."""
    known = [
        (m, res[m, s, "known"]["tests"].get("test_known", (None, None)))
        for m, s in lm_searches
    ]
    lowered = [m for m, (p, f) in known if p is not None and f is not None and f < p]
    have = [m for m, (p, f) in known if p is not None and f is not None]
    L = [
        "- known-list condition (`test_known`), the LM at the weight chosen on "
        f"`dev_known` lowers WER for every model kind: "
        f"**{'yes' if have and len(lowered) == len(have) else 'no'}** "
        f"({len(lowered)} of {len(have)}: "
        + ", ".join(f"{m} {_delta(p, f)}" for m, (p, f) in known)
        + ")"
    ]
    test = [
        (m, res[m, s, "train"]["tests"].get("test", (None, None)))
        for m, s in lm_searches
    ]
    deltas = [f - p for _, (p, f) in test if p is not None and f is not None]
    ok = bool(deltas) and max(deltas) <= 0.2
    L.append(
        "- `test` with the LM of the training transcripts at the weight chosen on "
        f"`dev`: no harm (at most +0.2 absolute): **{'yes' if ok else 'no'}** ("
        + ", ".join(f"{m} {_delta(p, f)}" for m, (p, f) in test)
        + ")"
    )
    return L


def section(exp, data, lm_searches, inference_model, test_sets):
    """Markdown lines of the section ([] when no LM was trained)."""
    if not os.path.isdir(os.path.join(exp, "lm_train")):
        return []
    res = load(exp, lm_searches, inference_model, test_sets)
    L = ["## Language models (shallow fusion)", ""]
    L.append(
        "Two word LMs (ESPnet's `espnet2.bin.lm_train`, `lm: seq_rnn`; "
        "`conf/train_lm.yaml`, `conf/train_lm_known.yaml`), fused into the batched "
        "beam search of every model (`--lm_searches`; by default the "
        "label-synchronous rule, `*_label_b32`: 32 utterances at a time, each label "
        "sequence scored with all its alignments): a label's score "
        "is its acoustic log-probability plus weight x its LM log-probability, blanks "
        "and durations leave the LM untouched, a complete hypothesis adds weight x "
        "log P(</s>). "
        "The weight of each LM is chosen per model on its dev set (lowest WER of the "
        "candidates and of weight 0, i.e. no LM; ties to the smaller weight, so an LM "
        "that does not lower the dev WER is not used) and then used on the test sets; "
        "at weight 0 the test sets are decoded with the LM given at weight 0, which "
        "must give the LM-free hypotheses."
    )
    L += [
        "",
        "| LM | trained on | sentences | epochs | best valid loss (perplexity) "
        "| training time |",
        "|---|---|---|---|---|---|",
    ]
    for lm, what, n, epochs, best, secs in training_rows(exp, data):
        ppl = f"{best:.3f} ({2.718281828 ** best:.2f})" if best is not None else "-"
        L.append(
            f"| {lm} | {what} | {n if n is not None else '-'} | {epochs} | {ppl} "
            f"| {fmt_time(secs)} |"
        )
    for lm, (dev, what, _) in LMS.items():
        tests = lm_tests(lm, test_sets)
        weights = []
        for m, s in lm_searches:
            ch = res[m, s, lm]["choice"]
            for w in (ch or {}).get("dev_wer", {}):
                if w not in weights:
                    weights.append(w)
        head = f"| model | search | {dev} WER without LM | " + " | ".join(
            f"{dev} WER, weight {w}" for w in weights
        )
        head += " | chosen weight | " + " | ".join(f"WER {s}" for s in tests) + " |"
        L += [
            "",
            f"LM `{lm}` ({what}):",
            "",
            head,
            "|" + "---|" * (head.count("|") - 1),
        ]
        for m, s in lm_searches:
            r = res[m, s, lm]
            ch = r["choice"] or {}
            row = f"| {m} | {s} | {fmt_pct(ch.get('no_lm_wer'))} |"
            for w in weights:
                row += f" {fmt_pct(ch.get('dev_wer', {}).get(w))} |"
            row += f" {ch.get('chosen', '-')} |"
            for t in tests:
                row += f" {_delta(*r['tests'][t])} |"
            L.append(row)
    L += ["", "WER without -> with the LM (difference, absolute)."]
    L += [""] + goals(res, lm_searches) + [""]
    L.append(
        "The strings of `train`, `dev`, `test` are uniformly random digits, so the LM "
        "of the training transcripts can learn little more than their lengths (its "
        "perplexity is close to the 11 words' 11): on `test` it can at best remove a "
        "few insertions and deletions. `dev_known` / `test_known` say numbers from a "
        "known list of account numbers (`local/make_accounts.py`; held-out voices), "
        "the text the `known` LM was trained on: there the LM has something to learn."
    )
    L.append("")
    return L


def _decode_seconds(path):
    st = load_json(os.path.join(path, "decoding_stats.json"))
    return None if st is None else st.get("decode_seconds")


def extra_section(exp, lm_searches, extra_jobs, inference_model, test_sets):
    """Markdown lines of the LM decodings at the weights the grids chose: the
    one-at-a-time reference of each model and the other batched searches ([] when
    there are none)."""
    if not extra_jobs or not os.path.isdir(os.path.join(exp, "lm_train")):
        return []
    grid = {}
    for m, tag in lm_searches:
        grid.setdefault(m, tag)
    first = test_sets[0]
    L = [
        "### LM fusion at the chosen weights: one at a time, and the other rules",
        "",
        "The weights chosen by the batched beam search of each model above, used "
        "by its one-at-a-time search (batch 1, the reference: `test_known` only) "
        "and by the batched searches of the other rules (`*_label`, `*_step`). "
        "Decode times of "
        "`test_known` with the LM.",
        "",
        "| model | search | WER `test_known`, known LM | grid search's | decode "
        f"time | grid search's | WER `{first}`, train LM | grid search's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, tag in extra_jobs:
        g = grid.get(m)
        if g is None:
            continue
        row = f"| {m} | {tag} |"
        for lm, s in (("known", "test_known"), ("train", first)):
            choice = load_json(
                os.path.join(
                    exp, f"asr_{m}", f"lm_{lm}_weight_{g}_{inference_model}.json"
                )
            )
            if choice is None:
                row += " - | - |" + (" - | - |" if lm == "known" else "")
                continue
            w = choice["chosen"]
            mine = os.path.join(decode_dir(exp, m, tag, inference_model, lm, w), s)
            theirs = os.path.join(decode_dir(exp, m, g, inference_model, lm, w), s)
            got = wer_of(mine)
            row += f" {fmt_pct(got)}{'' if got is None else f' (w {w})'} |"
            row += f" {fmt_pct(wer_of(theirs))} |"
            if lm == "known":
                a, b = _decode_seconds(mine), _decode_seconds(theirs)
                row += f" {'-' if a is None else f'{a:.1f} s'} |"
                row += f" {'-' if b is None else f'{b:.1f} s'} |"
        L.append(row)
    L.append("")
    return L
