"""Streams: audio in pieces, partial results as they come, the offline result at the
end (``chunk_conformer`` exports).

A :class:`Stream` holds one utterance's :class:`~.stream_encoder.StreamEncoder`,
the projected encoder frames so far and its search:

* greedy: a :class:`~.greedy.GreedyRun` that takes every step the frames received
  decide (the same steps as offline: :func:`~.greedy.step_run`); its partial result is
  the hypothesis so far and never changes what it has said;
* beam: the label-synchronous beam search needs the whole utterance (it sums over
  every alignment up to the last frame); its partial result is the beam search on
  the frames so far as if the utterance ended there (``partial_results=False``
  skips it), its final result the offline beam search on all frames.

Either way the final result equals :meth:`Recognizer.recognize
<espnet_multiblank.runtime.recognizer.Recognizer.recognize>` at the same chunk size
(``Recognizer(chunk_size=C)``), whatever the pieces. :meth:`Recognizer.
decode_streams` advances many streams together (one chunk-encoder call and one
search round for all of them).
"""

import time
from typing import Any, List, Optional

import numpy as np

from espnet_multiblank.runtime.audio import check_samples
from espnet_multiblank.runtime.result import Result, make_result
from espnet_multiblank.runtime.stream_encoder import StreamEncoder


class Stream:
    """One stream of a :class:`~espnet_multiblank.runtime.recognizer.Recognizer`
    (use :meth:`Recognizer.create_stream`).

    Args:
        recognizer: The :class:`~espnet_multiblank.runtime.recognizer.Recognizer`
            (its model, search and ``decode_streams``).
        chunk_size: Encoder frames per chunk.
        sample_rate: The sample rate of the pieces (None: the model's).
        partial_results: Beam search: compute a partial result after each chunk.
        key: A name for the stream's messages.

    Attributes:
        error: Why the stream was stopped (bad input), or None.
    """

    def __init__(
        self,
        recognizer: Any,
        chunk_size: int,
        sample_rate: Optional[int] = None,
        partial_results: bool = True,
        key: Optional[str] = None,
    ):
        self.recognizer = recognizer
        self.model = recognizer.model
        info = self.model.info
        if sample_rate is not None:
            check_samples(
                np.zeros(info.min_samples, np.float32),
                sample_rate,
                info.sample_rate,
                0,
                "stream" if key is None else f"stream {key}",
            )
        self.sample_rate = sample_rate
        self.key = key
        self.encoder = StreamEncoder(self.model, chunk_size)
        self.chunk_size = chunk_size
        self.frames = np.zeros((0, info.joint_space), np.float32)
        self.greedy = recognizer.search_name == "greedy"
        self.run = recognizer.search.start(1)[0] if self.greedy else None
        self.partial_results = bool(partial_results)
        self._result = Result(key=key)
        self.error: Optional[str] = None
        self._dirty = False
        self._counted = False

    @property
    def name(self) -> str:
        return "stream" if self.key is None else f"stream {self.key}"

    @property
    def is_final(self) -> bool:
        """The stream has ended and its final result is ready (or it failed)."""
        return self.error is not None or self.encoder.ended and not self._dirty

    @property
    def result(self) -> Result:
        """The partial result (the final one once :attr:`is_final`)."""
        return self._result

    def accept_waveform(self, samples, sample_rate=None, decode: bool = True) -> None:
        """Add a piece of (n,) float samples in [-1, 1] (n >= 0) and, with
        ``decode``, decode what it completes (several streams: ``decode=False``
        and :meth:`Recognizer.decode_streams`).

        Raises:
            ValueError: NaN / inf samples, several channels, another sample rate
                (the stream is stopped: :attr:`error`), or a stream that ended.
        """
        self._check_open()
        rate = self.sample_rate if sample_rate is None else sample_rate
        info = self.model.info
        try:
            if np.asarray(samples).size == 0:
                return
            x = check_samples(samples, rate, info.sample_rate, 0, self.name)
        except (ValueError, TypeError) as e:
            self.error = str(e)
            self._result = Result(key=self.key, error=self.error)
            raise
        self.encoder.accept(x)
        self._dirty = True
        if decode:
            self.recognizer.decode_streams([self])

    def input_finished(self, decode: bool = True) -> None:
        """No more samples: the rest is decoded (with ``decode``), the final result
        is ready. A stream shorter than the model's shortest input fails
        (:attr:`error`)."""
        self._check_open()
        self.encoder.finish()
        self._dirty = True
        if self.encoder.received < self.model.info.min_samples:
            secs = self.encoder.received / self.model.info.sample_rate
            self.error = (
                f"{self.name}: too short: {self.encoder.received} samples "
                f"({secs:.3f} s), the encoder needs at least "
                f"{self.model.info.min_samples}"
            )
            self._result = Result(key=self.key, error=self.error)
            return
        if decode:
            self.recognizer.decode_streams([self])

    def _check_open(self) -> None:
        if self.error is not None:
            raise ValueError(f"{self.name} was stopped: {self.error}")
        if self.encoder.final:
            raise ValueError(f"{self.name} has ended (input_finished was called)")


def decode_streams(recognizer: Any, streams: List[Stream]) -> None:
    """Advance every stream that has new samples (batched; see the module
    docstring); ``recognizer``'s search decodes them and its stats count them."""
    todo = [s for s in streams if s._dirty and s.error is None]
    if not todo:
        return
    stats = recognizer.stats
    start = time.perf_counter()
    new = StreamEncoder.run([s.encoder for s in todo])
    middle = time.perf_counter()
    for s, frames in zip(todo, new):
        if frames.shape[0]:
            s.frames = np.concatenate([s.frames, frames])
    greedy = [s for s in todo if s.greedy]
    if greedy:
        search = recognizer.search
        for final in (False, True):
            part = [s for s in greedy if s.encoder.ended == final]
            if part:
                search.advance(
                    [s.run for s in part],
                    [s.frames for s in part],
                    [s.frames.shape[0] for s in part],
                    final,
                )
        for s in greedy:
            n = s.frames.shape[0]
            if s.encoder.ended:
                s.run.resolve(n, search.rule)
            s._result = make_result(s.model, s.run, n, s.key)
    beams = [
        s
        for s in todo
        if not s.greedy and (s.encoder.ended or s.partial_results) and s.frames.shape[0]
    ]
    if beams:  # one batched beam search for all of them
        lens = np.array([s.frames.shape[0] for s in beams])
        enc = np.zeros((len(beams), int(lens.max()), beams[0].frames.shape[1]))
        for b, s in enumerate(beams):
            enc[b, : lens[b]] = s.frames
        hyps = recognizer.search.search(enc.astype(np.float32), lens)
        for s, hyp, n in zip(beams, hyps, lens):
            s._result = make_result(s.model, hyp, int(n), s.key)
    for s in todo:
        s._dirty = False
        if s.encoder.ended and not s._counted:
            s._counted = True
            stats.utterances += 1
            stats.audio_seconds += s.encoder.received / s.model.info.sample_rate
            stats.frames += s.frames.shape[0]
            stats.frames_skipped += s._result.frames_skipped
    stats.encode_seconds += middle - start
    stats.search_seconds += time.perf_counter() - middle
