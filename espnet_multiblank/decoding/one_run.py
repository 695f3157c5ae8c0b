"""The state of a one-utterance greedy search between steps, and what a stream's
runs of it share.

:meth:`~espnet_multiblank.decoding.base.FrameLoopingGreedySearch.run_one` takes the
steps of one utterance on a :class:`OneRun`; offline it runs to T in one call, a
stream (:class:`~espnet_multiblank.decoding.streaming.StreamingRowGreedySearch`)
calls it as frames arrive, with a :class:`StepCache` that its provisional copies
share.
"""

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from espnet_multiblank.decoding.fusion import FusionState
from espnet_multiblank.decoding.hypothesis import Hypothesis

#: a score term that T decides: (frame t, {min(T - t, cap): value}, and for a
#: label whose timing holds it: (index in ``timing``, frames covered, LM part))
PendingTerm = Tuple[int, Dict[int, float], Optional[Tuple[int, int, float]]]


class StepCache:
    """What a stream's runs (the decided run and its provisional copies) compute
    more than once, kept for the next one: a step that waits for frames is
    evaluated again when they arrive, and a provisional run takes steps that the
    decided run takes later. Only steps near the last frame received are kept
    (the others are taken once). The same inputs give the same outputs, so reading
    them here changes no result (bit for bit).

    Attributes:
        steps: ``(t, labels, labels at t)`` -> ``[joint-network outputs, what the
            search derived from them, ...]`` (the search's own layout).
        labels: label sequence (with the start symbol) -> ``(t, the prediction
            network's (1, J) output and state, the fused LMs' state)`` after it
            (t: the frame of its last label).
        low: The first frame of anything kept (no lookup before it).
    """

    def __init__(self):
        self.steps: Dict[Tuple[int, Tuple[int, ...], int], list] = {}
        self.labels: Dict[Tuple[int, ...], Tuple[int, torch.Tensor, Any, Any]] = {}
        self.low = math.inf

    def key(self, hyp: Hypothesis) -> Tuple[int, Tuple[int, ...], int]:
        """The key of the step a hypothesis takes next."""
        return hyp.frame, tuple(hyp.yseq), hyp.num_sym_frame

    def put_step(self, key: Tuple[int, Tuple[int, ...], int], info: list) -> None:
        self.steps[key] = info
        self.low = min(self.low, key[0])

    def put_labels(self, key: Tuple[int, ...], t: int, outputs: tuple) -> None:
        self.labels[key] = (t,) + outputs
        self.low = min(self.low, t)

    def prune(self, frame: int, labels: int) -> None:
        """Forget the steps before ``frame`` and the label sequences shorter than
        ``labels`` (a decided run never goes back to them); nothing while all
        that is kept lies at ``frame`` or later."""
        if self.low >= frame:
            return
        self.steps = {k: v for k, v in self.steps.items() if k[0] >= frame}
        self.labels = {k: v for k, v in self.labels.items() if len(k) >= labels}
        frames = [k[0] for k in self.steps] + [v[0] for v in self.labels.values()]
        self.low = min(frames, default=math.inf)


@dataclasses.dataclass
class OneRun:
    """The state of a one-utterance greedy search between steps
    (:meth:`FrameLoopingGreedySearch.run_one`).

    Attributes:
        hyp: The hypothesis so far (frame, labels, score, timing).
        dec_proj: (1, J) projected prediction-network output after its labels.
        state: The prediction network's state after them (the stepper's type).
        lm: The fused language models' state after them, or None.
        terms: Score terms not yet added to ``hyp.score``, in step order: a step
            decided before T was known (a stream) can have a score that T decides
            (a blank's total over the blanks T allows), and the terms after it wait
            with it, so that the score is added up in the offline order.
        cache: A stream's :class:`StepCache` (shared with the run's copies), or
            None (offline).
    """

    hyp: Hypothesis
    dec_proj: torch.Tensor
    state: Any
    lm: Optional[FusionState]
    terms: List[Union[float, PendingTerm]] = dataclasses.field(default_factory=list)
    cache: Optional["StepCache"] = None

    def add(self, term: float) -> None:
        """The score of the next step."""
        if self.terms:
            self.terms.append(term)
        else:
            self.hyp.score += term

    def fold(self, length: int, final: bool, cap: int) -> None:
        """Add the terms T now decides, in order: every term once ``final``
        (T = ``length``), else those of frames t <= ``length`` - ``cap``."""
        done = 0
        for term in self.terms:
            if isinstance(term, tuple):
                t, values, timing = term
                if final:
                    value = values[min(length - t, cap)]
                elif length - t >= cap:
                    value = values[cap]
                else:
                    break
                if timing is not None:
                    index, frames, lm_part = timing
                    self.hyp.timing[index] = (t, frames, value - lm_part)
                term = value
            self.hyp.score += term
            done += 1
        del self.terms[:done]

    def copy(self) -> "OneRun":
        """An independent copy (the tensors are shared: a step makes new ones)."""
        hyp = dataclasses.replace(
            self.hyp, yseq=list(self.hyp.yseq), timing=list(self.hyp.timing)
        )
        return OneRun(
            hyp, self.dec_proj, self.state, self.lm, list(self.terms), self.cache
        )
