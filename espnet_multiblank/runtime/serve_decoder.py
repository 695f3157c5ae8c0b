"""The live server's decoding: every client's stream advanced in batched rounds.

One :class:`Session` per connection holds its current segment's
:class:`~espnet_multiblank.runtime.stream.Stream`. :meth:`Decoder.round` takes one
item (a piece of samples, or the end) of each client that has one, feeds them to
their streams, decodes all of them together (:meth:`Recognizer.decode_streams
<espnet_multiblank.runtime.recognizer.Recognizer.decode_streams>`: one chunk-encoder
call and one search round per step for all clients) and returns one reply per item.
ONNX Runtime's calls are not async and this machine's cores are few: one thread runs
the rounds, and the more clients have audio waiting, the larger each round's batch.

Segments: a segment ends (its result is final, ``is_final``) when the client sends
``Done``, when the search has decided ``endpoint_seconds`` of frames since the last
label (or since the segment's start), or when the segment reaches
``max_segment_seconds``; the next piece starts a new stream. A segment's final result
is the offline decoding of the segment's samples at the same chunk size (the
stream's guarantee). A segment shorter than the encoder's shortest input ends with
an empty result.

Nothing here imports torch or ESPnet.
"""

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import List, Optional, Tuple, Union

import numpy as np

from espnet_multiblank.runtime.greedy import GreedyRun
from espnet_multiblank.runtime.recognizer import Recognizer
from espnet_multiblank.runtime.result import Result
from espnet_multiblank.runtime.serve_protocol import result_message

log = logging.getLogger(__name__)

#: what a session queues for the decoder: a piece of samples, or the end
END = "end"
Item = Union[np.ndarray, str]


@dataclass
class SkipRun(GreedyRun):
    """A :class:`~espnet_multiblank.runtime.greedy.GreedyRun` that also records
    where it jumped: ``jumps`` holds ``(frame, frames)`` of each arc over more than
    one frame (a big blank, a TDT duration >= 2), for the page's strip of skipped
    frames."""

    jumps: List[Tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, run: GreedyRun) -> "SkipRun":
        return cls(**{f.name: getattr(run, f.name) for f in fields(run)})

    def take(self, step, score=None) -> None:
        t = self.frame
        super().take(step, score)
        if step.frames > 1:
            self.jumps.append((t, step.frames))


@dataclass(eq=False)  # compared and hashed by identity
class Session:
    """One client: its segments and the samples of the current one.

    Attributes:
        number: The connection's number (log lines, saved audio).
        segment: The current segment's index.
        stream: The current segment's stream (None until its first samples).
        samples: Samples of the current segment.
        pieces: The current segment's samples, kept when audio is saved.
        closed: The client is gone or failed: its items are dropped.
    """

    number: int
    segment: int = 0
    stream: Optional[object] = None
    samples: int = 0
    pieces: List[np.ndarray] = field(default_factory=list)
    closed: bool = False

    @property
    def name(self) -> str:
        return f"client {self.number}"


class Decoder:
    """Rounds of batched decoding for many sessions (module docstring).

    Args:
        recognizer: The recognizer (its search; streaming model).
        chunk_size: Encoder frames per chunk of every stream.
        endpoint_seconds: Decided seconds without a label that end a segment (0:
            never).
        max_segment_seconds: The longest segment.
        save_audio_dir: Where each segment's samples are saved (``<client>-<segment>
            .npy``, float32; None: not saved): what the server heard, to check or
            replay.
    """

    def __init__(
        self,
        recognizer: Recognizer,
        chunk_size: int,
        endpoint_seconds: float = 2.0,
        max_segment_seconds: float = 60.0,
        save_audio_dir=None,
    ):
        if endpoint_seconds < 0 or not max_segment_seconds > 0:
            raise ValueError(
                f"endpoint_seconds must be >= 0 and max_segment_seconds > 0, got "
                f"{endpoint_seconds} and {max_segment_seconds}"
            )
        self.recognizer = recognizer
        self.model = recognizer.model
        self.chunk_size = chunk_size
        info = self.model.info
        self.rate = info.sample_rate
        shift = self.model.frame_shift
        self.endpoint_frames = (
            round(endpoint_seconds / shift) if endpoint_seconds else 0
        )
        self.max_segment_samples = int(max_segment_seconds * self.rate)
        self.save_audio_dir = Path(save_audio_dir) if save_audio_dir else None
        if self.save_audio_dir:
            self.save_audio_dir.mkdir(parents=True, exist_ok=True)

    def round(self, work: List[Tuple[Session, Item]]) -> List[Tuple[Session, str]]:
        """Decode one item per session, all together.

        Returns:
            ``(session, JSON text)`` replies, one per item, in the order of
            ``work`` (a segment that ends gives its final result).
        """
        ending = []
        for session, item in work:
            if isinstance(item, str):
                ending.append(session)
                if session.stream is not None:
                    self._finish(session)
                continue
            if not item.size:
                continue
            if session.stream is None:
                session.stream = self._new_stream(session)
            session.stream.accept_waveform(item, decode=False)
            session.samples += item.size
            if self.save_audio_dir:
                session.pieces.append(item)
        live = [s.stream for s, _ in work if s.stream is not None]
        self.recognizer.decode_streams(live)
        ended = [
            s for s, item in work if s.stream is not None and self._endpoint(s, item)
        ]
        for s in ended:
            self._finish(s)
        self.recognizer.decode_streams([s.stream for s in ended])
        replies = []
        for session, item in work:
            final = isinstance(item, str) or session in ended
            replies.append((session, self._reply(session, final)))
            if final:
                self._next_segment(session)
        return replies

    def _new_stream(self, session: Session):
        stream = self.recognizer.create_stream(
            self.chunk_size, key=f"{session.number}-{session.segment}"
        )
        if stream.greedy:
            stream.run = SkipRun.of(stream.run)
        return stream

    def _endpoint(self, session: Session, item: Item) -> bool:
        """The segment ends after this piece (not after ``Done``: that ends it
        anyway)."""
        if isinstance(item, str) or session.stream.encoder.final:
            return False
        if session.samples >= self.max_segment_samples:
            return True
        if not self.endpoint_frames:
            return False
        result = session.stream.result
        last = result.frames[-1] + 1 if result.frames else 0
        return self._decided(session) - last >= self.endpoint_frames

    def _finish(self, session: Session) -> None:
        stream = session.stream
        if stream.encoder.received >= self.model.info.min_samples:
            stream.input_finished(decode=False)

    def _decided(self, session: Session) -> int:
        stream = session.stream
        if stream is None:
            return 0
        if stream.greedy:
            return stream.run.frame
        return stream.result.num_frames

    def _reply(self, session: Session, final: bool) -> str:
        stream = session.stream
        if stream is None or final and not stream.encoder.final:
            # no samples yet, or a segment too short for the encoder
            result, decided, jumps = Result(), 0, []
        else:
            result, decided = stream.result, self._decided(session)
            jumps = stream.run.jumps if stream.greedy else []
        return result_message(
            result, session.segment, final, session.samples, decided, jumps
        )

    def _next_segment(self, session: Session) -> None:
        if self.save_audio_dir and session.samples:
            name = f"{session.number}-{session.segment}.npy"
            np.save(self.save_audio_dir / name, np.concatenate(session.pieces))
        if session.stream is not None and session.stream.error:
            log.warning("%s: %s", session.name, session.stream.error)
        session.segment += 1
        session.stream = None
        session.samples = 0
        session.pieces = []
