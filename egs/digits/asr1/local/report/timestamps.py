"""Report section "Word timestamps": the plug-in's searches' word times on `test_real`
(1best_recog/ctm) against the known word boundaries of its concatenated recordings
(`local/score_times.py`'s times.json)."""

import os

from report.common import load_json


def section(exp, jobs, inference_model, test_set):
    """Markdown lines of the section ([] when no decoding has a times.json)."""
    rows = []
    for m, tag in jobs:
        d = os.path.join(exp, f"asr_{m}", f"decode_{tag}_{inference_model}", test_set)
        t = load_json(os.path.join(d, "times.json"))
        if t is not None:
            rows.append((m, tag, t))
    if not rows:
        return []

    def ms(x):
        return "-" if x is None else f"{1000 * x:.0f}"

    L = [f"## Word timestamps (`{test_set}`)", ""]
    L += [
        f"`{test_set}` concatenates recordings of single words with known pauses, so "
        "every word's start and end are known (`local/make_real_digits.py`). Each "
        "plug-in search writes its 1-best's words with the frame of their first "
        "token (`--write_ctm true`: `1best_recog/ctm`, encoder frames x the encoder "
        "frame shift); over the words that match the reference on a minimum-cost "
        "alignment: |word start error| (hypothesis start - reference start) and the "
        "emission delay (the token's time - the reference word's end), in ms.",
        "",
        "| model | search | words matched / reference | |start error| median | "
        "p90 | emission delay median | p90 |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, tag, t in rows:
        L.append(
            f"| {m} | {tag} | {t['matched_words']} / {t['reference_words']} | "
            f"{ms(t['start_error_median'])} | {ms(t['start_error_p90'])} | "
            f"{ms(t['delay_median'])} | {ms(t['delay_p90'])} |"
        )
    L += [
        "",
        "Transducers trained without an alignment emit a word's token anywhere "
        "around the word (FastEmit pulls emissions earlier; not trained here). "
        "`test_real` is out of domain for these TTS-trained models, so few words "
        "match in places.",
        "",
    ]
    return L
