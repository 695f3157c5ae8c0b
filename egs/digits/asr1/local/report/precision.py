"""Report section "Half precision": the plug-in's searches with ``--dtype float16`` /
``bfloat16`` against float32 on the first test set (run.sh stage 11's dtype jobs)."""

import os

from report.common import fmt_pct, load_json


def _hyps(path):
    """{utt: token ids} of a decoding's 1best_recog/token_int ({} when absent)."""
    path = os.path.join(path, "1best_recog", "token_int")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts:
                out[parts[0]] = parts[1:]
    return out


def compare(exp, model, search, dtype, inference_model, test_set):
    """(WER float32, WER dtype, utterances with another hypothesis, utterances,
    failed utterances, the half-precision decoding's batch size) or None when either
    decoding is missing."""
    base = os.path.join(exp, f"asr_{model}", f"decode_{search}_{inference_model}")
    half = os.path.join(
        exp, f"asr_{model}", f"decode_{search}_{dtype}_{inference_model}"
    )
    ref, hyp = _hyps(os.path.join(base, test_set)), _hyps(os.path.join(half, test_set))
    if not ref or not (hyp or os.path.isdir(os.path.join(half, test_set))):
        return None
    differ = sum(1 for utt, tokens in ref.items() if hyp.get(utt) != tokens)
    stats = load_json(os.path.join(half, test_set, "decoding_stats.json")) or {}
    scores = [load_json(os.path.join(d, test_set, "score.json")) for d in (base, half)]
    wers = [None if s is None else float(s["wer"]) for s in scores]
    return (
        wers[0],
        wers[1],
        differ,
        len(ref),
        stats.get("num_failed"),
        stats.get("batch_size"),
    )


def section(exp, jobs, dtypes, inference_model, test_set):
    """Markdown lines ([] when no half-precision decoding exists)."""
    rows = []
    for m, search in jobs:
        for dtype in dtypes:
            r = compare(exp, m, search, dtype, inference_model, test_set)
            if r is not None:
                rows.append((m, search, dtype) + r)
    if not rows:
        return []
    L = ["## Half precision", ""]
    L.append(
        f"`--dtype` of the plug-in's searches on `{test_set}` against float32 one "
        "utterance at a time (the model cast, its frontend and normalisation in "
        "float32; log-softmax and scores in float32). Batch: of the half-precision "
        "decoding (float32's batched decoding gives the hypotheses of batch 1):"
    )
    L += [
        "",
        "| model | search | dtype | batch | WER float32 | WER | utterances with "
        "another hypothesis | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, search, dtype, w32, w, differ, n, failed, batch in rows:
        L.append(
            f"| {m} | {search} | {dtype} | {batch if batch is not None else '-'} | "
            f"{fmt_pct(w32)} | {fmt_pct(w)} | {differ} / {n} | "
            f"{failed if failed is not None else '-'} |"
        )
    same = all(r[5] == 0 for r in rows)
    L += [
        "",
        "- same hypotheses as float32 in every search and dtype: "
        f"**{'yes' if same else 'no'}**"
        + ("" if same else " (the differences are in the table)"),
        "",
    ]
    return L
