"""Host-side driver of the CPU TDT kernels (workspaces, threads, the kernel contract).

Threads follow the multi-blank driver (:mod:`espnet_multiblank.loss.cpu.driver`): its
``_kernel_set`` decides between the parallel kernels and their single-threaded twins
(small problems, forked children, one torch thread) and sets / restores Numba's thread
count; this module only swaps in the TDT kernels of the same kind.
"""

from typing import Optional, Tuple

import numpy as np
import torch

from espnet_multiblank.loss.cpu import driver, tdt_kernels
from espnet_multiblank.loss.tdt_options import TDTOptions

_PARALLEL = (
    tdt_kernels.tdt_row_statistics,
    tdt_kernels.tdt_alpha_beta,
    tdt_kernels.tdt_gradients,
)
_SERIAL = tuple(driver._serial_twin(k) for k in _PARALLEL)


def tdt_compute(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    grad_weights: torch.Tensor,
    need_grad: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """TDT costs and (optionally) gradients on CPU.

    Args:
        acts: (B, T, U, V + D) contiguous float32/float64 CPU tensor of raw logits.
        labels: (B, L) int64, L <= U - 1, padding replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: TDT options (``omega`` is not looked at: the caller draws it).
        grad_weights: (B,) per-utterance weight applied after the clamp.
        need_grad: whether to compute the gradient.
    Returns:
        costs: (B,) acts.dtype, ``-(1 + lambda) log P`` (+inf if impossible, NaN if a
            valid row holds NaN / +inf logits).
        grads: (B, T, U, V + D) acts.dtype or None.
    """
    B, T, U, VD = acts.shape
    D = opts.num_durations
    V = VD - D
    x = acts.numpy()
    lab = labels.numpy()
    al = act_lens.numpy()
    ll = label_lens.numpy()
    durations = np.asarray(opts.durations, dtype=np.int64)

    lp = np.empty((B, T, U, 2 + D), np.float64)
    inv_sums = np.empty((B, T, U, 2), np.float64)
    alpha = np.empty((B, T, U), np.float64)
    beta = np.empty((B, T, U), np.float64) if need_grad else alpha[:0]
    log_p = np.empty(B, np.float64)
    bad = np.zeros(B, np.uint8)
    grads = torch.empty_like(acts) if need_grad else None
    exps = grads.numpy() if need_grad else x[:0]
    with driver._kernel_set(acts.numel()) as chosen:
        kernels = _PARALLEL if chosen is driver._PARALLEL else _SERIAL
        row_statistics, alpha_beta, gradients = kernels
        row_statistics(
            x,
            lab,
            al,
            ll,
            opts.blank,
            V,
            opts.sigma,
            lp,
            inv_sums,
            bad,
            exps,
            need_grad,
        )
        if bad.any():
            costs = torch.zeros(B, dtype=acts.dtype)
            costs[torch.from_numpy(bad.astype(bool))] = float("nan")
            return costs, (torch.zeros_like(acts) if need_grad else None)
        alpha_beta(lp, al, ll, durations, alpha, beta, log_p, need_grad)
        if need_grad:
            gradients(
                lab,
                al,
                ll,
                opts.blank,
                V,
                inv_sums,
                lp,  # after alpha_beta: the step occupancies
                log_p,
                opts.fastemit_lambda,
                opts.clamp,
                grad_weights.to(torch.float64).numpy(),
                exps,
            )
    costs = torch.from_numpy(-(1.0 + opts.fastemit_lambda) * log_p + 0.0).to(acts.dtype)
    return costs, grads
