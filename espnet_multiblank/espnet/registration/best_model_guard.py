"""Keep NaN epochs out of ESPnet's choice of the best models.

ESPnet's trainer chooses ``{phase}.{key}.best.pth``, the ``keep_nbest_models`` it
keeps, the averaged ``{phase}.{key}.ave_{n}best.pth`` models and early stopping with
``Reporter.sort_epochs_and_values``, which ranks the epochs' values of a
``best_model_criterion`` with Python's ``sorted``. An epoch's value is NaN when none
of its batches gave a finite one (ESPnet's reporter averages the finite values only),
e.g. when every batch's loss was infinite. NaN compares false with everything, so
``sorted`` leaves a NaN where it happens to be: a NaN first epoch stays "best" for
ever (``[nan, 2.0]`` sorts as it is), and the finite epochs around a NaN are misranked
too (``[3.0, nan, 2.0]`` sorts as it is, making 3.0 the best).

:func:`install` replaces that method on ESPnet's ``Reporter`` class by
:func:`sort_epochs_and_values`: ESPnet's ranking (stable, ``min`` or ``max``) of the
epochs whose value is not NaN, with a warning naming the NaN epochs; when every epoch
so far is NaN it raises :class:`NaNCriterionError`, which stops the training before
ESPnet links a best model (the epoch's checkpoint is already saved). It is installed
by :func:`~espnet_multiblank.espnet.registration.register`, so in the plug-in's
training entry point, in ESPnet's stock ``espnet2.bin.asr_train`` with the start-up
hook, and in any process that registers the plug-in, for every model trained there.
"""

import logging
import math
from typing import List, Sequence, Tuple

logger = logging.getLogger(__name__)

_INSTALLED = "_espnet_multiblank_nan_guard"
_WARNED = "_espnet_multiblank_nan_epochs_warned"


class NaNCriterionError(RuntimeError):
    """Every epoch so far has a NaN value of a best-model criterion."""


def _is_nan(value) -> bool:
    try:
        return math.isnan(value)
    except TypeError:  # not a real number (ESPnet's reporter only stores numbers)
        return False


def _warn_once(reporter, key: str, key2: str, epochs: Sequence[int]) -> None:
    warned = reporter.__dict__.setdefault(_WARNED, set())
    new = [e for e in epochs if (key, key2, e) not in warned]
    if not new:
        return
    warned.update((key, key2, e) for e in new)
    logger.warning(
        "best_model_criterion %s.%s is NaN in epoch(s) %s (no batch gave a finite "
        "value): left out of the choice of the best models",
        key,
        key2,
        ", ".join(map(str, new)),
    )


def sort_epochs_and_values(
    self, key: str, key2: str, mode: str
) -> List[Tuple[int, float]]:
    """ESPnet's ``Reporter.sort_epochs_and_values`` without the NaN epochs.

    Returns:
        ``[(epoch, value), ...]``, best first, NaN epochs left out.

    Raises:
        ValueError / KeyError: as ESPnet's (bad mode, unknown criterion).
        NaNCriterionError: every epoch's value is NaN.
    """
    if mode not in ("min", "max"):
        raise ValueError(f"mode must min or max: {mode}")
    if not self.has(key, key2):
        raise KeyError(f"{key}.{key2} is not found: {self.get_all_keys()}")
    values = [(e, self.stats[e][key][key2]) for e in self.stats]
    nan_epochs = [e for e, v in values if _is_nan(v)]
    if nan_epochs:
        _warn_once(self, key, key2, nan_epochs)
        values = [(e, v) for e, v in values if not _is_nan(v)]
        if not values:
            raise NaNCriterionError(
                f"best_model_criterion {key}.{key2} ({mode}) is NaN in every epoch so "
                f"far ({', '.join(map(str, nan_epochs))}): no batch gave a finite "
                "value, so no model can be chosen as the best one and the training "
                "stops here (espnet-multiblank's guard; ESPnet would link the NaN "
                "epoch as best). Look in the log for infinite or NaN losses."
            )
    sign = 1 if mode == "min" else -1
    return sorted(values, key=lambda x: sign * x[1])


def install() -> None:
    """Replace ``espnet2.train.reporter.Reporter.sort_epochs_and_values`` (once)."""
    from espnet2.train.reporter import Reporter

    if getattr(Reporter, _INSTALLED, False):
        return
    Reporter.sort_epochs_and_values = sort_epochs_and_values
    setattr(Reporter, _INSTALLED, True)
