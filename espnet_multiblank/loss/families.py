"""One record per lattice family: the only place where the losses differ.

The loss path (``espnet_multiblank.loss.api``), the validation, the autograd
Function and the stages (``espnet_multiblank.loss.stages``) are written once; what
depends on the lattice comes from the :class:`LatticeFamily` of the options:

* ``"multiblank"`` (standard RNN-T when there are no big blanks):
  :class:`~espnet_multiblank.loss.options.LossOptions`, logits (B, T, U, V);
* ``"tdt"`` (token-and-duration transducer):
  :class:`~espnet_multiblank.loss.options.TDTOptions`, logits (B, T, U, V + D).
"""

from dataclasses import dataclass
from typing import Callable


def _cpu_multiblank():
    from espnet_multiblank.loss.cpu.driver import compute

    return compute


def _cpu_tdt():
    from espnet_multiblank.loss.cpu.tdt_driver import tdt_compute

    return tdt_compute


@dataclass(frozen=True)
class LatticeFamily:
    """What one lattice family brings to the shared loss path.

    Attributes:
        kind: the lattice's ``kind`` (``"multiblank"`` or ``"tdt"``).
        cpu_driver: returns the CPU kernel driver (imported on first use: Numba
            compiles nothing before a CPU loss is computed).
    """

    kind: str
    cpu_driver: Callable


MULTIBLANK = LatticeFamily(kind="multiblank", cpu_driver=_cpu_multiblank)
TDT = LatticeFamily(kind="tdt", cpu_driver=_cpu_tdt)
_BY_KIND = {f.kind: f for f in (MULTIBLANK, TDT)}


def family_of(opts) -> LatticeFamily:
    """The family of validated loss options (by their lattice's kind)."""
    try:
        return _BY_KIND[opts.lattice.kind]
    except (AttributeError, KeyError):
        raise TypeError(
            "opts must be the validated options of a loss (make_options or "
            f"make_tdt_options), got {type(opts).__name__}"
        ) from None
