"""Validated, hashable options of the losses, one type per lattice family.

:class:`LossOptions` (multi-blank / standard RNN-T, ``docs/lattice.md`` section 2) and
:class:`TDTOptions` (TDT, section 3) are frozen dataclasses: every backend and the
autograd Function take them as they are, and :func:`make_options` /
:func:`make_tdt_options` build them from user arguments (TypeError / ValueError
naming the argument), cached by the exact arguments. Both carry their lattice
(``opts.lattice``, from :mod:`espnet_multiblank.lattice`), whose ``kind`` selects
the family record (``espnet_multiblank.loss.families``).
"""

import functools
import math
from dataclasses import dataclass
from numbers import Real
from typing import Callable, Tuple, TypeVar

from espnet_multiblank.lattice import MultiblankLattice, TDTLattice
from espnet_multiblank.loss.reductions import (  # noqa: F401  (REDUCTIONS re-exported)
    REDUCTIONS,
    check_reduction,
)


@dataclass(frozen=True)
class LossOptions:
    """Options of the multi-blank RNN-T loss (the lattice: ``docs/lattice.md``).

    Attributes:
        blank: index of the standard blank in the vocabulary.
        big_blank_durations: ``(d_0, ..., d_{N-1})``; big blank ``i`` has index
            ``blank - 1 - i`` and advances time by ``d_i`` frames.
        reduction: one of :data:`~espnet_multiblank.loss.reductions.REDUCTIONS`:
            "none" (per-utterance, shape (B,)), "sum", "mean" (sum / B, ESPnet's),
            "mean_batch" (sum / B, NeMo's), "mean_volume" (sum of costs / sum of
            label counts, NeMo's) or "mean_label_normalized" (mean over utterances
            of cost_b / max(L_b, 1), NeMo's "mean").
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

    @functools.cached_property  # per-call validation reads the blank ids
    def lattice(self) -> MultiblankLattice:
        return MultiblankLattice(self.blank, self.big_blank_durations)

    @property
    def num_big_blanks(self) -> int:
        return len(self.big_blank_durations)

    @property
    def big_blank_ids(self) -> Tuple[int, ...]:
        return self.lattice.big_blank_ids

    @property
    def all_blank_ids(self) -> Tuple[int, ...]:
        return self.lattice.blank_ids


@dataclass(frozen=True)
class TDTOptions:
    """Options of the token-and-duration transducer loss.

    Attributes:
        blank: index of the blank among the V token logits.
        durations: ``(e_0, ..., e_{D-1})``: duration logit ``j`` (index ``V + j`` of
            the joint output) means "covers ``e_j`` frames"; distinct ints >= 0, any
            order, at least one >= 1.
        reduction: as for :class:`LossOptions`.
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


def check_nonneg_float(name: str, value) -> float:
    """``value`` as a finite float >= 0 (TypeError / ValueError naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a float >= 0, got {type(value).__name__} ({value!r})"
        )
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite float >= 0, got {value}")
    return value


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


# the plain Python scalar types whose values identify a validated option exactly
_PLAIN = (bool, int, float, str)
_MAX_CACHED = 256
_Options = TypeVar("_Options")


def _tagged(value):
    """A hashable key that tells ``1`` from ``1.0`` and ``True`` (each is validated
    differently), or None when ``value`` is not built of plain scalars, lists and
    tuples (numpy scalars, tensors...: those are always validated afresh)."""
    if type(value) in _PLAIN:
        return (type(value), value)
    if type(value) in (list, tuple):
        items = tuple(_tagged(v) for v in value)
        return None if None in items else (type(value), items)
    return None


def memoize_options(make: Callable[..., _Options]) -> Callable[..., _Options]:
    """Cache ``make``'s validated (frozen) options by the exact arguments, so that the
    functional API (which builds its options on every call) does not re-validate
    them on every training step; arguments that raise are never cached."""
    cache = {}

    @functools.wraps(make)
    def cached(*args, **kwargs):
        key = _tagged((args, tuple(sorted(kwargs.items()))))
        if key is None:
            return make(*args, **kwargs)
        opts = cache.get(key)
        if opts is None:
            opts = make(*args, **kwargs)
            if len(cache) >= _MAX_CACHED:
                cache.clear()
            cache[key] = opts
        return opts

    return cached


@memoize_options
def make_options(
    blank,
    big_blank_durations=(),
    reduction="mean",
    fastemit_lambda=0.0,
    clamp=0.0,
    sigma=0.0,
) -> LossOptions:
    """Validate the scalar options (the vocabulary size is checked with the tensors)."""
    lattice = MultiblankLattice.create(blank, big_blank_durations)
    return LossOptions(
        blank=lattice.blank,
        big_blank_durations=lattice.big_blank_durations,
        **_shared_options(reduction, fastemit_lambda, clamp, sigma),
    )


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
    """Validate the TDT loss's scalar options (the vocabulary size is checked with
    the tensors).

    Raises:
        TypeError / ValueError naming the argument and the expected value.
    """
    lattice = TDTLattice.create(blank, durations)
    return TDTOptions(
        blank=lattice.blank,
        durations=lattice.durations,
        omega=check_probability("omega", omega),
        **_shared_options(reduction, fastemit_lambda, clamp, sigma),
    )


def _shared_options(reduction, fastemit_lambda, clamp, sigma) -> dict:
    """The options every loss family validates the same way, by field name."""
    return dict(
        reduction=check_reduction(reduction),
        fastemit_lambda=check_nonneg_float("fastemit_lambda", fastemit_lambda),
        clamp=check_nonneg_float("clamp", clamp),
        sigma=check_nonneg_float("sigma", sigma),
    )
