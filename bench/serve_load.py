#!/usr/bin/env python3
"""The live server under load: many WebSocket clients at once on 127.0.0.1.

Starts ``python -m espnet_multiblank.runtime.serve`` on an exported streaming model
(a subprocess, as deployed; ``--chunk_size`` as given, one ONNX Runtime thread), then
in each of ``--rounds`` rounds runs ``--clients`` clients at once, client i sending
utterance i of ``DATA_DIR/wav.scp`` in pieces of ``--piece_ms``:

* as fast as the server reads them (default): a stream's real-time factor is its
  wall time, from its first piece to its final result, over its audio's length;
* ``--realtime``: one piece every ``--piece_ms`` (a microphone): the figure is the
  final result's latency after ``Done``.

Every final result must equal the runtime's offline decoding of the utterance at
the same chunk size (``Recognizer(model_dir, chunk_size=C).recognize``); printed:
per stream its median over the rounds, the server's CPU seconds per second of audio
(all streams), and the hypotheses that differ (goal: 0). ``--json`` writes the
figures.

Usage::

    python bench/serve_load.py exp/asr_multiblank/onnx egs/digits/asr1/data/test
    python bench/serve_load.py MODEL DATA --clients 16 --rounds 3 --realtime
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test" / "helpers"))

from live_server import live_server  # noqa: E402

from espnet_multiblank.runtime import ExportedModel, Recognizer, read_wav  # noqa: E402
from espnet_multiblank.runtime.serve import default_chunk_size  # noqa: E402
from espnet_multiblank.runtime.serve_client import send_samples  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_scp(data_dir: Path, count: int):
    utts = []
    for line in (data_dir / "wav.scp").read_text().splitlines()[:count]:
        key, path = line.split(maxsplit=1)
        samples, rate = read_wav(path)
        utts.append((key, samples, rate))
    return utts


async def one_round(url, utts, piece_ms, realtime):
    return await asyncio.gather(
        *(
            send_samples(url, x, rate, int(rate * piece_ms / 1000), realtime)
            for _, x, rate in utts
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("data_dir", help="a folder with wav.scp")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--piece_ms", type=float, default=100.0)
    p.add_argument("--chunk_size", type=int, default=None)
    p.add_argument("--realtime", action="store_true")
    p.add_argument("--json", default=None, help="write the figures there")
    args = p.parse_args()

    utts = read_scp(Path(args.data_dir), args.clients)
    model = ExportedModel(args.model_dir)
    chunk = args.chunk_size or default_chunk_size(model)
    offline = Recognizer(model, chunk_size=chunk)
    want = [offline.recognize(x, rate) for _, x, rate in utts]
    seconds = [x.size / rate for _, x, rate in utts]

    per_stream = [[] for _ in utts]
    cpu, wall, differ = [], [], 0
    serve_args = ["--chunk_size", str(chunk), "--max_clients", str(args.clients)]
    with live_server(args.model_dir, *serve_args) as srv:
        for _ in range(args.rounds):
            before, start = cpu_seconds(srv.proc.pid), time.perf_counter()
            sessions = asyncio.run(
                one_round(srv.ws_url, utts, args.piece_ms, args.realtime)
            )
            wall.append(time.perf_counter() - start)
            cpu.append((cpu_seconds(srv.proc.pid) - before) / sum(seconds))
            for i, (s, w) in enumerate(zip(sessions, want)):
                if s.error or s.text.split() != w.text.split():
                    differ += 1
                    print(f"{utts[i][0]}: {s.error or s.text!r} != {w.text!r}")
                if args.realtime:
                    per_stream[i].append(s.ended - s.done_sent)
                else:
                    per_stream[i].append((s.ended - s.started) / seconds[i])
    figure = "final latency (s)" if args.realtime else "real-time factor"
    medians = [statistics.median(v) for v in per_stream]
    print(
        f"{len(utts)} clients at once, {sum(seconds):.1f} s of audio per round, "
        f"{args.rounds} rounds, pieces of {args.piece_ms:g} ms, chunk {chunk} "
        f"frames, {'paced as a microphone' if args.realtime else 'as fast as read'}"
    )
    print(f"per stream, {figure} (median of the rounds):")
    for (key, _, _), m, s in zip(utts, medians, seconds):
        print(f"  {key}  {s:5.2f} s  {m:.3f}")
    print(
        f"{figure}: max {max(medians):.3f}, median {statistics.median(medians):.3f}; "
        f"server CPU seconds per audio second {statistics.median(cpu):.3f}; "
        f"round wall {statistics.median(wall):.2f} s; differing hypotheses "
        f"{differ} of {len(utts) * args.rounds}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "figure": figure,
                    "per_stream": dict(zip([u[0] for u in utts], medians)),
                    "server_cpu_per_audio_second": statistics.median(cpu),
                    "differing": differ,
                },
                indent=1,
            )
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
