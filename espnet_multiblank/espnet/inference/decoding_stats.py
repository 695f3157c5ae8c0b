"""The counts behind ``decoding_stats.json``: the search's (:class:`DecodingStats`,
kept by the plug-in's ``Speech2Text``), a decoding run's (:class:`RunTally`, kept by
the offline and the streaming loop), and the file (:func:`write_decoding_stats`)."""

import json
import logging
import math
from pathlib import Path
from typing import Any, Dict, Optional

# the decoding loop's logger (its summary line and failures)
logger = logging.getLogger("espnet_multiblank.asr_inference")


class DecodingStats:
    """Counters for ``decoding_stats.json`` (1-best hypotheses only)."""

    def __init__(self):
        # the plug-in's search class, when the plug-in chose the search
        self.search: Optional[str] = None
        self.num_utterances = 0
        self.total_frames = 0
        self.big_blank_emissions = 0
        # frames whose joint network the 1-best paths never evaluated: d - 1 per
        # emission covering d > 1 frames (big blanks; TDT blanks and labels)
        self.frames_skipped = 0
        # wall time inside the transducer search alone (no encoder, no I/O): the part
        # that big blanks shorten
        self.search_seconds = 0.0

    def add(self, frames: int, hyp: Any) -> None:
        """Count a decoded utterance (not one whose score is not finite: the
        decoding loop reports it instead of writing it)."""
        if not math.isfinite(float(hyp.score)):
            return
        self.num_utterances += 1
        self.total_frames += int(frames)
        self.big_blank_emissions += int(getattr(hyp, "big_blank_emissions", 0))
        self.frames_skipped += int(getattr(hyp, "frames_skipped", 0))

    @property
    def frames_skipped_by_big_blanks(self) -> int:
        """:attr:`frames_skipped` under its first name (multi-blank models: only big
        blanks skip frames)."""
        return self.frames_skipped

    def as_dict(self) -> Dict[str, Any]:
        """The search counters under their ``decoding_stats.json`` keys."""
        return {
            "search_seconds": self.search_seconds,
            "total_frames": self.total_frames,
            "frames_skipped": self.frames_skipped,
            "frames_skipped_by_big_blanks": self.frames_skipped_by_big_blanks,
            "big_blank_emissions": self.big_blank_emissions,
        }


class RunTally:
    """What a decoding run counts besides the search: the utterances read, those
    that failed (with the reason) and the audio decoded; the base of both loops'
    runs (:class:`~espnet_multiblank.espnet.inference.loop.DecodingRun`,
    :class:`~espnet_multiblank.espnet.inference.stream_loop.StreamingRun`).

    Attributes:
        failed: ``{key: reason}`` of the utterances that could not be decoded.
        num_utterances: Utterances read.
        audio_seconds: Seconds of audio decoded.
    """

    def __init__(self):
        self.failed: Dict[str, str] = {}
        self.num_utterances = 0
        self.audio_seconds = 0.0

    def fail(self, key: str, reason: str) -> None:
        """Report an utterance that is not decoded (logged; kept in
        :attr:`failed`)."""
        logger.warning("utterance %s not decoded: %s", key, reason)
        self.failed[key] = reason

    def totals(self, decode_seconds: float) -> Dict[str, Any]:
        """The run's counts and real-time factor: the first keys of
        ``decoding_stats.json``."""
        return {
            "num_utterances": self.num_utterances,
            "num_failed": len(self.failed),
            "audio_seconds": self.audio_seconds,
            "decode_seconds": decode_seconds,
            "rtf": (
                decode_seconds / self.audio_seconds if self.audio_seconds > 0 else None
            ),
        }


def write_decoding_stats(output_dir: Any, stats: Dict[str, Any]) -> None:
    """Write ``<output_dir>/decoding_stats.json``."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(output_dir) / "decoding_stats.json", "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")
