#!/usr/bin/env python3
"""Batched beam search against batched greedy search and one-at-a-time beam search.

Two modes, every contender timed in interleaved rounds in one run (medians), ratios
printed:

* **search** (default): the searches alone on encoder outputs, any device. Models:
  random networks of the digits recipe's decoder sizes (``bench/decode_gpu.py``:
  standard, multi-blank [2, 4, 8], TDT 0..8, random encoder outputs of 20..100
  frames), or a trained model and real speech (``--exp DIR --data wav.scp``: the
  encoder runs once, untimed). Contenders at batch B (``--batch``, default 32):

  - ``greedy``: the frame-looping batched greedy search (``search_batch``);
  - ``beam-frame``, ``beam-step``, ``beam-label``: the batched beam search
    (``search_batch_nbest``) of each ``beam_sync`` rule, beam ``--beam``;
  - ``beam-one``: the one-utterance beam search (``search``), what ``--batch_size 1``
    decoding runs;
  - ``beam-label-prune`` (with ``--frame-prune N``): the label rule with
    ``frame_prune: N``, its 1-best and scores compared with ``beam-label``'s;

  with the hypotheses of ``beam`` checked against ``beam-one`` (``same``).

* **e2e** (``--e2e EXP_ROOT --data-dir DIR``): whole decoding runs through
  ``python -m espnet_multiblank.bin.asr_inference`` (in this process, one torch
  thread; data loading, encoder, search, writing; model loading not timed:
  ``decoding_stats.json``'s ``decode_seconds``) of the recipe's models
  ``EXP_ROOT/asr_{standard,multiblank,tdt}`` on ``DIR/wav.scp``, with the recipe's
  decode configs: greedy at batch 32, beam at batch 32, beam at batch 1, and with
  ``--lm DIR`` (an ``espnet2.bin.lm_train`` output: ``config.yaml``,
  ``valid.loss.best.pth``) beam at batch 32 and 1 with the LM (weight
  ``--lm-weight``); beam is the frame rule (``mb_beam.yaml``, ``tdt_beam.yaml``),
  ``--step`` adds the step rule (``*_beam_step.yaml``) at batch 32, ``--label``
  the label-synchronous rule (``*_beam_label.yaml``). The
  issue's goals (on the recipe's ``test``, beam 4): beam b32 <= 1.5x greedy b32
  (<= 2.0x with an LM), beam b32 >= 5x faster than beam b1, the same hypotheses at
  batch 32 and 1. ``--rounds`` runs of each, interleaved.

Usage::

    python bench/decode_beam.py --device cpu                   # random models
    python bench/decode_beam.py --exp exp/asr_multiblank --data data/test/wav.scp
    python bench/decode_beam.py --e2e egs/digits/asr1/exp \\
        --data-dir egs/digits/asr1/data/test --lm egs/digits/asr1/exp/lm_train

``bench/gpu_check.sh`` runs the search mode on the GPU (``DECODE_BUDGET_S``, ``OUT``
as for ``bench/decode_gpu.py``).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_gpu import (  # noqa: E402
    FRAME_SHIFT,
    Model,
    make_batches,
    random_encs,
    random_model,
    trained_model,
)

from espnet_multiblank.decoding import (  # noqa: E402
    BeamSearch,
    GreedySearch,
    single_thread_on_cpu,
)

KINDS = ("standard", "multiblank", "tdt")


# ---------------------------------------------------------------- search mode
def contenders(model: Model, beam: int, frame_prune=None):
    greedy = GreedySearch(model.stepper, model.lattice)
    frame = BeamSearch(model.stepper, model.lattice, beam_size=beam, beam_sync="frame")
    step = BeamSearch(model.stepper, model.lattice, beam_size=beam, beam_sync="step")
    label = BeamSearch(model.stepper, model.lattice, beam_size=beam, beam_sync="label")
    out = [
        ("greedy", greedy),
        ("beam-frame", frame),
        ("beam-step", step),
        ("beam-label", label),
        ("beam-one", frame),
    ]
    if frame_prune is not None:
        out.append(
            (
                "beam-label-prune",
                BeamSearch(
                    model.stepper,
                    model.lattice,
                    beam_size=beam,
                    beam_sync="label",
                    frame_prune=frame_prune,
                ),
            )
        )
    return out


def run_search(name, search, batches, n):
    """(seconds, 1-best hypotheses in input order)."""
    device = batches[0][1].device
    out = [None] * n
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with single_thread_on_cpu(device):
        for idx, enc, lens in batches:
            if name == "beam-one":
                hyps = [search.search(enc[b, : lens[b]])[0] for b in range(len(idx))]
            elif name.startswith("beam"):
                hyps = [h[0] for h in search.search_batch_nbest(enc, lens)]
            else:
                hyps = search.search_batch(enc, lens)
            for i, h in zip(idx, hyps):
                out[i] = h
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def bench_search(model: Model, args, device, out):
    encs = model.encs
    batches = make_batches(encs, args.batch, device)
    frames = sum(e.size(0) for e in encs)
    names = contenders(model, args.beam, args.frame_prune)
    for name, search in names:  # warm-up
        run_search(name, search, batches[:1], len(encs))
    times = {name: [] for name, _ in names}
    hyps = {}
    for _ in range(args.rounds):
        for name, search in names:
            seconds, hyps[name] = run_search(name, search, batches, len(encs))
            times[name].append(seconds)
    med = {name: statistics.median(t) for name, t in times.items()}
    labels = {name: [h.yseq for h in hs] for name, hs in hyps.items()}
    step_vs_frame = [
        s.score - f.score for s, f in zip(hyps["beam-step"], hyps["beam-frame"])
    ]
    row = {
        "mode": "search",
        "kind": model.kind,
        "model": args.model_name,
        "device": str(device),
        "batch": args.batch,
        "beam": args.beam,
        "utts": len(encs),
        "frames": frames,
        "audio_s": frames * args.frame_shift,
        "rounds": args.rounds,
        "seconds": med,
        "frame_over_greedy": med["beam-frame"] / med["greedy"],
        "step_over_greedy": med["beam-step"] / med["greedy"],
        "one_over_frame": med["beam-one"] / med["beam-frame"],
        "one_over_step": med["beam-one"] / med["beam-step"],
        "frame_same_as_one": labels["beam-frame"] == labels["beam-one"],
        "step_same_1best_as_frame": sum(
            a == b for a, b in zip(labels["beam-step"], labels["beam-frame"])
        )
        / len(encs),
        "step_score_minus_frame_mean": statistics.mean(step_vs_frame),
        "label_over_greedy": med["beam-label"] / med["greedy"],
        "one_over_label": med["beam-one"] / med["beam-label"],
        "label_same_1best_as_frame": sum(
            a == b for a, b in zip(labels["beam-label"], labels["beam-frame"])
        )
        / len(encs),
        "greedy_same_1best_as_frame": sum(
            a == b for a, b in zip(labels["greedy"], labels["beam-frame"])
        )
        / len(encs),
    }
    if args.frame_prune is not None:
        pruned, full = hyps["beam-label-prune"], hyps["beam-label"]
        row["frame_prune"] = args.frame_prune
        row["label_over_pruned"] = med["beam-label"] / med["beam-label-prune"]
        row["pruned_same_1best_as_label"] = sum(
            a.yseq == b.yseq for a, b in zip(pruned, full)
        ) / len(encs)
        row["pruned_score_diff_max"] = max(
            abs(a.score - b.score) for a, b in zip(pruned, full) if a.yseq == b.yseq
        )
    if model.encoder_s is not None:
        row["encoder_s"] = model.encoder_s
    out(row)
    print(
        f"{model.kind:10s} {args.model_name:7s} {device} b{args.batch} beam "
        f"{args.beam} ({len(encs)} utts, {args.rounds} rounds): search s "
        + ", ".join(f"{n} {t:.3f}" for n, t in med.items())
        + f"\n    frame/greedy {row['frame_over_greedy']:.2f}x, step/greedy "
        f"{row['step_over_greedy']:.2f}x, one/frame {row['one_over_frame']:.2f}x, "
        f"one/step {row['one_over_step']:.2f}x | frame == one: "
        f"{row['frame_same_as_one']}; 1-best step == frame "
        f"{100 * row['step_same_1best_as_frame']:.0f}%, greedy == frame "
        f"{100 * row['greedy_same_1best_as_frame']:.0f}%, mean score step - frame "
        f"{row['step_score_minus_frame_mean']:+.4f}"
        f"\n    label/greedy {row['label_over_greedy']:.2f}x, one/label "
        f"{row['one_over_label']:.2f}x, 1-best label == frame "
        f"{100 * row['label_same_1best_as_frame']:.0f}%",
        flush=True,
    )
    if args.frame_prune is not None:
        print(
            f"    frame_prune {args.frame_prune}: label / pruned "
            f"{row['label_over_pruned']:.2f}x, 1-best pruned == label "
            f"{100 * row['pruned_same_1best_as_label']:.0f}%, largest score "
            f"difference {row['pruned_score_diff_max']:.1e}",
            flush=True,
        )


# ------------------------------------------------------------------- e2e mode
def e2e_runs(args):
    """[(name, model kind, decode config, batch size, extra args)]."""
    conf = Path(__file__).resolve().parents[1] / "conf" / "decode"
    beam_conf = {
        "standard": "mb_beam.yaml",
        "multiblank": "mb_beam.yaml",
        "tdt": "tdt_beam.yaml",
    }
    greedy_conf = {
        "standard": "mb_greedy.yaml",
        "multiblank": "mb_greedy.yaml",
        "tdt": "tdt_greedy.yaml",
    }
    runs = []
    for kind in args.kinds.split(","):
        rule_conf = {
            rule: conf / beam_conf[kind].replace(".yaml", f"_{rule}.yaml")
            for rule in args.rules
        }
        runs.append(("greedy_b32", kind, conf / greedy_conf[kind], 32, []))
        runs.append(("beam_b32", kind, conf / beam_conf[kind], 32, []))
        runs.append(("beam_b1", kind, conf / beam_conf[kind], 1, []))
        for rule, path in rule_conf.items():
            runs.append((f"{rule}_b32", kind, path, 32, []))
        if args.lm:
            lm = Path(args.lm)
            lm_file = lm / "valid.loss.best.pth"  # what the recipe decodes with
            if not lm_file.exists():
                lm_file = lm / "valid.loss.ave.pth"
            extra = [
                "--lm_train_config",
                str(lm / "config.yaml"),
                "--lm_file",
                str(lm_file),
                "--lm_weight",
                str(args.lm_weight),
            ]
            runs.append(("beam_lm_b32", kind, conf / beam_conf[kind], 32, extra))
            runs.append(("beam_lm_b1", kind, conf / beam_conf[kind], 1, extra))
            for rule, path in rule_conf.items():
                runs.append((f"{rule}_lm_b32", kind, path, 32, extra))
    return runs


def run_e2e(kind, conf, batch, extra, args, out_dir):
    from espnet_multiblank.bin.asr_inference import get_parser, inference

    exp = Path(args.e2e) / f"asr_{kind}"
    cmd = [
        "--config",
        str(conf),
        "--asr_train_config",
        str(exp / "config.yaml"),
        "--asr_model_file",
        str(exp / "valid.loss.ave.pth"),
        "--data_path_and_name_and_type",
        f"{Path(args.data_dir) / 'wav.scp'},speech,sound",
        "--output_dir",
        str(out_dir),
        "--batch_size",
        str(batch),
        "--ngpu",
        "0",
        "--beam_size",
        str(args.beam),
        *extra,
    ]
    kwargs = vars(get_parser().parse_args(cmd))
    kwargs.pop("config", None)
    kwargs.pop("allow_failed_utterances", None)
    torch.set_num_threads(1)
    stats = inference(**kwargs)
    text = (Path(out_dir) / "1best_recog" / "token_int").read_text()
    return stats, text, word_error_rate(args.data_dir, out_dir)


def word_error_rate(data_dir, out_dir):
    """WER (%) of ``out_dir``'s 1-best against ``data_dir/text`` (None without it);
    a missing hypothesis counts as deletions."""
    import editdistance

    ref_path = Path(data_dir) / "text"
    if not ref_path.exists():
        return None

    def read(path):
        out = {}
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            if parts:
                out[parts[0]] = parts[1:]
        return out

    refs = read(ref_path)
    hyps = read(Path(out_dir) / "1best_recog" / "text")
    errors = sum(editdistance.eval(r, hyps.get(u, [])) for u, r in refs.items())
    words = sum(len(r) for r in refs.values())
    return 100.0 * errors / max(words, 1)


def bench_e2e(args, out):
    import logging

    logging.disable(logging.WARNING)
    runs = e2e_runs(args)
    times = {(name, kind): [] for name, kind, *_ in runs}
    search_times = {(name, kind): [] for name, kind, *_ in runs}
    texts, wers = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, kind, conf, batch, extra) in enumerate(runs):
                stats, text, wers[name, kind] = run_e2e(
                    kind, conf, batch, extra, args, Path(tmp) / f"{r}_{i}"
                )
                times[name, kind].append(stats["decode_seconds"])
                search_times[name, kind].append(stats["search_seconds"])
                texts[name, kind] = text
    for kind in args.kinds.split(","):
        med = {n: statistics.median(times[n, k]) for n, k in times if k == kind}
        srch = {n: statistics.median(search_times[n, k]) for n, k in times if k == kind}
        row = {
            "mode": "e2e",
            "kind": kind,
            "data": args.data_dir,
            "beam": args.beam,
            "rounds": args.rounds,
            "decode_seconds": med,
            "search_seconds": srch,
            "beam_b32_over_greedy_b32": med["beam_b32"] / med["greedy_b32"],
            "beam_b1_over_beam_b32": med["beam_b1"] / med["beam_b32"],
            "same_b32_b1": texts["beam_b32", kind] == texts["beam_b1", kind],
        }
        line = (
            f"{kind:10s} e2e decode s: greedy b32 {med['greedy_b32']:.2f}, beam b32 "
            f"{med['beam_b32']:.2f}, beam b1 {med['beam_b1']:.2f} | beam b32 / "
            f"greedy b32 {row['beam_b32_over_greedy_b32']:.2f}x (goal <= 1.5), "
            f"beam b1 / beam b32 {row['beam_b1_over_beam_b32']:.2f}x (goal >= 5), "
            f"same hyps b32/b1: {row['same_b32_b1']}"
        )
        for rule in args.rules:
            name = f"{rule}_b32"
            if name not in med:
                continue
            row[f"{rule}_b32_over_greedy_b32"] = med[name] / med["greedy_b32"]
            row[f"beam_b1_over_{rule}_b32"] = med["beam_b1"] / med[name]
            row[f"{rule}_same_as_b1"] = texts[name, kind] == texts["beam_b1", kind]
            line += (
                f" | {rule} b32 {med[name]:.2f} s = "
                f"{row[f'{rule}_b32_over_greedy_b32']:.2f}x greedy, beam b1 / "
                f"{rule} {row[f'beam_b1_over_{rule}_b32']:.2f}x, same hyps as beam "
                f"b1: {row[f'{rule}_same_as_b1']}"
            )
        if "beam_lm_b32" in med:
            row["beam_lm_b32_over_greedy_b32"] = med["beam_lm_b32"] / med["greedy_b32"]
            row["beam_lm_b1_over_beam_lm_b32"] = med["beam_lm_b1"] / med["beam_lm_b32"]
            row["same_lm_b32_b1"] = (
                texts["beam_lm_b32", kind] == texts["beam_lm_b1", kind]
            )
            line += (
                f" | LM: beam b32 {med['beam_lm_b32']:.2f} s = "
                f"{row['beam_lm_b32_over_greedy_b32']:.2f}x greedy (goal <= 2.0), "
                f"b1 {med['beam_lm_b1']:.2f} s = "
                f"{row['beam_lm_b1_over_beam_lm_b32']:.2f}x, same: "
                f"{row['same_lm_b32_b1']}"
            )
        for rule in args.rules:
            name = f"{rule}_lm_b32"
            if name not in med:
                continue
            row[f"{name}_over_greedy_b32"] = med[name] / med["greedy_b32"]
            line += (
                f" | LM {rule} b32 {med[name]:.2f} s = "
                f"{row[f'{name}_over_greedy_b32']:.2f}x greedy"
            )
        line += (
            "\n"
            + " " * 11
            + "search s: "
            + ", ".join(f"{n} {s:.3f}" for n, s in srch.items())
        )
        wer = {n: wers[n, k] for n, k in wers if k == kind}
        row["wer"] = wer
        if all(w is not None for w in wer.values()):
            line += "\n" + " " * 11 + "WER %: "
            line += ", ".join(f"{n} {w:.2f}" for n, w in wer.items())
        out(row)
        print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="search mode: cuda / cpu")
    parser.add_argument("--batch", type=int, default=32, help="search mode: B")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--utts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--frame-shift", type=float, default=FRAME_SHIFT)
    parser.add_argument("--exp", default=None, help="search mode: a trained model")
    parser.add_argument("--model-file", default=None)
    parser.add_argument("--data", default=None, help="search mode: wav.scp")
    parser.add_argument("--e2e", default=None, help="e2e mode: the recipe's exp/")
    parser.add_argument("--data-dir", default=None, help="e2e mode: a data dir")
    parser.add_argument("--lm", default=None, help="e2e mode: an LM exp dir")
    parser.add_argument("--lm-weight", type=float, default=0.4)
    parser.add_argument(
        "--step", action="store_true", help="e2e mode: the step rule at batch 32 too"
    )
    parser.add_argument(
        "--label",
        action="store_true",
        help="e2e mode: the label-synchronous rule at batch 32 too",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=float(os.environ.get("DECODE_BUDGET_S", 0)) or None,
        help="search mode: stop starting models after this many seconds",
    )
    parser.add_argument(
        "--frame-prune",
        type=float,
        default=None,
        help="search mode: the label rule with this frame_prune too",
    )
    parser.add_argument("--out", default=None, help="JSONL output")
    args = parser.parse_args()
    args.rules = [rule for rule in ("step", "label") if getattr(args, rule)]
    torch.set_num_threads(args.threads)
    out_path = args.out or (
        str(Path(os.environ["OUT"]) / "decode_beam.jsonl")
        if os.environ.get("OUT")
        else None
    )

    def out(row):
        if out_path:
            Path(out_path).parent.mkdir(parents=True, exist_ok=True)
            with open(out_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    start = time.perf_counter()
    if args.e2e:
        if not args.data_dir:
            parser.error("--e2e needs --data-dir")
        bench_e2e(args, out)
        print(f"done in {time.perf_counter() - start:.1f} s")
        return 0
    device = torch.device(
        args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    )
    print(f"device {device}, torch {torch.__version__}, threads {args.threads}")
    if args.exp:
        if not args.data:
            parser.error("--exp needs --data")
        args.utts = args.utts or 10**9
        kind, decoder, joint, lattice, encs, enc_s = trained_model(args, device)
        args.model_name = "trained"
        models = [Model(kind, decoder, joint, lattice, encs, device, enc_s)]
    else:
        args.model_name = "random"
        encs = random_encs(args.utts, args.seed)
        models = [
            Model(kind, *random_model(kind, args.seed), encs, device)
            for kind in args.kinds.split(",")
        ]
    for model in models:
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"SKIPPED {model.kind}: budget spent")
            continue
        bench_search(model, args, device, out)
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
