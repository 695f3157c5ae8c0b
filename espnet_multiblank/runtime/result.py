"""What the runtime's searches give back: a decoded utterance's :class:`Result`, and
the :class:`DecodingStats` of a :class:`~espnet_multiblank.runtime.recognizer.
Recognizer` (offline and streaming alike).

Nothing here imports torch or ESPnet.
"""

from dataclasses import asdict, dataclass, field
from typing import List, Optional

from espnet_multiblank.runtime.model import ExportedModel


@dataclass
class Result:
    """A decoded utterance.

    Attributes:
        text: The words.
        tokens: The tokens of the hypothesis.
        token_ids: Their ids in ``tokens.txt``.
        frames: Per token, the encoder frame at which it was emitted.
        timestamps: Per token, that frame's start in seconds.
        durations: Per token, the frames its arc covers (a TDT label's duration;
            0 for standard and multi-blank labels).
        num_frames: Encoder frames of the utterance (received so far, streaming).
        frames_skipped: Frames no step of the search read, thanks to big blanks or
            durations (the plug-in's ``frames_skipped``).
        big_blank_emissions: Blank arcs over more than one frame.
        score: The hypothesis's score (greedy: the sum of its steps' scores; beam:
            log P(y | x) summed over its alignments).
        key: The utterance's name, when given.
        error: Why it was not decoded (then ``text`` is empty), or None.
    """

    text: str = ""
    tokens: List[str] = field(default_factory=list)
    token_ids: List[int] = field(default_factory=list)
    frames: List[int] = field(default_factory=list)
    timestamps: List[float] = field(default_factory=list)
    durations: List[int] = field(default_factory=list)
    num_frames: int = 0
    frames_skipped: int = 0
    big_blank_emissions: int = 0
    score: float = 0.0
    key: Optional[str] = None
    error: Optional[str] = None


@dataclass
class DecodingStats:
    """What a :class:`~espnet_multiblank.runtime.recognizer.Recognizer` has decoded so
    far (``decoding_stats.json``).

    Attributes:
        utterances: Utterances (or streams) decoded.
        audio_seconds: Their audio.
        encode_seconds: Wall time in the encoder graphs (front end included).
        search_seconds: Wall time in the searches (prediction and joint graphs
            included).
        frames: Encoder frames.
        frames_skipped: Frames the searches skipped (big blanks, durations).
    """

    utterances: int = 0
    audio_seconds: float = 0.0
    encode_seconds: float = 0.0
    search_seconds: float = 0.0
    frames: int = 0
    frames_skipped: int = 0

    def as_dict(self) -> dict:
        out = asdict(self)
        total = self.encode_seconds + self.search_seconds
        out["real_time_factor"] = (
            total / self.audio_seconds if self.audio_seconds else None
        )
        out["frames_skipped_fraction"] = (
            self.frames_skipped / self.frames if self.frames else None
        )
        return out


def make_result(model: ExportedModel, hyp, num_frames: int, key=None) -> Result:
    """A :class:`Result` of a search's hypothesis (labels, timing, counters)."""
    labels = [int(k) for k in hyp.labels]
    frames = [int(t[0]) for t in hyp.timing]
    return Result(
        text=model.text(labels),
        tokens=[model.tokens[k] for k in labels],
        token_ids=labels,
        frames=frames,
        timestamps=[round(t * model.frame_shift, 6) for t in frames],
        durations=[int(t[1]) for t in hyp.timing],
        num_frames=int(num_frames),
        frames_skipped=int(hyp.frames_skipped),
        big_blank_emissions=int(hyp.big_blank_emissions),
        score=float(hyp.score),
        key=key,
    )
