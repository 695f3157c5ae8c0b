"""A search's hypotheses as ESPnet's results: the n-best list
``[(text, token, token_int, hyp)]`` that ESPnet's ``Speech2Text`` returns, ``hyp`` of
ESPnet's transducer ``Hypothesis`` type (:class:`DecodedHypothesis` with the plug-in's
counts and label timing)."""

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from espnet2.asr.transducer.beam_search_transducer import (
    Hypothesis as ESPnetTransducerHypothesis,
)


@dataclass
class DecodedHypothesis(ESPnetTransducerHypothesis):
    """ESPnet's transducer ``Hypothesis`` (what ESPnet's ``Speech2Text`` and tools
    accept: ``score``, ``yseq`` with the start symbol first, ``dec_state``) plus the
    plug-in's counts: ``frame``, ``big_blank_emissions``, ``frames_skipped``, and
    the labels' ``timing`` (:attr:`espnet_multiblank.decoding.Hypothesis.timing`)."""

    frame: int = 0
    big_blank_emissions: int = 0
    frames_skipped: int = 0
    timing: List[Tuple[int, int, float]] = field(default_factory=list)


def to_espnet_hypothesis(hyp: Any) -> ESPnetTransducerHypothesis:
    """A search's :class:`~espnet_multiblank.decoding.Hypothesis` as ESPnet's type
    (ESPnet's own hypotheses are returned as they are)."""
    if isinstance(hyp, ESPnetTransducerHypothesis):
        # ESPnet's beam search with an LM adds tensors to the score: keep a number
        hyp.score = float(hyp.score)
        return hyp
    return DecodedHypothesis(
        score=float(hyp.score),
        yseq=list(hyp.yseq),
        dec_state=hyp.dec_state,
        frame=hyp.frame,
        big_blank_emissions=hyp.big_blank_emissions,
        frames_skipped=hyp.frames_skipped,
        timing=list(getattr(hyp, "timing", ())),
    )


def espnet_results(
    hyps: Sequence[Any], converter: Any, tokenizer: Optional[Any]
) -> List[Tuple]:
    """Hypotheses -> ESPnet's ``[(text, token, token_int, hyp)]``.

    ``yseq[0]`` is the start symbol; the transducer searches never put a blank
    after it, so no id is filtered out (ESPnet's own conversion drops id 0, which
    is a label when the blank is elsewhere).

    Args:
        hyps: The hypotheses to convert, best first (the search's n-best list cut
            to ``--nbest``).
        converter: ESPnet's ``TokenIDConverter`` (ids -> tokens).
        tokenizer: ESPnet's tokenizer (tokens -> text), or None: ``text`` is None.

    Returns:
        One ``(text, token, token_int, hyp)`` per hypothesis: ``text`` a str or
        None, ``token`` a list of str, ``token_int`` a list of int (the labels after
        the start symbol), ``hyp`` ESPnet's type (:func:`to_espnet_hypothesis`).
    """
    results = []
    for hyp in hyps:
        token_int = [int(x) for x in hyp.yseq[1:]]
        token = converter.ids2tokens(token_int)
        text = tokenizer.tokens2text(token) if tokenizer else None
        results.append((text, token, token_int, to_espnet_hypothesis(hyp)))
    return results
