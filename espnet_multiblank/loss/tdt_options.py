"""Validated, hashable options of the TDT loss (``docs/lattice.md`` section 3)."""

import functools
import math
from dataclasses import dataclass
from numbers import Real
from typing import Tuple

from espnet_multiblank.lattice import TDTLattice
from espnet_multiblank.loss.options import (
    check_nonneg_float,
    check_reduction,
    memoize_options,
)


@dataclass(frozen=True)
class TDTOptions:
    """Options of the token-and-duration transducer loss.

    Attributes:
        blank: index of the blank among the V token logits.
        durations: ``(e_0, ..., e_{D-1})``: duration logit ``j`` (index ``V + j`` of
            the joint output) means "covers ``e_j`` frames"; distinct ints >= 0, any
            order, at least one >= 1.
        reduction: "none", "sum", "mean" (sum / B) or "mean_volume" (mean over
            utterances of cost_b / max(L_b, 1)).
        sigma: subtracted from every token log-prob (blank included), never from the
            duration log-probs.
        omega: probability (per call, for the whole batch) of computing the plain
            RNN-T loss on the token logits instead.
        fastemit_lambda: FastEmit weight on the token logits (NeMo's TDT semantics).
        clamp: clip every element of d cost_b / d logits_b (token and duration
            logits) to [-clamp, clamp]; 0 = off.
    """

    blank: int
    durations: Tuple[int, ...]
    reduction: str = "mean"
    sigma: float = 0.0
    omega: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = 0.0

    @functools.cached_property  # per-call validation reads it
    def lattice(self) -> TDTLattice:
        return TDTLattice(self.blank, self.durations)

    @property
    def num_durations(self) -> int:
        return len(self.durations)


def check_probability(name: str, value) -> float:
    """``value`` as a float in [0, 1] (TypeError / ValueError naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a float in [0, 1], got {type(value).__name__} ({value!r})"
        )
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return value


@memoize_options
def make_tdt_options(
    blank,
    durations,
    reduction="mean",
    sigma=0.0,
    omega=0.0,
    fastemit_lambda=0.0,
    clamp=0.0,
) -> TDTOptions:
    """Validate the scalar options (the vocabulary size is checked with the tensors).

    Raises:
        TypeError / ValueError naming the argument and the expected value.
    """
    lattice = TDTLattice.create(blank, durations)
    return TDTOptions(
        blank=lattice.blank,
        durations=lattice.durations,
        reduction=check_reduction(reduction),
        sigma=check_nonneg_float("sigma", sigma),
        omega=check_probability("omega", omega),
        fastemit_lambda=check_nonneg_float("fastemit_lambda", fastemit_lambda),
        clamp=check_nonneg_float("clamp", clamp),
    )
