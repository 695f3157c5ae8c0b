"""Report section "Decoding": WER, insertions, speed per model and search."""

import os

from report.common import fmt_time, load_json


def load_results(exp, jobs, test_sets, inference_model):
    """{(model, search, set): (score.json, decoding_stats.json)} (None if absent)."""
    res = {}
    for m, search in jobs:
        for s in test_sets:
            d = os.path.join(exp, f"asr_{m}", f"decode_{search}_{inference_model}", s)
            res[(m, search, s)] = (
                load_json(os.path.join(d, "score.json")),
                load_json(os.path.join(d, "decoding_stats.json")),
            )
    return res


def section(res, jobs, test_sets, train_secs):
    """Markdown lines of the section."""
    L = ["## Decoding", ""]
    head = "| model | search | " + " | ".join(f"WER {s}" for s in test_sets)
    head += (
        f" | decode time ({test_sets[0]}) | RTF | search time"
        " | frames skipped | blanks over > 1 frame | training time | "
    )
    head += " | ".join(f"insertions (after last word) {s}" for s in test_sets) + " |"
    L.append(head)
    L.append("|" + "---|" * (head.count("|") - 1))
    for m, search in jobs:
        row = f"| {m} | {search} |"
        for s in test_sets:
            sc = res[(m, search, s)][0]
            row += f" {sc['wer']:.2f}% |" if sc else " - |"
        st = res[(m, search, test_sets[0])][1]
        if st:
            tf = st.get("total_frames") or 0
            sk = st.get("frames_skipped", st.get("frames_skipped_by_big_blanks")) or 0
            secs = st.get("search_seconds")
            secs = f"{secs:.1f} s" if secs is not None else "-"
            row += (
                f" {st['decode_seconds']:.1f} s | {st['rtf']:.4f} | {secs} | "
                f"{sk} / {tf} ({100 * sk / max(tf, 1):.1f}%) | "
                f"{st.get('big_blank_emissions', 0)} |"
            )
        else:
            row += " - | - | - | - | - |"
        row += f" {fmt_time(train_secs.get(m))} |"
        for s in test_sets:
            sc = res[(m, search, s)][0]
            end = sc.get("end_insertions") if sc else None
            row += f" {sc['insertions']} ({end}) |" if end is not None else " - |"
        L.append(row)
    L.append("")
    L.append(
        "The searches decode one utterance at a time (`--batch_size 1`), those whose "
        "name ends in `_b32` 32 at a time (the batched beam searches: `mb_beam`, "
        "`tdt_beam` the frame-synchronous rule, `*_label` label-synchronous, "
        "`*_step` pruned per step), one after the other with one torch thread; "
        "decode time and RTF are the "
        "inference tool's (`decoding_stats.json`: encoder + search, without model "
        "loading); search time is the transducer search alone, the part big blanks "
        "and durations shorten. Frames skipped: encoder frames the 1-best paths "
        "never evaluated the joint network on (d - 1 for each big blank, and for a "
        "TDT each blank or "
        "label, covering d > 1 frames). "
        "Insertions: all inserted words, and in brackets those a minimum-cost "
        "alignment puts after the last reference word (`local/score.py`). "
        "`test_real` is real speech, out of domain for a TTS-trained model: reported, "
        "not a goal."
    )
    L.append("")
    return L
