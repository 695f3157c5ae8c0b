#!/usr/bin/env python3
"""Streaming search of the digits recipe's models, side by side in one run.

The streaming search of the multi-blank and TDT models against the standard model's
(issue 25's goal: at least 1.8x faster), timed as stage 12 of the recipe times it but
in interleaved rounds (medians and minimums over ``--rounds``), so that the ratios do
not depend on what else the machine did during one decoding.

For every model of ``EXP_ROOT/asr_{standard,multiblank,tdt}`` (the recipe's greedy
decode configs: ``mb_greedy`` for the standard and multi-blank models, ``tdt_greedy``
for the TDT), every chunk of ``--chunks`` (encoder frames) and every partial mode of
``--partials`` (``provisional``: the partial hypothesis runs the undecided frames to
the end after each piece, the default of the entry points; ``decided``: only the
decided labels) and every greedy loop of ``--loops`` (``one``: the one-utterance
loop, what one stream runs by default; ``label``: the label-looping batch, what
several streams run), ``--utts`` utterances of ``DATA_DIR/wav.scp`` (spread over it as
stage 12 picks them) are streamed through
:class:`~espnet_multiblank.espnet.inference.streaming.StreamingDecoder`, ``--streams``
at a time, in pieces of ``--piece`` samples, one torch thread. Timed: the decoder's
``search_seconds`` (the search's steps and its provisional runs; the encoder
excluded). Printed per case: the search time (median, minimum), the steps the search
took (joint-network calls and prediction-network calls, provisional runs included,
counted in a separate untimed run), and the ratios standard / model. Every round's
final hypotheses are checked to be the same (a streamed hypothesis does not depend
on the round).

``--split`` (one-utterance loop only) adds, in the same rounds, what the streams'
search time is made of: ``offline``, the one-utterance search of each utterance's
chunk-masked encoder output in one call; ``frames``, the same encoder output fed to
the streaming search chunk by chunk with nothing run between the chunks; and
``frames+flush``, the same with a 16 MB buffer written before each chunk, as a
chunk of the encoder evicts the search's weights and state from the CPU's caches
between two of its calls in a real stream. The final hypotheses of ``frames`` are
checked against ``offline``.

Usage::

    python bench/stream_search.py /work/full/exp /work/full/data/test
    python bench/stream_search.py EXP_ROOT DATA_DIR --chunks 16 --rounds 5 \\
        --partials provisional,decided
    python bench/stream_search.py EXP_ROOT DATA_DIR --chunks 16 --loops one --split
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import soundfile
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import espnet_multiblank.espnet.registration.quiet  # noqa: E402,F401  (first)

KINDS = ("standard", "multiblank", "tdt")
SEARCH = {"standard": "mb_greedy", "multiblank": "mb_greedy", "tdt": "tdt_greedy"}


def pick(wav_scp: Path, want: int) -> List[Tuple[str, np.ndarray, int]]:
    """``want`` utterances spread over ``wav_scp`` (every k-th, as stage 12)."""
    lines = [line.split(maxsplit=1) for line in wav_scp.read_text().splitlines()]
    lines = [entry for entry in lines if len(entry) == 2]
    step = max(1, len(lines) // want)
    out = []
    for key, path in lines[::step][:want]:
        speech, rate = soundfile.read(path.strip(), dtype="float32")
        out.append((key, speech, rate))
    return out


def build(exp_root: Path, kind: str, model_file: str):
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    conf = yaml.safe_load((ROOT / "conf/decode" / f"{SEARCH[kind]}.yaml").read_text())
    return MultiblankSpeech2Text(
        asr_train_config=str(exp_root / f"asr_{kind}" / "config.yaml"),
        asr_model_file=str(exp_root / f"asr_{kind}" / model_file),
        transducer_conf=conf["transducer_conf"],
        beam_size=1,
        nbest=1,
        device="cpu",
    )


class StepCounter:
    """Counts the joint-network and prediction-network calls of a stepper."""

    def __init__(self, stepper):
        self.stepper = stepper
        self.joint = self.pred = 0
        self._joint, self._step = stepper.joint, stepper.step

    def __enter__(self):
        def joint(*args):
            self.joint += 1
            return self._joint(*args)

        def step(*args):
            self.pred += 1
            return self._step(*args)

        self.stepper.joint, self.stepper.step = joint, step
        return self

    def __exit__(self, *exc):
        del self.stepper.joint, self.stepper.step
        return False


def stream_all(
    s2t, utts, chunk: int, partial: str, streams: int, piece: int, loop: str
):
    """(search seconds, {key: labels}) of streaming ``utts``."""
    from espnet_multiblank.espnet.inference.streaming import StreamingDecoder

    decoder = StreamingDecoder(
        s2t,
        chunk,
        max_streams=streams,
        provisional=partial == "provisional",
        one_loop=loop == "one",
    )
    pending = list(utts)
    position: Dict[str, Tuple[np.ndarray, int]] = {}
    labels: Dict[str, List[int]] = {}
    while pending or decoder.streams:
        while pending and len(decoder.streams) < streams:
            key, speech, rate = pending.pop(0)
            decoder.open(key, rate)
            position[key] = (speech, 0)
        pieces = {}
        for key in list(decoder.streams):
            speech, start = position[key]
            stop = start + piece
            pieces[key] = (speech[start:stop], stop >= speech.shape[0])
            position[key] = (speech, stop)
        for key, result in decoder.feed(pieces).items():
            if result.is_final:
                if result.error is not None:
                    raise RuntimeError(f"{key}: {result.error}")
                labels[key] = list(result.results[0][3].yseq[1:])
    return decoder.stats["search_seconds"], labels, decoder.stats


def chunk_encoder_outputs(s2t, utts, chunk: int) -> List[torch.Tensor]:
    """Each utterance's (T, J) projected chunk-masked encoder output (untimed)."""
    model = s2t.asr_model
    stepper = s2t.beam_search_transducer.stepper
    model.encoder.set_decoding_chunk(chunk, None)
    out = []
    with torch.no_grad():
        for _, speech, _ in utts:
            x = torch.as_tensor(speech)[None]
            enc, _ = model.encode(x, torch.tensor([x.size(1)]))
            out.append(stepper.project_enc(enc[0]))
    return out


def offline_search(s2t, enc_projs) -> Tuple[float, List[List[int]]]:
    """Seconds and labels of one-utterance searches, one call per utterance (the
    state before the first frame made untimed, as a stream's is made once)."""
    search = s2t.beam_search_transducer
    seconds, labels = 0.0, []
    with torch.no_grad():
        for ep in enc_projs:
            run = search.start_one(ep.device)
            start = time.perf_counter()
            search.run_one(run, ep, ep.size(0))
            labels.append(search.finish_one(run).labels)
            seconds += time.perf_counter() - start
    return seconds, labels


def frames_search(
    s2t, enc_projs, chunk: int, partial: str, flush: bool
) -> Tuple[float, List[List[int]]]:
    """Seconds and labels of the streaming search fed ``chunk`` frames at a time
    (``flush``: a 16 MB buffer written, untimed, before each chunk)."""
    from espnet_multiblank.decoding.streaming import StreamingRowGreedySearch

    buffer = torch.zeros(4 << 20) if flush else None
    rows = StreamingRowGreedySearch(s2t.beam_search_transducer, 1, "cpu")
    seconds, labels = 0.0, []
    with torch.no_grad():
        for ep in enc_projs:
            rows.reset([0])
            for i in range(0, ep.size(0), chunk):
                if buffer is not None:
                    buffer.add_(1.0)
                start = time.perf_counter()
                last = i + chunk >= ep.size(0)
                rows.append(0, ep[i : i + chunk], final=last)
                rows.advance()
                if partial == "provisional" and not last:
                    rows.provisional([0])
                seconds += time.perf_counter() - start
            labels.append(rows.hypothesis(0).labels)
    return seconds, labels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_root", type=Path, help="the recipe's exp/")
    parser.add_argument("data_dir", type=Path, help="a data dir with wav.scp")
    parser.add_argument("--chunks", default="4,16", help="encoder frames per chunk")
    parser.add_argument("--partials", default="provisional")
    parser.add_argument("--utts", type=int, default=100)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument(
        "--loops",
        default="one,label",
        help="greedy loops: one (one-utterance loop), label (label-looping batch)",
    )
    parser.add_argument("--piece", type=int, default=640, help="samples per piece")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(KINDS))
    parser.add_argument("--model_file", default="valid.loss.ave.pth")
    parser.add_argument(
        "--split",
        action="store_true",
        help="also time offline, frames and frames+flush (module docstring)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kinds = args.models.split(",")
    if kinds[0] != "standard":
        parser.error("--models must start with standard (the ratios' reference)")
    chunks = [int(c) for c in args.chunks.split(",")]
    partials = args.partials.split(",")
    loops = args.loops.split(",")
    utts = pick(args.data_dir / "wav.scp", args.utts)
    audio = sum(s.shape[0] / r for _, s, r in utts)
    s2ts = {k: build(args.exp_root, k, args.model_file) for k in kinds}
    cases = [(c, p, lp) for c in chunks for p in partials for lp in loops]
    times = {(k,) + case: [] for k in kinds for case in cases}
    hyps, steps = {}, {}
    for k in kinds:  # untimed: warm-up, step counts, reference hypotheses
        for c, p, lp in cases:
            with StepCounter(s2ts[k].beam_search_transducer.stepper) as n:
                _, labels, stats = stream_all(
                    s2ts[k], utts, c, p, args.streams, args.piece, lp
                )
            hyps[k, c, p, lp] = labels
            steps[k, c, p, lp] = (n.joint, n.pred, stats)
    splits = []  # (chunk, partial, how) of --split
    if args.split:
        encs = {
            (k, c): chunk_encoder_outputs(s2ts[k], utts, c)
            for k in kinds
            for c in chunks
        }
        for c in chunks:
            splits.append((c, "-", "offline"))
            for p in partials:
                splits += [(c, p, "frames"), (c, p, "frames+flush")]
        for k in kinds:
            for c, p, how in splits:
                times[(k, c, p, how)] = []
    for r in range(args.rounds):
        for c, p, lp in cases:
            for k in kinds:
                seconds, labels, _ = stream_all(
                    s2ts[k], utts, c, p, args.streams, args.piece, lp
                )
                if labels != hyps[k, c, p, lp]:
                    raise RuntimeError(f"{k} chunk {c} {p} {lp}: other hypotheses")
                times[k, c, p, lp].append(seconds)
        for c, p, how in splits:
            for k in kinds:
                if how == "offline":
                    seconds, labels = offline_search(s2ts[k], encs[k, c])
                    hyps[k, c, "offline"] = labels
                else:
                    seconds, labels = frames_search(
                        s2ts[k], encs[k, c], c, p, how == "frames+flush"
                    )
                    if labels != hyps[k, c, "offline"]:
                        raise RuntimeError(f"{k} chunk {c} {p} {how}: not offline's")
                times[k, c, p, how].append(seconds)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(
        f"{len(utts)} utterances ({audio:.1f} s of audio), {args.streams} stream(s) "
        f"at a time, pieces of {args.piece} samples, {args.rounds} rounds, one "
        "torch thread; search seconds (median / min), steps: joint calls / "
        "prediction calls, frames skipped"
    )
    print(
        "| chunk | partial | loop | model | search median | min | joint calls | "
        "prediction calls | frames skipped | standard / this (median) | (min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, p, lp in cases + splits:
        ref = times["standard", c, p, lp]
        for k in kinds:
            t = times[k, c, p, lp]
            joint = pred = skipped = "-"
            if (k, c, p, lp) in steps:
                joint, pred, stats = steps[k, c, p, lp]
                total = max(1, stats["total_frames"])
                skipped = f"{100 * stats['frames_skipped'] / total:.1f}%"
            print(
                f"| {c} | {p} | {lp} | {k} | {statistics.median(t):.3f} s | "
                f"{min(t):.3f} s "
                f"| {joint} | {pred} | {skipped} | "
                f"{statistics.median(ref) / statistics.median(t):.2f}x | "
                f"{min(ref) / min(t):.2f}x |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
