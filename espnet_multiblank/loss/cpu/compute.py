"""Host-side driver of the CPU kernels: workspaces, threads, the kernel contract."""

import contextlib
from typing import Optional, Tuple

import numba
import numpy as np
import torch

from espnet_multiblank.loss.cpu import kernels
from espnet_multiblank.loss.options import LossOptions


@contextlib.contextmanager
def _numba_threads():
    """Use as many Numba threads as torch is allowed (torch.set_num_threads), and leave
    the caller's Numba thread setting as it was."""
    n = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    prev = numba.get_num_threads()
    if n != prev:
        numba.set_num_threads(n)
    try:
        yield
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
    with _numba_threads():
        kernels.row_statistics(x, lab, al, ll, opts.blank, big_ids, opts.sigma, lp, denom, bad)
        if bad.any():
            costs = torch.zeros(B, dtype=acts.dtype)
            costs[torch.from_numpy(bad.astype(bool))] = float("nan")
            return costs, (torch.zeros_like(acts) if need_grad else None)
        kernels.alpha_beta(
            lp, al, ll, durations, alpha, beta, log_p, opts.fastemit_lambda, need_grad
        )
        if need_grad:
            grads = torch.empty_like(acts)
            w = grad_weights.to(torch.float64).numpy()
            kernels.gradients(
                # after alpha_beta, lp holds the occupancies and alpha the coefficients
                x, lab, al, ll, opts.blank, big_ids, denom, lp, alpha, log_p,
                opts.fastemit_lambda, opts.clamp, w, grads.numpy(),
            )
    costs = torch.from_numpy(-(1.0 + opts.fastemit_lambda) * log_p).to(acts.dtype)
    return costs, grads
