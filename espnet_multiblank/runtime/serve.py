"""A live page: a WebSocket server on the runtime's streams, and a page that sends
the microphone to it.

::

    python -m espnet_multiblank.runtime.serve --model_dir exp/asr_multiblank/onnx
    # then open http://127.0.0.1:6006/ in a browser

Routes: ``/`` the page (``web/``: HTML, its script, an AudioWorklet), ``/info`` the
model's JSON description (sample rate, lattice, chunk, limits), ``/ws`` the
WebSocket endpoint (:mod:`.serve_protocol`). Clients' streams are decoded together in
batched rounds by one thread (:mod:`.serve_decoder`); the event loop only reads,
checks and writes messages. A client that breaks the protocol gets an error message
and is closed; nothing a client sends stops the server or the other clients.

Needs ``websockets`` (``pip install 'espnet-multiblank[serve]'``); imports no torch
or ESPnet.
"""

import argparse
import asyncio
import json
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import List, Optional

from espnet_multiblank.runtime.extras import needs_extra
from espnet_multiblank.runtime.model import ExportedModel
from espnet_multiblank.runtime.recognizer import Recognizer
from espnet_multiblank.runtime.serve_decoder import END, Decoder, Session
from espnet_multiblank.runtime.serve_protocol import (
    DONE,
    TRY_AGAIN_LATER,
    Limits,
    ProtocolError,
    error_message,
    parse_config,
    parse_piece,
    unexpected_text,
)

log = logging.getLogger("espnet_multiblank.serve")

#: how long a client that sent ``Done`` waits for its final result at most (a bug
#: past that: the decoder answers within a round)
FINAL_WAIT_SECONDS = 60

#: the page's files (package data in espnet_multiblank/runtime/web) by route
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/recorder.js": ("recorder.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


def _import_websockets():
    with needs_extra("the live server needs websockets >= 14", "serve"):
        from websockets.asyncio.server import serve
        from websockets.datastructures import Headers
        from websockets.exceptions import ConnectionClosed
        from websockets.http11 import Response
    return serve, Headers, ConnectionClosed, Response


def default_chunk_size(model: ExportedModel) -> int:
    """The model's ``decoding_chunk_size``, else 16 encoder frames (as
    :meth:`Recognizer.create_stream`)."""
    return model.info.chunk.get("decoding_chunk_size") or 16


class Client:
    """A connection: its session, the items it sent that wait for the decoder
    (``inbox``, bounded: a full inbox stops the reading of its socket), the replies
    that wait to be sent (``out``), and ``done``, set when its final result is
    out."""

    def __init__(self, ws, session: Session, max_pending: int):
        self.ws = ws
        self.session = session
        self.inbox: asyncio.Queue = asyncio.Queue(max_pending)
        self.out: asyncio.Queue = asyncio.Queue()
        self.done = asyncio.Event()

    @property
    def name(self) -> str:
        return self.session.name


class LiveServer:
    """The server's state: the decoder, the sessions, the page's files.

    Args:
        recognizer: A recognizer of a streaming model whose ``chunk_size`` is the
            streams' (its offline decoding is what a segment's final result equals).
        limits: What each client may do.
        endpoint_seconds, max_segment_seconds, save_audio_dir: See
            :class:`~espnet_multiblank.runtime.serve_decoder.Decoder`.
    """

    def __init__(
        self,
        recognizer: Recognizer,
        limits: Limits = Limits(),
        endpoint_seconds: float = 2.0,
        max_segment_seconds: float = 60.0,
        save_audio_dir=None,
    ):
        info = recognizer.model.info
        if not info.streaming:
            raise ValueError(
                f"the live server needs a streaming model (chunk_conformer); this "
                f"export's encoder is {info.encoder_type}"
            )
        self.serve, self.Headers, self.ConnectionClosed, self.Response = (
            _import_websockets()
        )
        self.recognizer = recognizer
        self.chunk_size = recognizer.chunk_size or default_chunk_size(recognizer.model)
        self.limits = limits
        self.rate = info.sample_rate
        self.decoder = Decoder(
            recognizer,
            self.chunk_size,
            endpoint_seconds,
            max_segment_seconds,
            save_audio_dir,
        )
        self.info = {
            "sample_rate": self.rate,
            "lattice": info.lattice,
            "big_blank_durations": list(info.big_blank_durations),
            "tdt_durations": list(info.tdt_durations),
            "token_type": info.token_type,
            "frame_shift": recognizer.model.frame_shift,
            "chunk_size": self.chunk_size,
            "search": recognizer.search_name,
            "max_piece_samples": limits.max_piece_samples,
            "idle_seconds": limits.idle_seconds,
            "endpoint_seconds": endpoint_seconds,
            "max_segment_seconds": max_segment_seconds,
        }
        self.clients: List[Client] = []
        self.count = 0
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="decode")
        self.wakeup: Optional[asyncio.Event] = None

    # ------------------------------------------------------------------ HTTP
    def process_request(self, connection, request):
        """The page's files and ``/info`` (None: ``/ws``, the WebSocket
        handshake goes on)."""
        path = request.path.split("?", 1)[0]
        if path == "/ws":
            return None
        if path == "/info":
            body, ctype = json.dumps(self.info).encode(), "application/json"
        elif path in STATIC:
            name, ctype = STATIC[path]
            web = resources.files("espnet_multiblank.runtime") / "web"
            body = (web / name).read_bytes()
        else:
            return connection.respond(404, f"no such page: {path}\n")
        headers = self.Headers(
            [
                ("Content-Type", ctype),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-cache"),
                ("Connection", "close"),
            ]
        )
        return self.Response(200, "OK", headers, body)

    # ------------------------------------------------------------- clients
    async def handle(self, ws) -> None:
        """One connection, from its first message to its close."""
        client = Client(ws, Session(self.count), self.limits.max_pending_pieces)
        self.count += 1
        sender = asyncio.create_task(self._send_loop(client))
        close = (1000, "done")
        try:
            if len(self.clients) >= self.limits.max_clients:
                raise ProtocolError(
                    f"the server is full ({self.limits.max_clients} clients): try "
                    "again later",
                    TRY_AGAIN_LATER,
                )
            self.clients.append(client)
            log.info("%s connected", client.name)
            await self._receive(client)
            await asyncio.wait_for(client.done.wait(), FINAL_WAIT_SECONDS)
        except ProtocolError as e:
            log.info("%s: %s", client.name, e)
            close = (e.code, "protocol error")
            client.out.put_nowait(error_message(str(e)))
        except self.ConnectionClosed:
            close = None
        except asyncio.TimeoutError:  # the final result did not come: a bug
            log.error("%s: no final result after %d s", client.name, FINAL_WAIT_SECONDS)
            close = (1011, "internal error")
            client.out.put_nowait(error_message(f"{client.name}: internal error"))
        finally:
            client.session.closed = True
            if client in self.clients:
                self.clients.remove(client)
            client.out.put_nowait(close)
            try:
                await asyncio.wait_for(sender, self.limits.idle_seconds)
            except asyncio.TimeoutError:  # a client that reads nothing
                await ws.close(1008, "replies not read")
            except self.ConnectionClosed:
                pass
            log.info("%s closed (%s)", client.name, close and close[0])

    async def _receive(self, client: "Client") -> None:
        """Read the client's messages into its inbox until ``Done``."""
        name, first = client.name, True
        while True:
            try:
                message = await asyncio.wait_for(
                    client.ws.recv(), self.limits.idle_seconds
                )
            except asyncio.TimeoutError:
                raise ProtocolError(
                    f"{name}: nothing received for {self.limits.idle_seconds:g} s: "
                    f'send audio pieces, then "{DONE}"'
                ) from None
            if isinstance(message, str):
                if message == DONE:
                    await client.inbox.put(END)
                    self.wakeup.set()
                    return
                if not first:
                    raise unexpected_text(message, name)
                parse_config(message, self.rate, name)
            else:
                await client.inbox.put(
                    parse_piece(message, self.limits, self.rate, name)
                )
                self.wakeup.set()
            first = False

    @staticmethod
    async def _send_loop(client: "Client") -> None:
        """Send the client's replies in order; a tuple closes the connection with
        that (code, reason), None ends without closing."""
        while True:
            item = await client.out.get()
            if item is None:
                return
            if isinstance(item, tuple):
                await client.ws.close(*item)
                return
            await client.ws.send(item)

    def _deliver(self, client: "Client", message: str) -> None:
        if client.session.closed:
            return
        if client.out.qsize() >= self.limits.max_unsent_replies:
            # the client does not read: close it (its handler ends on the close)
            client.session.closed = True
            client.out.put_nowait(
                error_message(
                    f"{client.name}: {client.out.qsize()} replies not read: a "
                    "client must read its results"
                )
            )
            client.out.put_nowait((1008, "replies not read"))
            return
        client.out.put_nowait(message)

    # ------------------------------------------------------------ decoding
    async def decode_loop(self) -> None:
        """Rounds of one item per waiting client (:meth:`Decoder.round`)."""
        loop = asyncio.get_running_loop()
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            clients = [
                c for c in self.clients if not c.session.closed and not c.inbox.empty()
            ]
            work = [(c.session, c.inbox.get_nowait()) for c in clients]
            if not work:
                continue
            try:
                replies = await loop.run_in_executor(
                    self.executor, self.decoder.round, work
                )
            except Exception as e:  # a bug, not a client: keep serving the others
                log.exception("decoding failed")
                replies = [
                    (s, error_message(f"{s.name}: internal error: {e}"))
                    for s, _ in work
                ]
                for c in clients:
                    c.session.stream = None
                    c.out.put_nowait((1011, "internal error"))
            for client, (_, item), (_, message) in zip(clients, work, replies):
                self._deliver(client, message)
                if item is END:
                    client.done.set()
            if any(not c.inbox.empty() for c in self.clients):
                self.wakeup.set()

    async def run(self, host: str, port: int, ready=None) -> None:
        """Serve until cancelled (SIGINT / SIGTERM from :func:`main`).

        Args:
            ready: Called with the bound port once the server listens.
        """
        self.wakeup = asyncio.Event()
        decoding = asyncio.create_task(self.decode_loop())
        async with self.serve(
            self.handle,
            host,
            port,
            process_request=self.process_request,
            max_size=self.limits.max_message_bytes,
            max_queue=4,
        ) as server:
            bound = server.sockets[0].getsockname()[1]
            if ready is not None:
                ready(bound)
            try:
                await asyncio.Future()
            finally:
                decoding.cancel()
                self.executor.shutdown(wait=False)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model_dir", required=True, help="an exported chunk_conformer")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=6006, help="0: any free port")
    p.add_argument(
        "--chunk_size",
        type=int,
        default=None,
        help="encoder frames per chunk (default: the model's decoding_chunk_size, "
        "else 16)",
    )
    p.add_argument("--search", choices=["greedy", "beam"], default="greedy")
    p.add_argument("--beam_size", type=int, default=4)
    p.add_argument(
        "--num_threads", type=int, default=1, help="ONNX Runtime threads per graph"
    )
    p.add_argument("--max_clients", type=int, default=32)
    p.add_argument(
        "--max_piece_seconds",
        type=float,
        default=2.0,
        help="the longest piece a client may send",
    )
    p.add_argument(
        "--idle_seconds",
        type=float,
        default=10.0,
        help="a client that sends nothing this long is closed",
    )
    p.add_argument(
        "--endpoint_seconds",
        type=float,
        default=2.0,
        help="decided seconds without a word that end a segment (0: never)",
    )
    p.add_argument("--max_segment_seconds", type=float, default=60.0)
    p.add_argument(
        "--save_audio_dir",
        default=None,
        help="save each segment's samples there (<client>-<segment>.npy)",
    )
    p.add_argument("--log_level", default="INFO")
    return p


def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # one line per HTTP request and connection is the server's own log's job
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        model = ExportedModel(args.model_dir, args.num_threads)
        chunk = args.chunk_size or default_chunk_size(model)
        recognizer = Recognizer(
            model, search=args.search, beam_size=args.beam_size, chunk_size=chunk
        )
        rate = recognizer.sample_rate
        limits = Limits(
            max_piece_samples=max(1, int(args.max_piece_seconds * rate)),
            idle_seconds=args.idle_seconds,
            max_clients=args.max_clients,
        )
        server = LiveServer(
            recognizer,
            limits,
            args.endpoint_seconds,
            args.max_segment_seconds,
            args.save_audio_dir,
        )
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2

    def ready(port: int) -> None:
        print(
            f"serving http://{args.host}:{port}/ (WebSocket ws://{args.host}:{port}"
            f"/ws; model {args.model_dir}, chunk {chunk} frames)",
            flush=True,
        )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        await server.run(args.host, args.port, ready)

    try:
        asyncio.run(run())
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    except OSError as e:  # the port is taken, the host unknown
        print(f"serve: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
