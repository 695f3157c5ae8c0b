"""Report section "Batched beam search": the batched beam searches (each pruning
rule decoded, batch 32) against batched greedy search and the one-at-a-time beam
search of each model, end to end on the first test set (the goals of the batched
beam search)."""

from report.common import fmt_pct
from report.throughput import batched_tag

#: beam b32 decode time / greedy b32 decode time, without an LM
GREEDY_RATIO_GOAL = 1.5
#: one-at-a-time beam decode time / beam b32 decode time
ONE_AT_A_TIME_GOAL = 5.0
#: |WER batched beam - WER one-at-a-time beam|, absolute
WER_GOAL = 0.1
#: each model's one-at-a-time beam search (the reference) and batched greedy search
REFERENCE = {"standard": "beam", "multiblank": "mb_beam", "tdt": "tdt_beam"}
GREEDY = {"standard": "mb_greedy", "multiblank": "mb_greedy", "tdt": "tdt_greedy"}
#: each model's beam search config, per pruning rule
RULES = {
    "frame": {"standard": "mb_beam", "multiblank": "mb_beam", "tdt": "tdt_beam"},
    "step": {
        "standard": "mb_beam_step",
        "multiblank": "mb_beam_step",
        "tdt": "tdt_beam_step",
    },
    "label": {
        "standard": "mb_beam_label",
        "multiblank": "mb_beam_label",
        "tdt": "tdt_beam_label",
    },
}


def _seconds(entry):
    st = entry[1] if entry else None
    return None if not st or not st.get("decode_seconds") else st["decode_seconds"]


def _wer(entry):
    sc = entry[0] if entry else None
    return None if not sc else float(sc["wer"])


def _verdict(items, ok):
    if not items:
        return "not measured"
    good = [x for x in items if ok(x[2])]
    return (
        f"{'yes' if len(good) == len(items) else '**no**'} ({len(good)} of "
        f"{len(items)}: " + ", ".join(f"{m} {t} {v:.2f}" for m, t, v in items) + ")"
    )


def section(res, jobs, throughput_rows, test_set):
    """Markdown lines of the section ([] without batched beam decodings).

    Args:
        res: the Decoding section's {(model, tag, set): (score, stats)}.
        jobs: its (model, tag).
        throughput_rows: the Throughput section's rows ((model, search, batch,
            entry), score, stats): the batched greedy searches.
    """
    greedy = {
        (m, search): (sc, st)
        for (m, search, bs, entry), sc, st in throughput_rows
        if entry == "plugin" and bs != "1"
    }
    rows = []
    for m, tag in jobs:
        sb = batched_tag(tag)
        if sb is None or not sb[0].startswith(("mb_beam", "tdt_beam")):
            continue
        rows.append(
            (
                m,
                tag,
                sb[0],
                res.get((m, tag, test_set)),
                res.get((m, REFERENCE.get(m), test_set)),
                greedy.get((m, GREEDY.get(m))),
            )
        )
    if not rows:
        return []
    L = [f"## Batched beam search (`{test_set}`, end to end)", ""]
    L += [
        "Decode time of the decoding loop (data loading, features, encoder, search, "
        "writing; model loading excluded), one torch thread. `mb_beam` / `tdt_beam`: "
        "the frame-synchronous rule (`beam_sync: frame`: the one-at-a-time search's "
        "hypotheses at any batch size); `*_label`: label-synchronous, every label "
        "sequence scored with all its alignments (`beam_sync: label`); `*_step`: "
        "pruned per step (`beam_sync: step`). Reference: each model's "
        "one-at-a-time beam search of the Decoding section (ESPnet's `beam` on the "
        "standard model); greedy: the Throughput section's batched greedy search of "
        "the model.",
        "",
        "| model | search | WER | WER of the reference | decode time | vs batched "
        "greedy | reference time / this | search time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    goals = {"greedy": [], "one": [], "wer": []}
    seconds = {}
    for m, tag, search, beam, ref, g in rows:
        secs, w = _seconds(beam), _wer(beam)
        ref_s, ref_w, g_s = _seconds(ref), _wer(ref), _seconds(g)
        over_g = secs / g_s if secs and g_s else None
        one = ref_s / secs if secs and ref_s else None
        srch = beam[1].get("search_seconds") if beam and beam[1] else None
        seconds[m, search] = secs
        L.append(
            f"| {m} | {tag} | {fmt_pct(w)} | {fmt_pct(ref_w)} | "
            + (f"{secs:.2f} s" if secs else "-")
            + f" | {f'{over_g:.2f}x' if over_g else '-'}"
            + f" | {f'{one:.2f}x' if one else '-'}"
            + f" | {f'{srch:.2f} s' if srch is not None else '-'} |"
        )
        if over_g:
            goals["greedy"].append((m, tag, over_g))
        if one:
            goals["one"].append((m, tag, one))
        if w is not None and ref_w is not None:
            goals["wer"].append((m, tag, w - ref_w))
    L += [
        "",
        f"- batched beam at most {GREEDY_RATIO_GOAL}x the batched greedy decode time: "
        + _verdict(goals["greedy"], lambda v: v <= GREEDY_RATIO_GOAL),
        f"- batched beam at least {ONE_AT_A_TIME_GOAL}x faster than the one-at-a-time "
        "beam search: " + _verdict(goals["one"], lambda v: v >= ONE_AT_A_TIME_GOAL),
        f"- WER of batched beam - WER of the reference within {WER_GOAL} absolute "
        "(the standard model's reference is ESPnet's beam search, another algorithm): "
        + _verdict(goals["wer"], lambda v: abs(v) <= WER_GOAL),
        f"- WER of batched beam at most {WER_GOAL} above the reference's (lower is "
        "allowed): " + _verdict(goals["wer"], lambda v: v <= WER_GOAL),
    ]
    for rule, names in RULES.items():
        std = seconds.get(("standard", names["standard"]))
        for m in ("multiblank", "tdt"):
            mine = seconds.get((m, names[m]))
            if std and mine:
                L.append(
                    f"- {m} {names[m]} faster than standard {names['standard']} "
                    f"(batched, {rule} rule): {'yes' if mine < std else '**no**'} "
                    f"({mine:.2f} s vs {std:.2f} s)"
                )
    L.append("")
    return L
