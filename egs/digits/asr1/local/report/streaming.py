"""Report section "Streaming": WER at each chunk size, latency, emission delay and
speed of the streaming decodings (run.sh stage 13) against the same models' offline
decodings."""

import os

from report.common import fmt_pct, load_json


def _dir(exp, model, name, inference_model, test_set):
    return os.path.join(exp, f"asr_{model}", f"{name}_{inference_model}", test_set)


def chunk_dir(exp, model, search, chunk, inference_model, test_set):
    """Offline decoding at a chunk size (the chunk-masked encoder output)."""
    return _dir(exp, model, f"chunk_{search}_c{chunk}", inference_model, test_set)


def stream_dir(exp, model, search, chunk, streams, inference_model, test_set):
    return _dir(
        exp, model, f"stream_{search}_c{chunk}_b{streams}", inference_model, test_set
    )


def _texts(d):
    """{utt: text} of a decoding's 1best_recog/text ({} when absent)."""
    path = os.path.join(d, "1best_recog", "text")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 1)
            out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def _run(d):
    return {
        "dir": d,
        "score": load_json(os.path.join(d, "score.json")),
        "stats": load_json(os.path.join(d, "decoding_stats.json")),
        "delay": load_json(os.path.join(d, "emission_delay.json")),
        "text": _texts(d),
    }


def load(exp, jobs, chunks, batch, batch_chunk, inference_model, test_set):
    """{("chunk", model, chunk) | ("stream", model, chunk, streams, set): run}."""
    out = {}
    for model, search in jobs:
        for c in chunks:
            out[("chunk", model, c)] = _run(
                chunk_dir(exp, model, search, c, inference_model, test_set)
            )
            for s in (test_set, "test_real"):
                out[("stream", model, c, 1, s)] = _run(
                    stream_dir(exp, model, search, c, 1, inference_model, s)
                )
        out[("stream", model, batch_chunk, batch, test_set)] = _run(
            stream_dir(
                exp, model, search, batch_chunk, batch, inference_model, test_set
            )
        )
    return out


def _ms(seconds):
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def _delay(delay, kind):
    part = (delay or {}).get(kind) or {}
    if part.get("mean") is None:
        return "-"
    return f"{_ms(part['mean'])} / {_ms(part['median'])} / {_ms(part['p90'])} ms"


def _skipped(stats):
    total = stats.get("total_frames") or 0
    skipped = stats.get("frames_skipped") or 0
    return f"{100 * skipped / max(total, 1):.1f}%"


def same_hypotheses(streamed, reference):
    """'k / n': streamed utterances whose text equals the reference's."""
    keys = list(streamed)
    same = sum(streamed[k] == reference.get(k) for k in keys)
    return f"{same} / {len(keys)}"


def section(res, offline, jobs, chunks, batch, batch_chunk, test_set, utts=None):
    """Markdown lines; ``offline``: decoding.load_results's dict."""
    L = ["## Streaming", ""]
    if not any(r["stats"] or r["score"] for r in res.values()):
        return L + ["No streaming decodings (stage 13).", ""]
    L.append(
        f"| model | search | chunk | algorithmic latency | WER {test_set} full context "
        f"| WER {test_set} at the chunk | streamed: same hypotheses | RTF (1 stream) "
        "| search time | frames skipped | emission delay test_real (mean / median / "
        "p90) | decision delay |"
    )
    L.append("|" + "---|" * 12)
    goals = []
    for model, search in jobs:
        off = (offline.get((model, search, test_set)) or (None, None))[0]
        for c in chunks:
            masked = res[("chunk", model, c)]
            run = res[("stream", model, c, 1, test_set)]
            real = res[("stream", model, c, 1, "test_real")]
            stats = run["stats"] or {}
            latency = None
            if stats.get("chunk_seconds") is not None:
                latency = stats["chunk_seconds"] + (
                    stats.get("encoder_lookahead_seconds") or 0
                )
            wer = masked["score"]["wer"] if masked["score"] else None
            rtf = f"{stats['rtf']:.4f}" if stats.get("rtf") is not None else "-"
            search_time = stats.get("search_seconds")
            L.append(
                f"| {model} | {search} | {_ms(stats.get('chunk_seconds'))} ms "
                f"| {_ms(latency)} ms | {fmt_pct(off['wer'] if off else None)} "
                f"| {fmt_pct(wer)} | {same_hypotheses(run['text'], masked['text'])} "
                f"| {rtf} | "
                + ("-" if search_time is None else f"{search_time:.2f} s")
                + f" | {_skipped(stats) if stats else '-'} "
                f"| {_delay(real['delay'], 'emission')} "
                f"| {_delay(real['delay'], 'decided')} |"
            )
            if off and wer is not None:
                goals.append((model, c, stats.get("chunk_seconds"), wer - off["wer"]))
    L.append("")
    streamed = f"{utts} utterances" if utts else "a subset"
    L.append(
        "Each model's greedy search. WER at the chunk: all of the test set decoded "
        "offline with the chunk mask (batched): the hypotheses the streams give, "
        "since a stream's final hypothesis is the offline search's on the same "
        f"encoder output; {streamed} of each test set were streamed for real "
        "(pieces of `--stream_piece` samples, one stream at a time, one torch "
        "thread), and 'same hypotheses' counts those whose streamed hypothesis is "
        "the chunk-masked decoding's (the chunk-by-chunk encoder output differs "
        "from the masked one by float rounding). Algorithmic latency = chunk + the "
        "encoder's look-ahead (subsampling and half an STFT window). RTF, search "
        "time (the search's steps and provisional runs alone) and frames skipped: "
        "the streamed utterances of the test set. Emission delay: when a word "
        "appeared for good in the partial hypotheses minus when it ends in the "
        "recording (the streamed `test_real` utterances, known word boundaries, "
        "correctly recognised words); decision delay: when it was decided (it can "
        "no longer change). The streams run the one-utterance greedy loop, which "
        "takes a step inside the look-ahead where no utterance length can change "
        "it (`docs/streaming.md`). Search times are one run per case; "
        "`bench/stream_search.py` times the same streams in interleaved rounds."
    )
    L.append("")
    L += _goals(goals, res, jobs, chunks, test_set)
    L += _batched(res, jobs, batch, batch_chunk, test_set)
    return L


def _goals(goals, res, jobs, chunks, test_set):
    L = []
    for model, c, seconds, diff in goals:
        if seconds is not None and seconds > 0.64:
            continue
        ok = "yes" if diff <= 1.0 else "no"
        L.append(
            f"- {model}, chunk {c}: WER {diff:+.2f} absolute against full context "
            f"(goal <= +1.0 at chunks <= 640 ms: {ok})"
        )
    base = [m for m, _ in jobs if m == "standard"]
    for model, _ in jobs:
        if not base or model == "standard":
            continue
        for c in chunks:
            std = res[("stream", "standard", c, 1, test_set)]["stats"]
            own = res[("stream", model, c, 1, test_set)]["stats"]
            if std and own and own.get("search_seconds"):
                ratio = std["search_seconds"] / own["search_seconds"]
                ok = "yes" if ratio >= 1.8 else "no"
                L.append(
                    f"- {model} vs standard streaming search, chunk {c}: "
                    f"**{ratio:.2f}x** (goal >= 1.8x: {ok})"
                )
    return L + [""] if L else L


def _batched(res, jobs, batch, batch_chunk, test_set):
    rows = []
    for model, search in jobs:
        one = res.get(("stream", model, batch_chunk, 1, test_set))
        many = res.get(("stream", model, batch_chunk, batch, test_set))
        if not many or not many["stats"]:
            continue
        same = same_hypotheses(many["text"], one["text"]) if one else "-"
        speedup = "-"
        if one and one["stats"] and many["stats"]["rtf"]:
            speedup = f"{one['stats']['rtf'] / many['stats']['rtf']:.2f}x"
        rows.append(
            f"| {model} | {search} | {batch} | {many['stats']['rtf']:.4f} | {speedup} "
            f"| {many['stats'].get('search_seconds', 0):.2f} s | {same} |"
        )
    if not rows:
        return []
    return [
        f"{batch} streams at once (chunk {batch_chunk}; a stream that ends frees its "
        "row for the next utterance):",
        "",
        "| model | search | streams | RTF (all streams) | vs 1 stream | search time "
        "| same hypotheses as 1 stream |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "RTF (all streams): wall time / audio of all streams; a CPU serves about "
        "1 / RTF such streams in real time. On a CPU the greedy search runs each "
        "stream with the one-utterance loop, as for one stream (faster there than "
        "the label-looping batch of the streams: bench/RESULTS.md), and the encoder "
        "runs each stream's chunks on their own: the streams share the machine, "
        "not the work. (The label-looping batch, which a GPU runs, rounds the "
        "search's scores with the number of rows: a hypothesis can differ at a "
        "near tie.)",
        "",
    ]
