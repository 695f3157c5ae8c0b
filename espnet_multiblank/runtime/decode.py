#!/usr/bin/env python3
"""Decode a data set with an exported model, without torch.

Usage::

    python -m espnet_multiblank.runtime.decode --model_dir D --wav_scp wav.scp \\
        --output_dir O [--search beam --beam_size 4] [--streaming --chunk_ms 640] \\
        [--num_threads 1] [--batch_size 16]

writes

* ``O/text``: Kaldi format, one line per utterance: its key, then the words;
* ``O/token_times.jsonl``: per utterance its tokens with the encoder frame, the
  start in seconds and the frames covered;
* ``O/decoding_stats.json``: utterances, audio seconds, encoder and search seconds,
  the real-time factor (their sum over the audio), frames skipped by big blanks or
  durations, and ``failed_utterances`` (key -> why).

An utterance that cannot be decoded (unreadable, empty, too short, NaN / inf
samples, another sample rate, several channels) is reported by key in
``failed_utterances`` and on stderr; the others are decoded. The exit status is 1
when any failed (0 with ``--allow_failed_utterances true``). Outputs are written
under temporary names and renamed at the end: a run that is stopped leaves no
partial ``text``.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

from espnet_multiblank.runtime.audio import read_wav


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Decode a wav.scp with an exported espnet-multiblank model "
        "(ONNX Runtime and NumPy only)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--model_dir", required=True, help="a directory written by export_onnx"
    )
    parser.add_argument(
        "--wav_scp", required=True, help="Kaldi wav.scp: '<key> <wav file>' per line"
    )
    parser.add_argument("--output_dir", required=True, help="where to write text etc.")
    parser.add_argument(
        "--search",
        choices=["greedy", "beam"],
        default="greedy",
        help="greedy search, or label-synchronous beam search",
    )
    parser.add_argument("--beam_size", type=int, default=4, help="beam search's K")
    parser.add_argument(
        "--blank_decision",
        choices=["total", "symbol", "nemo"],
        default=None,
        help="greedy search's blank-or-label rule (default: the plug-in's for the "
        "model's lattice: total; nemo: NeMo's and sherpa-onnx's rule, for standard "
        "and TDT models)",
    )
    parser.add_argument(
        "--max_sym_per_frame",
        type=int,
        default=None,
        help="labels that may stay at one frame (default: greedy 1 for standard and "
        "multi-blank models, 10 for TDT; beam 10)",
    )
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="decode each utterance as a stream (chunk_conformer models)",
    )
    parser.add_argument(
        "--chunk_ms",
        type=float,
        default=640.0,
        help="streaming: audio per encoder chunk in ms (a multiple of the encoder's "
        "frame shift)",
    )
    parser.add_argument(
        "--piece_ms",
        type=float,
        default=80.0,
        help="streaming: audio per piece fed to a stream, in ms",
    )
    parser.add_argument(
        "--chunk_size",
        type=int,
        default=0,
        help="offline: encoder frames per attention chunk of a chunk_conformer "
        "(0: full context)",
    )
    parser.add_argument(
        "--batch_size",
        type=int,
        default=16,
        help="utterances (or streams) decoded together",
    )
    parser.add_argument(
        "--num_threads", type=int, default=1, help="ONNX Runtime threads per graph"
    )
    parser.add_argument(
        "--allow_failed_utterances",
        choices=["true", "false"],
        default="false",
        help="exit status 0 even when some utterances could not be decoded",
    )
    return parser


def read_scp(path) -> List[Tuple[str, str]]:
    """``(key, path)`` per line of a wav.scp; pipes and offsets are refused."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.strip().split(maxsplit=1)
            if not parts:
                continue
            if len(parts) != 2:
                raise ValueError(
                    f"{path}:{n}: expected '<key> <wav file>', got {line!r}"
                )
            key, value = parts
            if value.endswith("|") or ":" in value and not Path(value).exists():
                raise ValueError(
                    f"{path}:{n}: {key}: only plain file paths are supported (no "
                    f"pipes or ark offsets), got {value!r}"
                )
            entries.append((key, value))
    return entries


def chunk_frames(recognizer, chunk_ms: float) -> int:
    shift_ms = recognizer.model.frame_shift * 1000.0
    chunk = chunk_ms / shift_ms
    if chunk < 1 or abs(chunk - round(chunk)) > 1e-6:
        raise ValueError(
            f"--chunk_ms {chunk_ms:g} must be a positive multiple of the encoder's "
            f"frame shift, {shift_ms:g} ms"
        )
    return int(round(chunk))


def decode_streaming(recognizer, items, chunk: int, piece_ms: float, batch: int):
    """Results of ``items`` ((key, samples, rate)) decoded as streams, ``batch``
    streams at a time, each fed in pieces of ``piece_ms``."""
    from espnet_multiblank.runtime.result import Result

    results = []
    fs = recognizer.sample_rate
    piece = max(int(round(piece_ms * fs / 1000.0)), 1)
    for start in range(0, len(items), batch):
        part, streams = [], []
        for key, x, rate in items[start : start + batch]:
            try:
                stream = recognizer.create_stream(chunk, rate, False, key)
            except (ValueError, TypeError) as e:
                results.append(Result(key=key, error=str(e)))
                continue
            part.append((key, x, rate))
            streams.append(stream)
        pos = 0
        while any(not s.encoder.final and s.error is None for s in streams):
            for s, (_, x, _) in zip(streams, part):
                if s.error is not None or s.encoder.final:
                    continue
                try:
                    s.accept_waveform(x[pos : pos + piece], decode=False)
                    if pos + piece >= len(x):
                        s.input_finished(decode=False)
                except (ValueError, TypeError):
                    pass  # the stream holds the error
            recognizer.decode_streams(streams)
            pos += piece
        results.extend(s.result for s in streams)
    return results


def main(cmd: Optional[List[str]] = None) -> int:
    args = get_parser().parse_args(cmd)
    from espnet_multiblank.runtime.recognizer import Recognizer
    from espnet_multiblank.runtime.result import Result

    try:
        recognizer = Recognizer(
            args.model_dir,
            search=args.search,
            beam_size=args.beam_size,
            blank_decision=args.blank_decision,
            max_sym_per_frame=args.max_sym_per_frame,
            num_threads=args.num_threads,
            chunk_size=args.chunk_size,
            batch_size=args.batch_size,
        )
        chunk = chunk_frames(recognizer, args.chunk_ms) if args.streaming else 0
        entries = read_scp(args.wav_scp)
    except (ValueError, TypeError, OSError) as e:
        print(f"decode: {e}", file=sys.stderr)
        return 2
    failed = {}
    items = []
    for key, path in entries:
        try:
            samples, rate = read_wav(path)
        except (OSError, ValueError) as e:
            failed[key] = f"cannot read {path}: {e}"
            continue
        items.append((key, samples, rate))
    start = time.perf_counter()
    if args.streaming:
        results = decode_streaming(
            recognizer, items, chunk, args.piece_ms, args.batch_size
        )
    else:
        results: List[Result] = []
        by_rate = {}
        for key, x, rate in items:
            by_rate.setdefault(rate, []).append((key, x))
        for rate, group in by_rate.items():
            results.extend(
                recognizer.recognize_batch(
                    [x for _, x in group], rate, [k for k, _ in group]
                )
            )
    wall = time.perf_counter() - start
    order = {key: i for i, (key, _) in enumerate(entries)}
    results.sort(key=lambda r: order[r.key])
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines, times = [], []
    for r in results:
        if r.error is not None:
            failed[r.key] = r.error
            continue
        lines.append(f"{r.key} {r.text}\n")  # as ESPnet writes it (empty: "key ")
        times.append(
            json.dumps(
                {
                    "key": r.key,
                    "tokens": r.tokens,
                    "frames": r.frames,
                    "start_seconds": r.timestamps,
                    "frames_covered": r.durations,
                    "frames_skipped": r.frames_skipped,
                    "score": r.score,
                }
            )
            + "\n"
        )
    stats = recognizer.stats.as_dict()
    stats.update(
        wall_seconds=wall,
        search=args.search,
        streaming=args.streaming,
        chunk_size=chunk if args.streaming else args.chunk_size,
        num_threads=args.num_threads,
        failed_utterances=failed,
    )
    _write(out / "text", "".join(lines))
    _write(out / "token_times.jsonl", "".join(times))
    _write(out / "decoding_stats.json", json.dumps(stats, indent=2) + "\n")
    for key, why in failed.items():
        print(f"decode: {key}: {why}", file=sys.stderr)
    if failed and args.allow_failed_utterances != "true":
        return 1
    return 0


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
