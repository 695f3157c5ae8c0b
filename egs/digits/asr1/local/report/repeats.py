"""Report section "Repeated digits": WER on the test utterances whose reference has
two adjacent identical words ("five five"), the case the TDT paper found hardest for a
standard RNN-T (every word is a label at its own frame; a repeated word must be
emitted twice, with nothing between the two labels to tell them apart)."""

import os

import score  # local/score.py (make_report.py puts local/ on sys.path)
from report.common import fmt_pct


def has_repeat(words):
    """True when two adjacent words are identical."""
    return any(a == b for a, b in zip(words, words[1:]))


def subset_wer(refs, hyps, utts):
    """(WER in %, reference words) over ``utts``; a missing hypothesis is empty."""
    errors = words = 0
    for u in utts:
        errors += score.distance(refs[u], hyps.get(u, []))
        words += len(refs[u])
    return (100.0 * errors / words if words else None), words


def load(exp, data, jobs, test_set, inference_model):
    """{(model, search): (WER on repeats, WER on the others)}, the number of
    utterances with a repeat, and of all."""
    refs = score.read(os.path.join(data, test_set, "text"))
    rep = sorted(u for u, w in refs.items() if has_repeat(w))
    rest = sorted(u for u, w in refs.items() if not has_repeat(w))
    out = {}
    for m, search in jobs:
        path = os.path.join(
            exp,
            f"asr_{m}",
            f"decode_{search}_{inference_model}",
            test_set,
            "1best_recog",
            "text",
        )
        if not os.path.exists(path):
            continue
        hyps = score.read(path)
        out[(m, search)] = (subset_wer(refs, hyps, rep), subset_wer(refs, hyps, rest))
    return out, len(rep), len(refs)


def section(exp, data, jobs, test_set, inference_model):
    """Markdown lines of the section."""
    res, n_rep, n_all = load(exp, data, jobs, test_set, inference_model)
    L = ["## Repeated digits", ""]
    if not res:
        return L + ["- not available (decodings missing)", ""]

    first = next(iter(res.values()))
    L.append(
        f"`{test_set}`: {n_rep} of {n_all} utterances have two adjacent identical "
        f"words ({first[0][1]} reference words); WER on them and on the others:"
    )
    L.append("")
    L.append("| model | search | WER, repeated digits | WER, other utterances |")
    L.append("|---|---|---|---|")
    for (m, search), ((w_rep, _), (w_rest, _)) in res.items():
        L.append(f"| {m} | {search} | {fmt_pct(w_rep)} | {fmt_pct(w_rest)} |")
    L.append("")
    return L
