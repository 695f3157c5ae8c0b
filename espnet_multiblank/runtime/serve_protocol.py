"""The live server's WebSocket protocol: what a client may send, what it gets back.

A client connects to ``ws://HOST:PORT/ws`` and sends

1. optionally, first, the text ``{"sample_rate": N}`` (N must be the model's rate:
   the server does not resample; the page resamples the microphone);
2. binary messages: pieces of float32 little-endian mono samples in [-1, 1], each at
   most :attr:`Limits.max_piece_samples`;
3. the text ``Done``: the audio has ended.

After each piece the server sends one JSON result (:func:`result_message`), and after
``Done`` the final one (``"is_final": true``), then closes the connection. Anything
else (another text, invalid JSON, NaN or infinite samples, a piece over the limit or
of a length that is not a multiple of 4 bytes, nothing for
:attr:`Limits.idle_seconds`) gets ``{"error": "..."}`` and the connection is closed
(:class:`ProtocolError`). docs/deploy.md ("A live page") documents it for clients.

Nothing here imports torch or ESPnet.
"""

import json
from dataclasses import dataclass
from typing import Optional

import numpy as np

from espnet_multiblank.runtime.audio import check_samples

#: the text that ends a client's audio
DONE = "Done"

#: WebSocket close codes (RFC 6455): a client that broke the protocol, a piece over
#: the size limit, a server that is full
POLICY_VIOLATION, MESSAGE_TOO_BIG, TRY_AGAIN_LATER = 1008, 1009, 1013


class ProtocolError(Exception):
    """A client's message broke the protocol: the text is sent to the client as
    ``{"error": text}`` and the connection is closed with ``code``."""

    def __init__(self, text: str, code: int = POLICY_VIOLATION):
        super().__init__(text)
        self.code = code


@dataclass(frozen=True)
class Limits:
    """What one client may do.

    Attributes:
        max_piece_samples: The largest piece, in samples.
        idle_seconds: The longest wait for a client's next message.
        max_clients: Connections served at once (more get an error).
        max_pending_pieces: Pieces received but not yet decoded per client; past
            that the server stops reading the client's socket until it catches up
            (back-pressure, not an error).
        max_unsent_replies: Replies a client has not read; past that the client is
            closed (it does not read its results).
    """

    max_piece_samples: int = 16000
    idle_seconds: float = 10.0
    max_clients: int = 32
    max_pending_pieces: int = 32
    max_unsent_replies: int = 256

    def __post_init__(self):
        for name in ("max_piece_samples", "max_clients", "max_pending_pieces"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not self.idle_seconds > 0:
            raise ValueError(f"idle_seconds must be > 0, got {self.idle_seconds!r}")

    @property
    def max_message_bytes(self) -> int:
        """The frame size above which the WebSocket library itself closes the
        connection (code 1009): twice the largest piece, so that a piece just over
        the limit still gets this module's message."""
        return 8 * self.max_piece_samples + 1024


def parse_config(text: str, model_rate: int, name: str) -> Optional[int]:
    """The sample rate of a client's first text message ``{"sample_rate": N}``.

    Raises:
        ProtocolError: Invalid JSON, not an object, keys other than
            ``sample_rate``, or a rate other than the model's (the runtime's
            message).
    """
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ProtocolError(
            f"{name}: the first text message is not valid JSON ({e}): send "
            f'{{"sample_rate": {model_rate}}}, binary float32 pieces, or "{DONE}"'
        ) from None
    if not isinstance(config, dict):
        raise ProtocolError(
            f"{name}: the first text message must be a JSON object such as "
            f'{{"sample_rate": {model_rate}}}, got {type(config).__name__}'
        )
    unknown = sorted(set(config) - {"sample_rate"})
    if unknown:
        raise ProtocolError(
            f"{name}: unknown keys {unknown} in the first message (the only one is "
            "sample_rate)"
        )
    rate = config.get("sample_rate")
    if rate is None:
        return None
    try:
        check_samples(np.zeros(1, np.float32), rate, model_rate, 0, name)
    except (ValueError, TypeError) as e:
        raise ProtocolError(str(e)) from None
    return int(rate)


def parse_piece(data: bytes, limits: Limits, model_rate: int, name: str) -> np.ndarray:
    """(n,) float32 samples of a binary message (n >= 0).

    Raises:
        ProtocolError: A length that is not a multiple of 4 bytes, more than
            ``limits.max_piece_samples`` samples (code 1009), NaN or infinite
            samples.
    """
    if len(data) % 4:
        raise ProtocolError(
            f"{name}: a binary message of {len(data)} bytes: pieces are float32 "
            "samples (4 bytes each, little-endian)"
        )
    n = len(data) // 4
    if n > limits.max_piece_samples:
        raise ProtocolError(
            f"{name}: a piece of {n} samples ({n / model_rate:.3f} s), the limit is "
            f"{limits.max_piece_samples} ({limits.max_piece_samples / model_rate:.3f}"
            " s): send smaller pieces",
            MESSAGE_TOO_BIG,
        )
    x = np.frombuffer(data, "<f4").astype(np.float32)
    if n:
        try:
            x = check_samples(x, None, model_rate, 0, name)
        except (ValueError, TypeError) as e:
            raise ProtocolError(str(e)) from None
    return x


def unexpected_text(text: str, name: str) -> ProtocolError:
    """The error for a text message that is neither the first message nor
    ``Done``."""
    shown = text if len(text) <= 40 else text[:40] + "..."
    return ProtocolError(
        f"{name}: unexpected text message {shown!r}: after the optional first "
        f'{{"sample_rate": N}} send binary float32 pieces, then "{DONE}"'
    )


def result_message(
    result,
    segment: int,
    is_final: bool,
    samples: int,
    decided: int,
    skips,
) -> str:
    """The JSON text of a result.

    Args:
        result: The stream's :class:`~espnet_multiblank.runtime.result.Result`.
        segment: The segment's index in the connection (0, 1, ...).
        is_final: The segment has ended: its result will not change.
        samples: Samples of the segment received.
        decided: Encoder frames the search has decided (the rest wait for more
            audio).
        skips: ``[frame, frames]`` of each arc over more than one frame: frames
            ``frame + 1 .. frame + frames - 1`` were never evaluated.
    """
    return json.dumps(
        {
            "text": result.text,
            "tokens": result.tokens,
            "timestamps": result.timestamps,
            "is_final": bool(is_final),
            "segment": int(segment),
            "frames_skipped": result.frames_skipped,
            "num_frames": result.num_frames,
            "decided": int(decided),
            "skips": [[int(t), int(d)] for t, d in skips],
            "samples": int(samples),
        }
    )


def error_message(text: str) -> str:
    return json.dumps({"error": text})
