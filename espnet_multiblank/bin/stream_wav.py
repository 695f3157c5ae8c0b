#!/usr/bin/env python3
"""Stream one wav file through a transducer and watch the partial hypotheses.

Usage::

    python -m espnet_multiblank.bin.stream_wav \\
        --asr_train_config exp/asr_multiblank/config.yaml \\
        --asr_model_file exp/asr_multiblank/valid.loss.ave.pth \\
        --wav test.wav --piece_ms 100 --chunk_size 8 [--config conf/decode/...yaml]

The wav is fed in pieces of ``--piece_ms`` milliseconds (``--realtime``: one piece
every ``--piece_ms`` of wall time, as from a microphone); every time the partial
hypothesis changes, a line ``<audio seconds received>  <partial text>`` is printed,
and at the end the final hypothesis with the emission time of each word
(:class:`~espnet_multiblank.espnet.inference.streaming.
MultiblankSpeech2TextStreaming`; the model needs ``encoder: chunk_conformer``).
"""

import argparse
import sys
import time
from typing import List, Optional


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Stream a wav file through a transducer (encoder: "
        "chunk_conformer), printing '<seconds received>  <partial text>' whenever "
        "the partial hypothesis changes, then the final hypothesis and when each of "
        "its tokens was emitted",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--asr_train_config",
        required=True,
        help="the model's training config (exp/asr_*/config.yaml)",
    )
    parser.add_argument(
        "--asr_model_file",
        required=True,
        help="the model's parameters (exp/asr_*/valid.loss.ave.pth)",
    )
    parser.add_argument(
        "--wav",
        required=True,
        help="the audio file: one channel at the model's sample rate (its rate is "
        "read from the file and checked)",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="a decode config (conf/decode/*.yaml: its transducer_conf, beam_size, "
        "nbest, lm_weight, ngram_weight are used); None: mb_greedy with its "
        "defaults",
    )
    parser.add_argument(
        "--piece_ms",
        type=float,
        default=100.0,
        help="milliseconds of audio per piece fed to the decoder",
    )
    parser.add_argument(
        "--chunk_size",
        type=int,
        default=0,
        help="encoder frames per chunk (0: the model's decoding_chunk_size, or 16)",
    )
    parser.add_argument(
        "--left_chunks",
        type=int,
        default=None,
        help="chunks to the left a chunk attends to (None: the model's "
        "num_left_chunks; -1: all)",
    )
    parser.add_argument(
        "--partial",
        choices=["provisional", "decided"],
        default="provisional",
        help="partial hypotheses: the offline result for the audio so far "
        "(provisional; may change) or only the labels already decided (never "
        "change)",
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="feed one piece every --piece_ms of wall time, as from a microphone "
        "(false: as fast as the decoder goes)",
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device to decode on (cpu, cuda, ...)"
    )
    return parser


def _decode_config(path: Optional[str]) -> dict:
    if path is None:
        return {"transducer_conf": {"search_type": "mb_greedy"}}
    import yaml

    with open(path, encoding="utf-8") as f:
        conf = yaml.safe_load(f) or {}
    keys = ("transducer_conf", "beam_size", "nbest", "lm_weight", "ngram_weight")
    return {k: conf[k] for k in keys if k in conf}


def main(cmd: Optional[List[str]] = None) -> int:
    args = get_parser().parse_args(cmd)
    import soundfile

    import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
    from espnet_multiblank.espnet.inference.stream_loop import chunk_size_of
    from espnet_multiblank.espnet.inference.streaming import (
        MultiblankSpeech2TextStreaming,
    )
    from espnet_multiblank.espnet.registration import register

    register()
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    speech, rate = soundfile.read(args.wav, dtype="float32")
    s2t = MultiblankSpeech2Text(
        asr_train_config=args.asr_train_config,
        asr_model_file=args.asr_model_file,
        device=args.device,
        **_decode_config(args.config),
    )
    streaming = MultiblankSpeech2TextStreaming(
        chunk_size=chunk_size_of(s2t.asr_model, args.chunk_size),
        num_left_chunks=args.left_chunks,
        provisional=args.partial == "provisional",
        sample_rate=rate,
        speech2text=s2t,
    )
    size = max(1, int(round(args.piece_ms * rate / 1000.0)))
    shown = None
    start = time.perf_counter()
    for first in range(0, len(speech) + 1, size):
        piece = speech[first : first + size]
        final = first + size > len(speech)
        if args.realtime:
            time.sleep(max(0.0, first / rate - (time.perf_counter() - start)))
        try:
            results = streaming(piece, is_final=final)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        text = _text(results[0]) if results else ""
        received = min(first + size, len(speech)) / rate
        if final:
            words = streaming.last.emitted or []
            print(f"{received:7.2f}s  final: {text}")
            tokens = results[0][1]
            timing = " ".join(f"{t}@{e:.2f}s" for t, e in zip(tokens, words))
            print(f"          emitted: {timing}")
        elif text != shown:
            print(f"{received:7.2f}s  {text}")
            shown = text
    return 0


def _text(result) -> str:
    text, tokens = result[0], result[1]
    return text if text is not None else " ".join(tokens)


if __name__ == "__main__":
    sys.exit(main())
