"""The ``model_conf`` keys that ``model: multiblank_espnet`` adds to ESPnet's model,
validated in one place.

:func:`check_model_conf` turns the keys' values into a :class:`TransducerConf` or raises
:class:`~espnet_multiblank.espnet.errors.ConfigError` naming the key. It runs twice on
the way to a model: in :func:`espnet_multiblank.espnet.training.task.check_args` (the
plug-in's entry point, before ESPnet's ``build_model`` edits the token list with the
keys), and in the model's constructor (every path, ESPnet's stock scripts included). The
keys' defaults have one definition, the constructor's signature (which ESPnet's
``--print_config`` shows; two of its defaults are the constants here,
:data:`MULTI_BLANK_SIGMA_DEFAULT` and :data:`FUSED_JOINT_DEFAULT`);
:func:`check_model_conf` takes every key.

The loss's own validators check the numbers (their messages name the key here), the
lattice module checks the durations and tells which encoder lengths a TDT cannot
reach (:func:`espnet_multiblank.lattice.reachable_lengths`).
"""

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Tuple

from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.no_path import MODEL_REDUCTIONS
from espnet_multiblank.lattice import (
    TDTLattice,
    check_big_blank_durations,
    check_tdt_durations,
    lattice_from_config,
    reachable_lengths,
)
from espnet_multiblank.loss.api import BACKENDS
from espnet_multiblank.loss.options import (
    REDUCTIONS,
    check_nonneg_float,
    check_probability,
    check_reduction,
)

logger = logging.getLogger(__name__)

#: the model_conf keys checked here, in the constructor's order
KEYS = (
    "transducer_multi_blank_durations",
    "transducer_multi_blank_sigma",
    "transducer_tdt_durations",
    "transducer_tdt_sigma",
    "transducer_tdt_omega",
    "transducer_fastemit_lambda",
    "transducer_clamp",
    "transducer_reduction",
    "transducer_loss_backend",
    "transducer_allow_unreachable_lengths",
    "batch_exact_encoding",
    "transducer_fused_joint",
)

#: the default of ``transducer_multi_blank_sigma`` (the constructor's): a value other
#: than this one counts as given when both sigma keys are set for a TDT
MULTI_BLANK_SIGMA_DEFAULT = 0.05

#: the default of ``transducer_fused_joint`` (the constructor's): the dense joint
#: network and loss
FUSED_JOINT_DEFAULT = False


def key(name: str) -> str:
    """The YAML key of a model_conf entry, as error messages write it."""
    return f"model_conf.{name}"


@dataclass(frozen=True)
class TransducerConf:
    """The plug-in's model_conf, validated (built by :func:`check_model_conf`).

    Attributes:
        big_blank_durations: multi-blank durations; () for a standard or TDT model.
        tdt_durations: TDT durations; () for a (multi-blank) RNN-T.
        sigma: logit under-normalisation of the loss (for a TDT the resolved value of
            ``transducer_tdt_sigma`` / ``transducer_multi_blank_sigma``).
        tdt_omega: NeMo's omega (0 for a (multi-blank) RNN-T).
        fastemit_lambda: FastEmit weight.
        clamp: gradient clamp (0 = off).
        reduction: how the model reduces the per-utterance costs (a
            :data:`MODEL_REDUCTIONS` name).
        loss_backend: the loss's backend.
        allow_unreachable_lengths: whether a TDT whose durations leave some encoder
            lengths without a path was accepted.
        batch_exact_encoding: whether the encoder is made batch-exact.
        fused_joint: whether the training and validation loss runs the joint
            network's activation and output layer inside the fused joint + loss
            (:mod:`espnet_multiblank.espnet.model.fused_joint`).
    """

    big_blank_durations: Tuple[int, ...]
    tdt_durations: Tuple[int, ...]
    sigma: float
    tdt_omega: float
    fastemit_lambda: float
    clamp: float
    reduction: str
    loss_backend: str
    allow_unreachable_lengths: bool
    batch_exact_encoding: bool
    fused_joint: bool


def _checked(name: str, check: Callable[[str, Any], Any], value: Any) -> Any:
    """``check(key, value)`` (a loss validator) with its TypeError / ValueError
    raised as ConfigError; its message names the key."""
    try:
        return check(key(name), value)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def _durations(name: str, value: Any, check, expected: str) -> Tuple[int, ...]:
    try:
        if value is not None and not isinstance(value, (list, tuple)):
            raise TypeError(f"got {type(value).__name__} {value!r}")
        return check(value, key(name))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key(name)} must be {expected}: {e}") from None


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(
            f"{key(name)} must be true or false, got {type(value).__name__} {value!r}"
        )
    return value


@functools.lru_cache(maxsize=None)  # once per value and process (checked twice)
def _say_old_sigma_key(sigma: float) -> None:
    logger.warning(
        "%s=%s sets the TDT's sigma; the TDT's own key is %s",
        key("transducer_multi_blank_sigma"),
        sigma,
        key("transducer_tdt_sigma"),
    )


def _tdt_sigma(multi_blank_sigma: float, tdt_sigma: Any) -> float:
    """A TDT's sigma: ``transducer_tdt_sigma``, else (the old key, still accepted)
    ``transducer_multi_blank_sigma``; both set to different values is an error."""
    if tdt_sigma is None:
        if multi_blank_sigma != MULTI_BLANK_SIGMA_DEFAULT:
            _say_old_sigma_key(multi_blank_sigma)
        return multi_blank_sigma
    sigma = _checked("transducer_tdt_sigma", check_nonneg_float, tdt_sigma)
    if multi_blank_sigma not in (MULTI_BLANK_SIGMA_DEFAULT, sigma):
        raise ConfigError(
            f"{key('transducer_tdt_sigma')}={sigma} and "
            f"{key('transducer_multi_blank_sigma')}={multi_blank_sigma} disagree: "
            f"a TDT reads the first (the second is its old name); set only "
            f"{key('transducer_tdt_sigma')}"
        )
    return sigma


def _check_reachable(tdt: Tuple[int, ...]) -> None:
    """Refuse TDT durations that leave encoder lengths without any path."""
    reach = reachable_lengths(TDTLattice(0, tdt))  # the blank index plays no part
    if reach.all_reachable:
        return
    raise ConfigError(
        f"{key('transducer_tdt_durations')}={list(tdt)}: no path of this TDT covers "
        f"exactly T encoder frames for {reach.describe()}, so an utterance with "
        "such a length cannot be trained (its loss is infinite). Add duration 1 (e.g. "
        f"{sorted(set(tdt) | {1})}), or set "
        f"{key('transducer_allow_unreachable_lengths')}: true to train on the other "
        "utterances only (the model leaves utterances without a path out of the "
        "loss, warns, and reports their share as transducer_no_path_fraction)"
    )


def check_model_conf(
    *,
    transducer_multi_blank_durations: Any,
    transducer_multi_blank_sigma: Any,
    transducer_tdt_durations: Any,
    transducer_tdt_sigma: Any,
    transducer_tdt_omega: Any,
    transducer_fastemit_lambda: Any,
    transducer_clamp: Any,
    transducer_reduction: Any,
    transducer_loss_backend: Any,
    transducer_allow_unreachable_lengths: Any,
    batch_exact_encoding: Any,
    transducer_fused_joint: Any,
) -> TransducerConf:
    """Validate the plug-in's ``model_conf`` keys (every one of :data:`KEYS`).

    Returns:
        The validated values.

    Raises:
        ConfigError: naming the offending ``model_conf.<key>`` and what it expects.
    """
    allow_unreachable = _flag(
        "transducer_allow_unreachable_lengths", transducer_allow_unreachable_lengths
    )
    big, tdt = _check_lattice(
        transducer_multi_blank_durations, transducer_tdt_durations, allow_unreachable
    )
    sigma = _checked(
        "transducer_multi_blank_sigma", check_nonneg_float, transducer_multi_blank_sigma
    )
    if tdt:
        sigma = _tdt_sigma(sigma, transducer_tdt_sigma)
    elif transducer_tdt_sigma is not None:
        raise ConfigError(
            f"{key('transducer_tdt_sigma')} is the sigma of a TDT (set with "
            f"{key('transducer_tdt_durations')}); this model's sigma is "
            f"{key('transducer_multi_blank_sigma')}"
        )
    _check_model_reduction(transducer_reduction)
    _check_loss_backend(transducer_loss_backend)
    return TransducerConf(
        big_blank_durations=big,
        tdt_durations=tdt,
        sigma=sigma,
        tdt_omega=_checked(
            "transducer_tdt_omega", check_probability, transducer_tdt_omega
        ),
        fastemit_lambda=_checked(
            "transducer_fastemit_lambda", check_nonneg_float, transducer_fastemit_lambda
        ),
        clamp=_checked("transducer_clamp", check_nonneg_float, transducer_clamp),
        reduction=transducer_reduction,
        loss_backend=transducer_loss_backend,
        allow_unreachable_lengths=allow_unreachable,
        batch_exact_encoding=_flag("batch_exact_encoding", batch_exact_encoding),
        fused_joint=_flag("transducer_fused_joint", transducer_fused_joint),
    )


def _check_lattice(
    multi_blank_durations: Any, tdt_durations: Any, allow_unreachable: bool
) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """The big-blank and TDT durations: each list valid, the two compatible (the
    lattice module owns that rule), and every encoder length reachable by a TDT
    unless ``allow_unreachable``. Returns ``(big_blank_durations, tdt_durations)``."""
    big = _durations(
        "transducer_multi_blank_durations",
        multi_blank_durations,
        check_big_blank_durations,
        "a list of distinct integers >= 2 (e.g. [2, 4, 8]; [] for a standard "
        "transducer)",
    )
    tdt = _durations(
        "transducer_tdt_durations",
        tdt_durations,
        lambda value, name: check_tdt_durations(value, name) if value else (),
        "a list of distinct integers >= 0 with at least one >= 1 (e.g. "
        "[0, 1, 2, 3, 4]; [] for no TDT)",
    )
    if tdt and big:
        try:  # any valid blank index will do here
            lattice_from_config(
                len(big),
                big,
                tdt,
                key("transducer_multi_blank_durations"),
                key("transducer_tdt_durations"),
            )
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if tdt and not allow_unreachable:
        _check_reachable(tdt)
    return big, tdt


def _check_loss_backend(backend: Any) -> None:
    try:
        if backend not in BACKENDS:
            raise ValueError
    except (TypeError, ValueError):  # an unhashable value is not a backend either
        raise ConfigError(
            f"{key('transducer_loss_backend')} must be one of {list(BACKENDS)}, got "
            f"{backend!r}"
        ) from None


def _check_model_reduction(reduction: Any) -> None:
    """A loss reduction (the loss's validator) that gives a scalar and that the
    model knows how to apply over the utterances that have a path."""
    try:
        check_reduction(reduction)
        ok = reduction in MODEL_REDUCTIONS
    except (TypeError, ValueError):
        ok = False
    if not ok:
        names = [r for r in REDUCTIONS if r in MODEL_REDUCTIONS]
        raise ConfigError(
            f"{key('transducer_reduction')} must be one of {names} (the trainer needs "
            f"a scalar), got {reduction!r}"
        )
