"""Everything the fused joint + loss takes from ``espnet_multiblank.loss``, in one
place.

The fused path shares the dense losses' options, lattice family records, input
checks, kernel choice, reductions and lattice stage; it reaches them only through this
module, so that a change of the loss package's internals is a change here. What it
uses:

* the option makers (``make_options``, ``make_tdt_options``, ``check_probability``)
  and the backend names;
* the family record of the options (:func:`family_of`): the label rule, the rows'
  layout (``espnet_multiblank.loss.rows``: what a lattice node's row holds, on every
  device) and TDT's omega draw; nothing in ``fused/`` asks which lattice it is;
* the tensor checks (``check_tensor``) and the label / length checks
  (``check_label_tensors``, ``check_lengths_and_labels``), with the fused arguments'
  names (:data:`FUSED_NAMES`);
* the choice of a device's Numba kernels (``numba_kernel``, the dense loss's), the
  **lattice stage** (``run_lattice``: the family's Numba CPU, Numba CUDA or PyTorch
  runner, by where the rows live) and the reduction of per-utterance costs
  (``reduce_costs``);
* the vectorisable float32 / float64 range primitives of the dense CPU kernels
  (:func:`cpu_row_ops`: exp, max and NaN check, scale, clamp of a row), which the
  fused CPU tile kernels use on a tile's logits, and the dense CPU driver's thread
  rule and serial twins of parallel kernels (:func:`cpu_threads`,
  :func:`cpu_serial_twin`).
"""

from espnet_multiblank.loss.dispatch import BACKENDS, check_backend, numba_kernel
from espnet_multiblank.loss.families import family_of
from espnet_multiblank.loss.function import reduce_costs
from espnet_multiblank.loss.label_rules import ArgNames
from espnet_multiblank.loss.options import (
    check_probability,
    make_options,
    make_tdt_options,
)
from espnet_multiblank.loss.rows import RowsLayout
from espnet_multiblank.loss.stages import run_lattice
from espnet_multiblank.loss.validation import (
    FLOAT_DTYPES,
    check_label_tensors,
    check_lengths_and_labels,
    check_tensor,
)

__all__ = [
    "BACKENDS",
    "FLOAT_DTYPES",
    "FUSED_NAMES",
    "RowsLayout",
    "check_backend",
    "check_label_tensors",
    "check_lengths_and_labels",
    "check_probability",
    "check_tensor",
    "cpu_row_ops",
    "cpu_serial_twin",
    "cpu_threads",
    "family_of",
    "gradient_flush_below",
    "make_options",
    "make_tdt_options",
    "numba_kernel",
    "reduce_costs",
    "run_lattice",
]

#: how the shared checks' messages name the fused arguments: enc (B, T, J), pred (B,
#: U, J), weight (V', J)
FUSED_NAMES = ArgNames(
    tensor="enc",
    batch="enc.shape[0]",
    frames="enc.shape[1]",
    positions="pred.shape[1]",
    width="weight.shape[0]",
    durations="len(tdt_durations)",
)


def cpu_threads(num_elements: int):
    """(parallel, previous Numba thread count or None): whether a CPU kernel over
    ``num_elements`` values runs in parallel, by the dense CPU kernels' rule (one
    torch thread, small work, or a process forked after a parallel region: serial;
    else as many Numba threads as torch's, which the caller restores afterwards)."""
    from espnet_multiblank.loss import cpu

    return cpu.pick_parallel(num_elements)


def cpu_serial_twin(kernel):
    """A single-threaded copy of a ``parallel=True`` Numba kernel (prange as range),
    cached on disk beside it (the dense CPU driver's)."""
    from espnet_multiblank.loss import cpu

    return cpu.serial_twin(kernel)


def gradient_flush_below() -> float:
    """The dense path's relative bound below which gradient values are set to 0
    (:mod:`espnet_multiblank.loss.flush`)."""
    from espnet_multiblank.loss.flush import GRADIENT_FLUSH_BELOW

    return GRADIENT_FLUSH_BELOW


def cpu_row_ops():
    """The dense CPU kernels' range primitives (a module of Numba functions; imported
    on first use, so that importing the package does not import Numba)."""
    from espnet_multiblank.loss.cpu import row_ops

    return row_ops
