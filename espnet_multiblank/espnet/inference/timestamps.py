"""Word timestamps from the searches' label timing, and CTM lines.

Every plug-in search gives each label of a hypothesis its
:attr:`~espnet_multiblank.decoding.Hypothesis.timing`: the encoder frame t at which
it was emitted (big blanks and TDT durations counted), the frames its arc covers (a
TDT label's duration, 0 otherwise) and its acoustic log-probability. Here:

* :func:`encoder_frame_shift`: seconds per encoder frame of a model, measured once by
  encoding two lengths of silence (frontend hop x subsampling, whatever they are);
* :func:`word_spans`: tokens -> words, by the token type of the model (``word``: a
  token is a word; ``bpe``: a token starting with ``▁`` starts a word; ``char``:
  ``<space>`` separates words; other types: a token is a word);
* :func:`word_times`: each word's start (its first label's frame), end (its last
  label's frame plus the frames that label covers, at least one) in seconds, and
  confidence (the geometric mean of its labels' acoustic probabilities);
* :func:`ctm_lines`: ``<key> 1 <start> <duration> <word> <confidence>``;
  :func:`ctm_header`: the ``;;`` comment lines (NIST's CTM comments) that open a CTM
  file and say what its times mean for the model's lattice.

A transducer emits each label at one frame. A TDT label's arc also covers the
frames the model predicts for it, so a TDT word's duration is the model's own; a
standard or multi-blank label covers none, and such a word's "duration" is only
the span of its tokens' emission frames plus one frame (one frame for a word of one
token): not its length in the audio. The CTM's header says which. The
plug-in's ``Speech2Text`` gives the same from Python:
``speech2text.word_times(result)``.
"""

import math
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch

#: what starts a word in a SentencePiece (``bpe``) token
WORD_START = "\u2581"
#: the word separator of ``char`` token lists
SPACE = "<space>"


class WordTime(NamedTuple):
    """One word of a hypothesis.

    Attributes:
        word: Its text.
        start: Seconds from the start of the utterance.
        end: Seconds (> ``start``).
        confidence: In [0, 1].
    """

    word: str
    start: float
    end: float
    confidence: float


def word_spans(tokens: Sequence[str], token_type: Optional[str]) -> List[Tuple]:
    """``(word, [token indices])`` of a token sequence (module docstring).

    Args:
        tokens: The hypothesis's tokens (texts).
        token_type: The model's ``token_type`` (``word``, ``bpe``, ``char``, ...).
    """
    spans: List[Tuple[str, List[int]]] = []
    if token_type == "bpe":
        for i, tok in enumerate(tokens):
            starts = tok.startswith(WORD_START)
            piece = tok[len(WORD_START) :] if starts else tok
            if starts or not spans:
                spans.append((piece, [i]))
            else:
                spans[-1] = (spans[-1][0] + piece, spans[-1][1] + [i])
        return [(w, idx) for w, idx in spans if w]
    if token_type == "char":
        word, idx = "", []
        for i, tok in enumerate(tokens):
            if tok == SPACE:
                if idx:
                    spans.append((word, idx))
                word, idx = "", []
            else:
                word, idx = word + tok, idx + [i]
        if idx:
            spans.append((word, idx))
        return spans
    return [(tok, [i]) for i, tok in enumerate(tokens)]


def word_times(
    tokens: Sequence[str],
    timing: Sequence[Tuple[int, int, float]],
    token_type: Optional[str],
    frame_shift: float,
) -> List[WordTime]:
    """The words of a hypothesis with their times (module docstring).

    Args:
        tokens: Its tokens (one per label).
        timing: One ``(frame, frames covered, acoustic log-probability)`` per label.
        token_type: The model's ``token_type``.
        frame_shift: Seconds per encoder frame.
    """
    if len(tokens) != len(timing):
        raise ValueError(
            f"one timing entry per token expected, got {len(timing)} for "
            f"{len(tokens)} tokens"
        )
    out = []
    for word, idx in word_spans(tokens, token_type):
        first, last = timing[idx[0]], timing[idx[-1]]
        start = first[0] * frame_shift
        end = (last[0] + max(1, last[1])) * frame_shift
        mean = sum(timing[i][2] for i in idx) / len(idx)
        out.append(WordTime(word, start, end, min(1.0, math.exp(mean))))
    return out


def ctm_lines(key: str, words: Sequence[WordTime]) -> List[str]:
    """CTM lines of one utterance: ``<key> 1 <start> <duration> <word> <conf>``."""
    return [
        f"{key} 1 {w.start:.3f} {w.end - w.start:.3f} {w.word} {w.confidence:.4f}"
        for w in words
    ]


def ctm_header(tdt: bool, frame_shift: float) -> List[str]:
    """The comment lines that open a CTM file (``;;``, NIST's CTM comments).

    Args:
        tdt: Whether the model is a TDT (its labels' arcs cover frames).
        frame_shift: Seconds per encoder frame.
    """
    if tdt:
        duration = (
            "from the first token's frame to the end of the last token's arc (the "
            "frames the TDT predicts for it): the model's own word duration"
        )
    else:
        duration = (
            "none known: this model's lattice (standard or multi-blank) emits each "
            "token at one frame and predicts no duration, so a word lasts from its "
            "first token's frame to its last token's frame plus one frame (one "
            "frame for a one-token word), not its length in the audio"
        )
    ms = 1000 * frame_shift
    return [
        ";; espnet-multiblank word times: <key> <channel> <start> <duration> <word> "
        "<confidence>",
        f";; start: the encoder frame ({ms:.0f} ms) at which the word's first token "
        "was emitted (a transducer emits a word near or after its end)",
        f";; duration: {duration}",
        ";; confidence: the geometric mean of the word's tokens' acoustic "
        "probabilities",
    ]


def encoder_frame_shift(
    asr_model: Any, fs: Optional[int], device: Any, dtype: torch.dtype
) -> float:
    """Seconds per encoder frame: the samples between the encodings of two lengths
    of silence divided by the frames between them (exact for strided encoders).

    Args:
        asr_model: An ESPnet ASR model with a frontend (waveform input).
        fs: Its sample rate (None: not known).

    Raises:
        ValueError: the model has no frontend, or its encoder gives the same number
            of frames for both lengths.
    """
    if getattr(asr_model, "frontend", None) is None or not fs:
        raise ValueError(
            "word times: the encoder frame shift is measured on waveforms at the "
            "model's sample rate; this model takes features (no frontend) or its "
            "rate is not known"
        )
    lengths = (4 * fs, 8 * fs)
    frames = []
    was_training = asr_model.training
    asr_model.eval()
    try:
        with torch.no_grad():
            for n in lengths:
                speech = torch.zeros(1, n, dtype=dtype, device=device)
                _, lens = asr_model.encode(speech, torch.tensor([n], device=device))
                frames.append(int(lens[0]))
    finally:
        asr_model.train(was_training)
    if frames[1] <= frames[0]:
        raise ValueError(
            f"word times: the encoder gave {frames} frames for {lengths} samples"
        )
    return (lengths[1] - lengths[0]) / (frames[1] - frames[0]) / fs
