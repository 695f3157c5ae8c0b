"""The three stages of every loss of this package, and the interface between them.

A transducer loss over a (B, T, U, V') tensor of logits (V' = V, or V + D for a TDT)
is computed in three stages. Only the first and the last ever touch V'-sized rows;
the middle one works on a few numbers per lattice node (t, u):

1. **extract**: from each valid node's row of logits, the log-softmax normaliser
   and the log-probabilities of the few symbols the lattice uses there (standard
   RNN-T: the blank and the next label; multi-blank: also each big blank; TDT: the
   token blank and label, and the whole duration head) -> the node's *row* of
   ``rows``;
2. **lattice**: the forward and backward sweeps over those rows only: the costs
   ``-(1 + lambda) log P`` and, when the gradient is wanted, each node's transition
   occupancies (the probability that a path takes the transition), with sigma and
   FastEmit folded in;
3. **apply**: the gradient from the occupancies: written into a logits-sized buffer
   (the dense path of :mod:`espnet_multiblank.loss.function`), or contracted into a
   joint network's parameters by a caller that recomputes the logits tile by tile.

The definitions (recursions, gradients, sigma, FastEmit) are in ``docs/lattice.md``;
the data that passes between the stages, one row of a few float64 numbers per node
laid out by the lattice's family record, is the contract of
:mod:`espnet_multiblank.loss.rows`.

Functions
---------
* :func:`run_lattice` (lattice): the stage the fused joint + loss shares with the
  dense path, on rows it extracted itself; it runs where the rows live (numpy rows
  and CPU tensors: the CPU Numba kernels; CUDA tensors: the Numba CUDA kernels;
  ``backend="torch"`` or a device Numba cannot target: the PyTorch recursion), each
  runner the family record's;
* :func:`extract_rows` and :func:`apply_rows` (extract and dense apply), the dense
  path's stages 1 and 3 on the CPU (the autograd Function runs them through
  ``espnet_multiblank.loss.cpu.driver``, which uses the same kernels).

The CPU kernels run serial or parallel and with as many threads as the driver chooses
for the loss itself (``torch.get_num_threads()``, single-threaded for small problems
and in forked children), leaving Numba's and torch's thread settings as they were.
"""

from typing import Optional, Tuple

import numpy as np

from espnet_multiblank.loss.dispatch import check_backend, numba_kernel
from espnet_multiblank.loss.families import family_of


def run_lattice(opts, rows, act_lens, label_lens, need_grad: bool, *, backend="auto"):
    """The lattice stage on extracted rows: log P per utterance.

    Args:
        opts: validated options of either family
            (:class:`~espnet_multiblank.loss.options.LossOptions` or
            :class:`~espnet_multiblank.loss.options.TDTOptions`); ``blank``,
            ``sigma``, ``clamp`` and ``reduction`` are not used here.
        rows: (B, T, U, width) float64 C-contiguous (``loss/rows.py``): a numpy
            array (the CPU kernels) or a tensor (the kernels of its device); when
            ``need_grad``, the valid rows of every possible utterance are
            overwritten with the occupancies and coefficients.
        act_lens, label_lens: (B,) int64, ``T_b <= T``, ``L_b <= U - 1``: numpy
            arrays with numpy rows, else tensors on the rows' device.
        need_grad: whether to run the backward sweep (the occupancies).
        backend: for tensor rows, "auto" (the Numba kernels of their device, PyTorch
            where there are none), "numba" or "torch".

    Returns:
        (B,) float64 ``log P`` (numpy for numpy rows, else a tensor on the rows'
        device): 0 for ``T_b = 0 = L_b``, ``-inf`` for an impossible utterance (no
        complete path). The cost is ``-(1 + fastemit_lambda) log P``.

    Raises:
        TypeError / ValueError when the arrays break the contract.
    """
    family = family_of(opts)
    if isinstance(rows, np.ndarray):
        kernel = family.cpu_driver()
    else:
        check_backend(backend)
        kernel = numba_kernel(family, rows.device, backend, "rows")
    run = family.torch_lattice if kernel is None else kernel.lattice
    return run(opts, rows, act_lens, label_lens, bool(need_grad))


def extract_rows(
    opts,
    acts: np.ndarray,
    labels: np.ndarray,
    act_lens: np.ndarray,
    label_lens: np.ndarray,
    store_exps: bool,
) -> Tuple[np.ndarray, Optional[np.ndarray], np.ndarray]:
    """The extract stage of the dense path (one read of the logits).

    Args:
        opts: validated options of either family.
        acts: (B, T, U, V') float32 / float64 C-contiguous raw logits.
        labels: (B, L) int64 C-contiguous, ``L >= max L_b``, padding replaced by
            valid ids; act_lens, label_lens: (B,) int64 (validated).
        store_exps: also return the exps of the valid rows (the dense apply stage
            turns them into the gradient), padding rows zeroed.

    Returns:
        ``(rows, exps or None, bad)``: rows (B, T, U, width) float64 as the module
        docstring describes (``r = 1 / S``); exps (B, T, U, V') in acts' dtype;
        bad (B,) bool, True for an utterance with a NaN / +inf logit in a valid row
        or a distribution of only -inf (its rows are unusable).
    """
    driver = family_of(opts).cpu_driver()
    B, T, U, _ = acts.shape
    rows = np.empty((B, T, U, driver.width(opts)), np.float64)
    bad = np.zeros(B, np.uint8)
    exps = np.empty(acts.shape, acts.dtype) if store_exps else None
    buffer = acts if exps is None else exps
    args = (acts, labels, act_lens, label_lens, opts, store_exps, buffer, rows, bad)
    driver.run_stage(acts.size, driver.extract, *args)
    return rows, exps, bad.astype(bool)


def apply_rows(
    opts,
    rows: np.ndarray,
    log_p: np.ndarray,
    exps: np.ndarray,
    labels: np.ndarray,
    act_lens: np.ndarray,
    label_lens: np.ndarray,
    factors: np.ndarray,
) -> np.ndarray:
    """The dense apply stage: ``exps`` (from :func:`extract_rows`) becomes, in
    place, ``factors[b] * clip(d cost_b / d acts_b, -clamp, clamp)`` and is returned.

    Args:
        rows: the output of :func:`run_lattice` with ``need_grad``; log_p its (B,)
            result; labels, act_lens, label_lens as for :func:`extract_rows`;
            factors: (B,) float64 (reduction weight times incoming gradient).
    """
    driver = family_of(opts).cpu_driver()
    factors = np.ascontiguousarray(factors, dtype=np.float64)
    args = (labels, act_lens, label_lens, opts, rows, log_p, factors, exps)
    driver.run_stage(exps.size, driver.apply, *args)
    return exps
