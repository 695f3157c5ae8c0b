"""Report section "Throughput": end-to-end decoding speed of the first test set,
batched plug-in decoding against ESPnet's stock batch-1 decoding."""

import os
import re

from report.common import load_json

#: batch-32 multi-blank decoding vs ESPnet's stock batch-1 decoding of the standard
#: model, utterances per second
THROUGHPUT_GOAL = 2.0


def job_dir(exp, job, inference_model, test_set):
    """Output directory of a ``model:search:batch:entry`` job (as run.sh writes it)."""
    m, search, bs, entry = job
    return os.path.join(
        exp,
        f"asr_{m}",
        f"throughput_{entry}_{search}_b{bs}_{inference_model}",
        test_set,
    )


def load(exp, jobs, inference_model, test_set):
    """[(job, score.json, decoding_stats.json)] (None where absent)."""
    out = []
    for job in jobs:
        d = job_dir(exp, job, inference_model, test_set)
        out.append(
            (
                job,
                load_json(os.path.join(d, "score.json")),
                load_json(os.path.join(d, "decoding_stats.json")),
            )
        )
    return out


def _entry_name(entry):
    return {
        "stock": "ESPnet `espnet2.bin.asr_inference`",
        "plugin": "plug-in `espnet_multiblank.bin.asr_inference`",
    }.get(entry, entry)


def batched_tag(tag):
    """(search, batch) of a decoding's tag ``search_b<batch>``, or None."""
    m = re.fullmatch(r"(.+)_b(\d+)", tag)
    return (m.group(1), m.group(2)) if m else None


def section(rows, test_set, decode_res=None, jobs=()):
    """Markdown lines of the section.

    Args:
        rows: output of :func:`load`; the first row is the yardstick.
        decode_res: the Decoding section's results {(model, search, set): (score,
            stats)}, to compare each batched row's WER with the same search at
            batch 1.
        jobs: the Decoding section's (model, tag): its batched decodings (tag
            ``search_b<batch>``) are rows too.
    """
    L = [f"## Throughput (end to end, `{test_set}`)", ""]
    rows = list(rows)
    for m, tag in jobs:
        sb = batched_tag(tag)
        if sb is not None and decode_res and (m, tag, test_set) in decode_res:
            sc, st = decode_res[m, tag, test_set]
            rows.append(((m, sb[0], sb[1], "plugin"), sc, st))
    done = [(j, sc, st) for j, sc, st in rows if sc and st and st["decode_seconds"]]
    if not done:
        return L + ["- not available (throughput decodings missing)", ""]
    L += [
        "Utterances per second of the decoding loop (data loading, features, encoder, "
        "search, writing; process start and model loading excluded), one process, "
        "same torch threads as the Decoding section. Ratios are to the first row.",
        "",
        "| model | search | batch | entry point | WER | WER at batch 1 (Decoding) "
        "| decode time | utterances / s | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = None
    speed = {}
    for (m, search, bs, entry), sc, st in done:
        ups = st["num_utterances"] / st["decode_seconds"]
        base = base or ups
        speed[(m, search, bs, entry)] = (ups / base, sc["wer"])
        b1 = (decode_res or {}).get((m, search, test_set))
        b1_wer = f"{b1[0]['wer']:.2f}%" if b1 and b1[0] else "-"
        L.append(
            f"| {m} | {search} | {bs} | {_entry_name(entry)} | {sc['wer']:.2f}% | "
            f"{b1_wer} | {st['decode_seconds']:.2f} s | {ups:.1f} | "
            f"{ups / base:.2f}x |"
        )
    L.append("")
    ref = done[0]
    mb = [(j, v) for j, v in speed.items() if j[0] == "multiblank" and j[2] != "1"]
    if ref[0][0] == "standard" and ref[0][3] == "stock" and mb:
        job, (ratio, wer) = mb[0]
        ok = "yes" if ratio >= THROUGHPUT_GOAL else "**no**"
        L.append(
            f"- multi-blank {job[1]} at batch {job[2]} vs ESPnet's stock batch-1 "
            f"decoding of the standard model: **{ratio:.2f}x** the throughput "
            f"(goal >= {THROUGHPUT_GOAL}x: {ok}); WER {wer:.2f}% vs "
            f"{ref[1]['wer']:.2f}%"
        )
        L.append("")
    return L
