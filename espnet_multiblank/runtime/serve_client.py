"""A Python client of the live server (:mod:`.serve`): wav files through the
WebSocket protocol, as the page sends the microphone.

::

    python -m espnet_multiblank.runtime.serve_client --url ws://127.0.0.1:6006/ws \\
        a.wav b.wav [--piece_ms 100] [--realtime]

prints each file's final text (the segments' final texts, joined). From Python,
:func:`send_samples` returns every message and the times (the load test and
``bench/serve_load.py`` use it). Needs ``websockets``; imports no torch or ESPnet.
"""

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from espnet_multiblank.runtime.audio import read_wav


@dataclass
class Session:
    """What one client sent and received.

    Attributes:
        messages: The server's JSON messages, in order.
        close_code: The code the server closed with.
        started: ``time.perf_counter()`` when the first piece was sent.
        done_sent: When ``Done`` was sent.
        ended: When the connection closed (after the final result).
    """

    messages: List[dict] = field(default_factory=list)
    close_code: Optional[int] = None
    started: float = 0.0
    done_sent: float = 0.0
    ended: float = 0.0

    @property
    def finals(self) -> List[dict]:
        """The final result of each segment."""
        return [m for m in self.messages if m.get("is_final")]

    @property
    def text(self) -> str:
        return " ".join(m["text"] for m in self.finals if m["text"])

    @property
    def error(self) -> Optional[str]:
        return next((m["error"] for m in self.messages if "error" in m), None)


async def send_samples(
    url: str,
    samples: np.ndarray,
    sample_rate: Optional[int] = None,
    piece: int = 800,
    realtime: bool = False,
    open_timeout: float = 30.0,
) -> Session:
    """Send (L,) float32 samples in pieces of ``piece`` samples, then ``Done``; read
    every reply until the server closes.

    Args:
        url: ``ws://HOST:PORT/ws``.
        samples: The audio, float32 in [-1, 1] at the model's rate.
        sample_rate: Sent first as ``{"sample_rate": N}`` (None: not sent).
        piece: Samples per binary message.
        realtime: Send a piece every ``piece / sample_rate`` seconds (as a
            microphone does; needs ``sample_rate``); else as fast as the server
            reads them.
    """
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    if realtime and not sample_rate:
        raise ValueError("realtime needs the sample_rate")
    session = Session()
    data = np.asarray(samples, "<f4")
    async with connect(url, max_size=None, open_timeout=open_timeout) as ws:

        async def read():
            try:
                async for message in ws:
                    session.messages.append(json.loads(message))
            except ConnectionClosed:
                pass

        reader = asyncio.create_task(read())
        try:
            if sample_rate:
                await ws.send(json.dumps({"sample_rate": sample_rate}))
            session.started = time.perf_counter()
            for i, start in enumerate(range(0, data.size, piece)):
                if realtime:
                    due = session.started + i * piece / sample_rate
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await ws.send(data[start : start + piece].tobytes())
            await ws.send("Done")
            session.done_sent = time.perf_counter()
        except ConnectionClosed:  # the server closed it (an error message came)
            pass
        await reader
        session.ended = time.perf_counter()
        session.close_code = ws.close_code
    return session


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wavs", nargs="+")
    p.add_argument("--url", default="ws://127.0.0.1:6006/ws")
    p.add_argument("--piece_ms", type=float, default=100.0)
    p.add_argument("--realtime", action="store_true", help="pace pieces as a mic")
    args = p.parse_args(argv)
    status = 0
    for path in args.wavs:
        samples, rate = read_wav(path)
        session = asyncio.run(
            send_samples(
                args.url,
                samples,
                rate,
                max(1, int(rate * args.piece_ms / 1000)),
                args.realtime,
            )
        )
        if session.error:
            print(f"{path}: error: {session.error}", file=sys.stderr)
            status = 1
        else:
            print(f"{path}\t{session.text}")
    return status


if __name__ == "__main__":
    sys.exit(main())
