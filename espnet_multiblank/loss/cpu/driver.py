"""Host-side driver of the CPU kernels: workspaces, threads, the kernel contract.

Two entry points (see ``espnet_multiblank.loss.function`` for how autograd uses them):

* :func:`begin` runs passes 1 and 2 (costs; the gradient buffer holds the exps) and
  returns a :class:`PendingGradient`; :meth:`PendingGradient.finish` runs pass 3 in
  place with the per-utterance factors known only in backward (reduction weight times
  incoming gradient), so any incoming gradient costs no second logits-sized buffer;
* :func:`compute` = ``begin`` + ``finish(grad_weights)``: the plain contract
  ``(costs, grads)`` shared with the CUDA backend.
"""

import contextlib
import functools
import os
import types
from dataclasses import dataclass
from typing import Optional, Tuple

import numba
import numpy as np
import torch

from espnet_multiblank.loss.cpu import kernels
from espnet_multiblank.loss.options import LossOptions


def _serial_twin(dispatcher):
    """A single-threaded copy of a ``parallel=True`` kernel (prange runs as range).

    It gets its own qualified name so that Numba's on-disk cache keeps both versions.
    """
    f = dispatcher.py_func
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial")
    g.__qualname__ = f.__qualname__ + "_serial"
    opts = {
        k: v
        for k, v in dispatcher.targetoptions.items()
        if k not in ("parallel", "nopython")
    }
    opts.setdefault("cache", True)
    return numba.njit(**opts)(g)


_PARALLEL = (kernels.rows_forward, kernels.lattice, kernels.rows_backward)
_SERIAL = tuple(_serial_twin(k) for k in _PARALLEL)

# GNU OpenMP (Numba's default "omp" threading layer here) aborts a forked child that
# starts a parallel region once the parent has used one ("Terminating: fork() called
# from a process already using GNU OpenMP"). Forked children (DataLoader workers,
# multiprocessing pools) therefore run the serial kernels.
_state = {"parallel_used": False, "forked": False}


def _after_fork_in_child():
    _state["forked"] = _state["parallel_used"]


os.register_at_fork(after_in_child=_after_fork_in_child)


# Below this many logits a parallel launch costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 18


@contextlib.contextmanager
def _kernel_set(num_elements: int):
    """Pick serial or parallel kernels; for parallel, use as many Numba threads as torch
    is allowed (torch.set_num_threads) and leave the caller's Numba setting unchanged.
    Yields ``_PARALLEL`` or ``_SERIAL`` (the TDT driver compares with ``is``).
    """
    n = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if n == 1 or _state["forked"] or num_elements < PARALLEL_MIN_ELEMENTS:
        yield _SERIAL
        return
    _state["parallel_used"] = True
    prev = numba.get_num_threads()
    if n != prev:
        numba.set_num_threads(n)
    try:
        yield _PARALLEL
    finally:
        if n != prev:
            numba.set_num_threads(prev)


@dataclass
class PendingGradient:
    """What pass 3 needs; ``buffer`` becomes the gradient in place.

    Attributes:
        buffer: (B, T, U, V) acts dtype: exps of pass 1 (padding rows already 0).
        occupancy: (B, N + 2, T + U - 1, U + COLUMN_PAD) float64, by anti-diagonal.
        coef: (B, T + U - 1, U + COLUMN_PAD) float64, by anti-diagonal.
        log_p: (B,) float64.
        labels, act_lens, label_lens: the kernel's int64 inputs.
    """

    buffer: torch.Tensor
    occupancy: torch.Tensor
    coef: torch.Tensor
    log_p: torch.Tensor
    labels: torch.Tensor
    act_lens: torch.Tensor
    label_lens: torch.Tensor

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return (
            self.buffer,
            self.occupancy,
            self.coef,
            self.log_p,
            self.labels,
            self.act_lens,
            self.label_lens,
        )

    @staticmethod
    def finish_tensors(
        tensors: Tuple[torch.Tensor, ...], opts: LossOptions, factors
    ) -> torch.Tensor:
        """Run pass 3 on :meth:`tensors` (e.g. as saved by autograd) and return the
        gradient (the buffer itself).

        Args:
            factors: (B,) per-utterance factor (reduction weight times incoming
                gradient, any sign): a CPU tensor or a numpy array.
        """
        buffer, occupancy, coef, log_p, labels, act_lens, label_lens = tensors
        with _kernel_set(buffer.numel()) as (_, _, rows_backward):
            rows_backward(
                labels.numpy(),
                act_lens.numpy(),
                label_lens.numpy(),
                opts.blank,
                _ids(opts.big_blank_ids),
                occupancy.numpy(),
                coef.numpy(),
                log_p.numpy(),
                opts.fastemit_lambda,
                opts.clamp,
                np.ascontiguousarray(factors, dtype=np.float64),
                buffer.numpy(),
            )
        return buffer

    def finish(self, opts: LossOptions, factors) -> torch.Tensor:
        return self.finish_tensors(self.tensors(), opts, factors)


@functools.lru_cache(maxsize=64)
def _ids(values: Tuple[int, ...]) -> np.ndarray:
    out = np.asarray(values, dtype=np.int64)
    out.setflags(write=False)
    return out


def begin(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: LossOptions,
    need_grad: bool,
) -> Tuple[np.ndarray, Optional[PendingGradient]]:
    """Passes 1 and 2: costs and, when ``need_grad``, the pending gradient.

    Args:
        acts: (B, T, U, V) contiguous float32/float64 CPU tensor of raw logits.
        labels: (B, L) int64, L <= U - 1, padding replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: loss options.
        need_grad: whether the gradient will be wanted.
    Returns:
        costs: (B,) float64 numpy array, ``-(1 + lambda) log P`` (+inf if impossible,
            NaN if a valid row holds NaN / +inf logits or only -inf).
        pending: :class:`PendingGradient` or None (not need_grad, or NaN costs).
    """
    B, T, U, V = acts.shape
    N = opts.num_big_blanks
    ND = max(T + U - 1, 1)
    C = U + kernels.COLUMN_PAD
    x = acts.numpy()
    if not labels.is_contiguous():
        labels = labels.contiguous()
    lab, al, ll = labels.numpy(), act_lens.numpy(), label_lens.numpy()
    # numpy allocates (malloc): glibc reuses freed heap blocks of up to 32 MB, whereas
    # torch's aligned allocations of a few MB are fresh mmaps every call, and a page
    # fault costs about 1 ns per byte on the virtual machines measured (bench/)
    LP = np.empty((B, N + 2, ND, C), np.float64)
    AC = np.empty((B, ND, C), np.float64)
    inv_sums = np.empty((B, ND, C), np.float64)
    log_p = np.empty(B, np.float64)
    bad = np.zeros(B, np.uint8)
    buffer = np.empty(acts.shape, x.dtype) if need_grad else x
    with _kernel_set(acts.numel()) as (rows_forward, lattice, _):
        rows_forward(
            x,
            lab,
            al,
            ll,
            opts.blank,
            _ids(opts.big_blank_ids),
            opts.sigma,
            need_grad,
            buffer,
            LP,
            inv_sums,
            bad,
        )
        if bad.any():
            costs = np.zeros(B, np.float64)
            costs[bad.astype(bool)] = np.nan
            return costs, None
        lattice(
            LP,
            inv_sums,
            AC,
            al,
            ll,
            _ids(opts.big_blank_durations),
            opts.fastemit_lambda,
            need_grad,
            log_p,
        )
    costs = -(1.0 + opts.fastemit_lambda) * log_p + 0.0
    if not need_grad:
        return costs, None
    pending = PendingGradient(
        torch.from_numpy(buffer),
        torch.from_numpy(LP),
        torch.from_numpy(AC),
        torch.from_numpy(log_p),
        labels,
        act_lens,
        label_lens,
    )
    return costs, pending


def compute(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: LossOptions,
    grad_weights: torch.Tensor,
    need_grad: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Costs and (optionally) gradients on CPU (the CUDA backend's contract).

    Args:
        acts, labels, act_lens, label_lens, opts, need_grad: as for :func:`begin`.
        grad_weights: (B,) per-utterance weight applied after the clamp.
    Returns:
        costs: (B,) acts.dtype (see :func:`begin`).
        grads: (B, T, U, V) acts.dtype or None; zeros when a cost is NaN.
    """
    costs, pending = begin(acts, labels, act_lens, label_lens, opts, need_grad)
    costs = torch.from_numpy(costs).to(acts.dtype)
    if not need_grad:
        return costs, None
    if pending is None:  # NaN / +inf logits: the caller raises
        return costs, torch.zeros_like(acts)
    return costs, pending.finish(opts, grad_weights.detach())


# the autograd Function runs pass 3 in backward when the kernel offers ``begin``
compute.begin = begin
compute.finish = PendingGradient.finish_tensors
