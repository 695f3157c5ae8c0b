"""Validated, hashable loss options shared by every backend."""

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Sequence, Tuple

REDUCTIONS = ("none", "sum", "mean", "mean_volume")


@dataclass(frozen=True)
class LossOptions:
    """Options of the multi-blank RNN-T loss (see ``shared/loss_math.md``).

    Attributes:
        blank: index of the standard blank in the vocabulary.
        big_blank_durations: ``(d_0, ..., d_{N-1})``; big blank ``i`` has index
            ``blank - 1 - i`` and advances time by ``d_i`` frames.
        reduction: "none" (per-utterance, shape (B,)), "sum", "mean" (sum / B, ESPnet's
            behaviour) or "mean_volume" (mean over utterances of cost_b / max(L_b, 1),
            NeMo's "mean").
        fastemit_lambda: FastEmit weight (>= 0), NeMo/ESPnet CUDA semantics.
        clamp: clip every element of d cost_b / d logits_b to [-clamp, clamp]; 0 = off.
        sigma: logit under-normalisation subtracted from every emission's log-prob.
    """

    blank: int
    big_blank_durations: Tuple[int, ...] = ()
    reduction: str = "mean"
    fastemit_lambda: float = 0.0
    clamp: float = 0.0
    sigma: float = 0.0

    @property
    def num_big_blanks(self) -> int:
        return len(self.big_blank_durations)

    @property
    def big_blank_ids(self) -> Tuple[int, ...]:
        return tuple(self.blank - 1 - i for i in range(self.num_big_blanks))

    @property
    def all_blank_ids(self) -> Tuple[int, ...]:
        return (self.blank,) + self.big_blank_ids


def _check_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name} must be an int, got {type(value).__name__} ({value!r})"
        )
    return int(value)


def _check_nonneg_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a float >= 0, got {type(value).__name__} ({value!r})"
        )
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite float >= 0, got {value}")
    return value


def check_durations(big_blank_durations: Sequence[int]) -> Tuple[int, ...]:
    """Normalise ``big_blank_durations`` to a tuple of distinct ints >= 2."""
    if big_blank_durations is None:
        return ()
    if isinstance(big_blank_durations, (str, bytes)) or not hasattr(
        big_blank_durations, "__iter__"
    ):
        raise TypeError(
            "big_blank_durations must be a list of ints >= 2, got "
            f"{type(big_blank_durations).__name__} ({big_blank_durations!r})"
        )
    durations = []
    for d in big_blank_durations:
        if hasattr(d, "item") and getattr(d, "ndim", 1) == 0:  # numpy / torch scalars
            d = d.item()
        d = _check_int("big_blank_durations[...]", d)
        if d < 2:
            raise ValueError(
                "big_blank_durations must contain ints >= 2, "
                f"got {list(big_blank_durations)}"
            )
        durations.append(d)
    if len(set(durations)) != len(durations):
        raise ValueError(
            f"big_blank_durations must be distinct, got {list(big_blank_durations)}"
        )
    return tuple(durations)


def make_options(
    blank,
    big_blank_durations=(),
    reduction="mean",
    fastemit_lambda=0.0,
    clamp=0.0,
    sigma=0.0,
) -> LossOptions:
    """Validate the scalar options (the vocabulary size is checked with the tensors)."""
    blank = _check_int("blank", blank)
    if blank < 0:
        raise ValueError(
            f"blank must be an index >= 0 into the vocabulary, got {blank}"
        )
    durations = check_durations(big_blank_durations)
    if blank - len(durations) < 0:
        raise ValueError(
            f"big blank i has index blank - 1 - i, so blank must be >= "
            f"len(big_blank_durations) = {len(durations)}; got blank = {blank} "
            f"(ESPnet puts <blank{{d}}> tokens before <blank> in the token list)"
        )
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return LossOptions(
        blank=blank,
        big_blank_durations=durations,
        reduction=reduction,
        fastemit_lambda=_check_nonneg_float("fastemit_lambda", fastemit_lambda),
        clamp=_check_nonneg_float("clamp", clamp),
        sigma=_check_nonneg_float("sigma", sigma),
    )
