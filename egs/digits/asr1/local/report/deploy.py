"""Report section "Deployment without torch": the models exported to ONNX and the
test set decoded by the torch-free runtime (run.sh stage 14), against the plug-in's
PyTorch decodings of stages 11 and 13 (same searches)."""

import os

from report.common import fmt_pct, load_json
from report.streaming import _texts

#: the plug-in's greedy search per model (stage 11's job names)
GREEDY = {"standard": "mb_greedy", "multiblank": "mb_greedy", "tdt": "tdt_greedy"}
#: the plug-in's label-synchronous beam search per model (stage 11, batch 32)
BEAM = {
    "standard": "mb_beam_label",
    "multiblank": "mb_beam_label",
    "tdt": "tdt_beam_label",
}


def runtime_dir(exp, model, tag, inference_model, test_set):
    return os.path.join(
        exp, f"asr_{model}", f"runtime_{tag}_{inference_model}", test_set
    )


def plugin_dirs(exp, model, tag, inference_model, test_set):
    """The plug-in's decodings of the same search: (the one whose hypotheses the
    runtime's must equal, the one whose real-time factor compares); None where there
    is none."""
    d = os.path.join(exp, f"asr_{model}")
    if tag.startswith("greedy_b"):
        same = speed = f"decode_{GREEDY[model]}_{inference_model}"
    elif tag.startswith("beam_b"):
        same = speed = f"decode_{BEAM[model]}_b32_{inference_model}"
    elif tag.startswith("stream_greedy_c"):
        chunk = tag.rsplit("_c", 1)[1]
        # the offline decoding at the chunk (the streams' hypotheses); the speed of
        # stage 13's streams, 16 at a time (of fewer utterances)
        same = f"chunk_{GREEDY[model]}_c{chunk}_{inference_model}"
        speed = f"stream_{GREEDY[model]}_c{chunk}_b16_{inference_model}"
    else:
        return None, None
    return os.path.join(d, same, test_set), os.path.join(d, speed, test_set)


def _run(d):
    if d is None:
        return {"score": None, "stats": None, "text": {}}
    return {
        "score": load_json(os.path.join(d, "score.json")),
        "stats": load_json(os.path.join(d, "decoding_stats.json")),
        "text": _texts(d),
    }


def _describe(tag):
    if tag.startswith("stream_"):
        search, chunk = tag[len("stream_") :].rsplit("_c", 1)
        return f"{search}, streams of {int(chunk) * 40} ms chunks, 16 at a time"
    search, batch = tag.rsplit("_b", 1)
    return f"{search}, batch {batch}" + (" (beam 4)" if search == "beam" else "")


def section(exp, models, tags, inference_model, test_set):
    """Markdown lines ([] when stage 14 did not run)."""
    rows = []
    for model in models:
        for tag in tags:
            rt = _run(runtime_dir(exp, model, tag, inference_model, test_set))
            if rt["stats"] is None:
                continue
            same, speed = plugin_dirs(exp, model, tag, inference_model, test_set)
            rows.append((model, tag, rt, _run(same), _run(speed)))
    if not rows:
        return []
    L = ["## Deployment without torch (ONNX export, the runtime)", ""]
    L.append(
        f"| model | runtime search | WER {test_set} runtime | WER plug-in | hypotheses "
        "different from the plug-in's | RTF runtime | RTF plug-in (PyTorch) | "
        "runtime search time | frames skipped |"
    )
    L.append("|" + "---|" * 9)
    for model, tag, rt, pt, pt_speed in rows:
        s = rt["stats"]
        if pt["text"]:
            keys = set(rt["text"]) | set(pt["text"])
            n = sum(rt["text"].get(k) != pt["text"].get(k) for k in keys)
            diff = f"{n} / {len(keys)}"
        else:
            diff = "-"
        pt_rtf = (pt_speed["stats"] or {}).get("rtf")
        skipped = s.get("frames_skipped_fraction")
        L.append(
            f"| {model} | {_describe(tag)} | "
            f"{fmt_pct(rt['score']['wer'] if rt['score'] else None)} | "
            f"{fmt_pct(pt['score']['wer'] if pt['score'] else None)} | {diff} | "
            f"{s['real_time_factor']:.4f} | "
            + ("-" if pt_rtf is None else f"{pt_rtf:.4f}")
            + f" | {s['search_seconds']:.2f} s | "
            + ("-" if skipped is None else f"{100 * skipped:.1f}%")
            + " |"
        )
    L.append("")
    L.append(
        "Each model exported with `python -m espnet_multiblank.bin.export_onnx` "
        "(every graph checked against PyTorch within 1e-4 before it is written) and "
        "decoded with `python -m espnet_multiblank.runtime.decode` (ONNX Runtime and "
        "NumPy, one thread). The plug-in's decodings are those of stage 11 (greedy: "
        "one utterance at a time; beam: the label-synchronous rule, batch 32) and, for "
        "streams, stage 13's offline decoding at the same chunk (a stream's final "
        "hypothesis is the offline search's on the same encoder output), whose speed "
        "is that of stage 13's streams, 16 at a time (of fewer utterances). Real-time "
        "factors come from separate processes at different times; "
        "`bench/runtime_decode.py` compares the two side by side in one run."
    )
    L.append("")
    return L


def sherpa_section(exp, models, inference_model, test_set):
    """Markdown lines on stage 9's models decoded by sherpa-onnx ([] without)."""
    rows = []
    for m in models:
        name = f"{m}_kaldi"
        d = os.path.join(exp, f"asr_{name}")
        greedy = GREEDY[m]
        runs = [
            ("sherpa-onnx, greedy (its rule)", f"sherpa_greedy_{inference_model}"),
            (
                "runtime, sherpa-onnx's rule (nemo)",
                f"runtime_nemo_b1_{inference_model}",
            ),
            (
                "runtime, the plug-in's greedy rule",
                f"runtime_greedy_b1_{inference_model}",
            ),
            (f"plug-in (PyTorch), {greedy}", f"decode_{greedy}_{inference_model}"),
        ]
        loaded = [(what, _run(os.path.join(d, sub, test_set))) for what, sub in runs]
        if loaded[0][1]["stats"] is None:
            continue
        base = _run(
            os.path.join(
                exp, f"asr_{m}", f"decode_{greedy}_{inference_model}", test_set
            )
        )
        rows.append((m, loaded, base))
    if not rows:
        return []
    L = ["## sherpa-onnx", ""]
    L.append(
        f"| model | decoder | WER {test_set} | hypotheses different from "
        "sherpa-onnx's | RTF (one utterance at a time, one thread) |"
    )
    L.append("|" + "---|" * 5)
    for m, loaded, base in rows:
        ref = loaded[0][1]["text"]
        for what, run in loaded:
            keys = set(ref) | set(run["text"])
            n = (
                sum(ref.get(k) != run["text"].get(k) for k in keys)
                if run["text"]
                else None
            )
            stats = run["stats"] or {}
            rtf = stats.get("rtf", stats.get("real_time_factor"))
            L.append(
                f"| {m} on kaldi_fbank | {what} | "
                f"{fmt_pct(run['score']['wer'] if run['score'] else None)} | "
                + ("-" if n is None else f"{n} / {len(keys)}")
                + " | "
                + ("-" if rtf is None else f"{rtf:.4f}")
                + " |"
            )
        wer = base["score"]["wer"] if base["score"] else None
        L.append(
            f"| {m} (the default front end) | plug-in (PyTorch), {GREEDY[m]} | "
            f"{fmt_pct(wer)} | - | - |"
        )
    L.append("")
    L.append(
        "Stage 9 trains these models again on sherpa-onnx's features (`frontend: "
        "kaldi_fbank`, equal to kaldi-native-fbank's); stage 14 exports them with "
        "`export_onnx --format sherpa_onnx` and decodes `test` with the sherpa-onnx "
        "wheel, with the torch-free runtime (sherpa-onnx's greedy rule, "
        "`--blank_decision nemo`, whose hypotheses must be sherpa-onnx's, and the "
        "plug-in's rule) and "
        "with the plug-in. sherpa-onnx's TDT rule (the token's and the duration's "
        "arg-max on their own, no end rule, up to 5 labels per frame) is not the "
        "plug-in's (`blank_decision: total` over the arcs the end rule allows), so "
        "their hypotheses may differ where the two rules choose differently."
    )
    L.append("")
    return L
