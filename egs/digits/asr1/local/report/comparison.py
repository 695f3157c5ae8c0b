"""Report sections "Multi-blank vs standard" and "TDT vs multi-blank and standard":
the recipe's goals on held-out voices."""

#: multi-blank greedy WER may exceed standard greedy WER by at most this (absolute)
WER_MARGIN = 0.5
#: end-to-end decoding speed-up goal, mb_greedy vs ESPnet's greedy
SPEED_GOAL = 1.9


def _ok(condition):
    return "yes" if condition else "**no**"


def section(res, test_set):
    """Markdown lines of the section."""
    L = ["## Multi-blank vs standard (greedy, held-out voices)", ""]
    g = res.get(("standard", "greedy", test_set))
    mb = res.get(("multiblank", "mb_greedy", test_set))
    if g and mb and g[0] and mb[0] and g[1] and mb[1]:
        speed = g[1]["decode_seconds"] / max(mb[1]["decode_seconds"], 1e-9)
        dwer = mb[0]["wer"] - g[0]["wer"]
        L.append(
            f"- decoding speed-up, mb_greedy vs greedy: **{speed:.2f}x** "
            f"(goal >= {SPEED_GOAL}x: {_ok(speed >= SPEED_GOAL)})"
        )
        L.append(
            f"- WER: standard {g[0]['wer']:.2f}%, multi-blank {mb[0]['wer']:.2f}% "
            f"(difference {dwer:+.2f} absolute; goal <= +{WER_MARGIN}: "
            f"{_ok(dwer <= WER_MARGIN)}; both < 15%: "
            f"{_ok(max(g[0]['wer'], mb[0]['wer']) < 15)})"
        )
        if "end_insertions" in g[0] and "end_insertions" in mb[0]:
            L.append(
                f"- insertions after the last reference word: standard "
                f"{g[0]['end_insertions']} of {g[0]['insertions']}, multi-blank "
                f"{mb[0]['end_insertions']} of {mb[0]['insertions']}"
            )
        if g[1].get("search_seconds") and mb[1].get("search_seconds"):
            s_speed = g[1]["search_seconds"] / max(mb[1]["search_seconds"], 1e-9)
            L.append(
                f"- search alone (encoder excluded), mb_greedy vs greedy: "
                f"**{s_speed:.2f}x**"
            )
    else:
        L.append("- not available (decodings missing)")
    sg = res.get(("standard", "mb_greedy", test_set))
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
    return L


def tdt_section(res, test_set):
    """Markdown lines of the TDT section (greedy searches, batch 1)."""
    L = ["## TDT vs multi-blank and standard (greedy, held-out voices)", ""]
    g = res.get(("standard", "greedy", test_set))
    mb = res.get(("multiblank", "mb_greedy", test_set))
    tdt = res.get(("tdt", "tdt_greedy", test_set))
    if not (tdt and tdt[0] and tdt[1]):
        return L + ["- not available (decodings missing)", ""]
    if g and g[0]:
        dwer = tdt[0]["wer"] - g[0]["wer"]
        L.append(
            f"- WER: standard {g[0]['wer']:.2f}%, TDT {tdt[0]['wer']:.2f}% (difference "
            f"{dwer:+.2f} absolute; goal <= +{WER_MARGIN}: {_ok(dwer <= WER_MARGIN)})"
        )
    if mb and mb[0]:
        L.append(f"- WER: multi-blank {mb[0]['wer']:.2f}%, TDT {tdt[0]['wer']:.2f}%")
    if mb and mb[1] and mb[1].get("search_seconds") and tdt[1].get("search_seconds"):
        ratio = mb[1]["search_seconds"] / max(tdt[1]["search_seconds"], 1e-9)
        L.append(
            f"- search alone, tdt_greedy vs mb_greedy: **{ratio:.2f}x** "
            f"({tdt[1]['search_seconds']:.2f} s vs {mb[1]['search_seconds']:.2f} s; "
            f"goal >= 1: {_ok(ratio >= 1)})"
        )
    if g and g[1] and g[1].get("search_seconds") and tdt[1].get("search_seconds"):
        ratio = g[1]["search_seconds"] / max(tdt[1]["search_seconds"], 1e-9)
        e2e = g[1]["decode_seconds"] / max(tdt[1]["decode_seconds"], 1e-9)
        L.append(
            f"- tdt_greedy vs ESPnet's greedy on the standard model: **{ratio:.2f}x** "
            f"for the search alone, {e2e:.2f}x end to end"
        )
    for name, r in (("multi-blank", mb), ("TDT", tdt)):
        if r and r[1] and r[1].get("total_frames"):
            st = r[1]
            skipped = st.get("frames_skipped", st.get("frames_skipped_by_big_blanks"))
            L.append(
                f"- {name}: {100 * (skipped or 0) / st['total_frames']:.1f}% of the "
                "encoder frames skipped by the 1-best paths"
            )
    L.append("")
    return L
