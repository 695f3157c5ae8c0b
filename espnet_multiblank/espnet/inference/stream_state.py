"""One stream of a :class:`~espnet_multiblank.espnet.inference.stream_decoder.
StreamingDecoder`: what it keeps between pieces and what it answers.

* :class:`StreamResult`: what :meth:`StreamingDecoder.feed` answers for a stream.
* :class:`StreamState`: an open stream: its row in the streaming search, its
  encoder (:class:`~espnet_multiblank.espnet.inference.stream_encoder.
  StreamEncoder`), the samples received, its last partial hypothesis, and the
  history of its partial hypotheses from which a final result's emission times come
  (:meth:`StreamState.emission_times`).
"""

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Tuple

if TYPE_CHECKING:  # its module imports ESPnet's front ends
    from espnet_multiblank.espnet.inference.stream_encoder import StreamEncoder


class StreamResult(NamedTuple):
    """What :meth:`StreamingDecoder.feed` answers for one stream.

    Attributes:
        key: The stream.
        results: ESPnet's ``[(text, token, token_int, hyp)]``: the partial
            hypothesis (one entry) or, once the stream ended, the n-best list.
        is_final: The stream has ended (with ``results`` or an ``error``).
        error: Why the stream could not be decoded (it has ended), or None.
        emitted: For a final result: per label of the best hypothesis, the audio
            (seconds) received when it first appeared for good in the partial
            hypotheses; ``committed``: when it was decided.
        committed: See ``emitted``.
    """

    key: str
    results: List[Tuple]
    is_final: bool
    error: Optional[str] = None
    emitted: Optional[List[float]] = None
    committed: Optional[List[float]] = None


@dataclass
class StreamState:
    """An open stream.

    Attributes:
        key: Its name.
        slot: Its row in the streaming search.
        encoder: Its features and encoder chunks.
        rate: Its sample rate (None: not known).
        samples: Samples received.
        history: ``(audio seconds received, partial labels, decided label count)``
            whenever they changed (:meth:`record`).
        fresh: Encoder frames arrived since the last partial hypothesis.
        partial: That hypothesis: (labels, decided label count, ESPnet's results).
    """

    key: str
    slot: int
    encoder: "StreamEncoder"
    rate: Optional[int]
    samples: int = 0
    history: List[Tuple[float, List[int], int]] = field(default_factory=list)
    fresh: bool = False
    partial: Optional[Tuple[List[int], int, List[Tuple]]] = None

    def record(self, seconds: float, labels: List[int], decided: int) -> None:
        """The partial hypothesis after ``seconds`` of audio, kept if it changed."""
        if not self.history or self.history[-1][1:] != (labels, decided):
            self.history.append((seconds, labels, decided))

    def emission_times(
        self, seconds: float, final: List[int]
    ) -> Tuple[List[float], List[float]]:
        """The final hypothesis after ``seconds`` of audio (kept last in the
        history), and per label of it (``final``: its labels): the audio received
        (seconds) from which on every partial hypothesis held it (with the labels
        before it), and when it was decided."""
        self.history.append((seconds, final, len(final)))
        emitted = [math.inf] * len(final)
        committed = [math.inf] * len(final)
        stable = len(final)  # labels held by every partial from here to the end
        for at, labels, decided in reversed(self.history):
            same = 0
            while same < min(len(labels), len(final)) and labels[same] == final[same]:
                same += 1
            stable = min(stable, same)
            for i in range(stable):
                emitted[i] = at
            for i in range(min(decided, len(final))):
                committed[i] = at
        return emitted, committed
