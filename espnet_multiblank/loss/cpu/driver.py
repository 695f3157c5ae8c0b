"""Host-side driver of the CPU kernels: workspaces, threads, the kernel contract."""

import contextlib
import os
import types
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
    return numba.njit(cache=True)(g)


_PARALLEL = (kernels.row_statistics, kernels.alpha_beta, kernels.gradients)
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


def compute(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: LossOptions,
    grad_weights: torch.Tensor,
    need_grad: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Costs and (optionally) gradients on CPU.

    Args:
        acts: (B,T,U,V) contiguous float32/float64 CPU tensor of raw logits.
        labels: (B,L) int64, L <= U-1, padding replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: loss options.
        grad_weights: (B,) per-utterance weight applied after the clamp.
        need_grad: whether to compute the gradient.
    Returns:
        costs: (B,) acts.dtype, ``-(1 + lambda) log P`` (+inf if impossible, NaN if a
            valid row holds NaN/+inf logits).
        grads: (B,T,U,V) acts.dtype or None.
    """
    B, T, U, V = acts.shape
    N = opts.num_big_blanks
    x = acts.numpy()
    lab = labels.numpy()
    al = act_lens.numpy()
    ll = label_lens.numpy()
    big_ids = np.asarray(opts.big_blank_ids, dtype=np.int64)
    durations = np.asarray(opts.big_blank_durations, dtype=np.int64)

    lp = np.empty((B, T, U, N + 2), np.float64)
    denom = np.empty((B, T, U), np.float64)
    alpha = np.empty((B, T, U), np.float64)
    beta = np.empty((B, T, U), np.float64) if need_grad else alpha[:0]
    log_p = np.empty(B, np.float64)
    bad = np.zeros(B, np.uint8)
    grads = None
    with _kernel_set(acts.numel()) as (row_statistics, alpha_beta, gradients):
        row_statistics(x, lab, al, ll, opts.blank, big_ids, opts.sigma, lp, denom, bad)
        if bad.any():
            costs = torch.zeros(B, dtype=acts.dtype)
            costs[torch.from_numpy(bad.astype(bool))] = float("nan")
            return costs, (torch.zeros_like(acts) if need_grad else None)
        alpha_beta(
            lp, al, ll, durations, alpha, beta, log_p, opts.fastemit_lambda, need_grad
        )
        if need_grad:
            grads = torch.empty_like(acts)
            w = grad_weights.to(torch.float64).numpy()
            gradients(
                # after alpha_beta, lp holds the occupancies and alpha the coefficients
                x,
                lab,
                al,
                ll,
                opts.blank,
                big_ids,
                denom,
                lp,
                alpha,
                log_p,
                opts.fastemit_lambda,
                opts.clamp,
                w,
                grads.numpy(),
            )
    costs = torch.from_numpy(-(1.0 + opts.fastemit_lambda) * log_p + 0.0).to(acts.dtype)
    return costs, grads
