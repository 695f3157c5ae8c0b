"""Launch layer of the CUDA TDT kernels: torch tensors in, torch tensors out.

Same scheme and the same two contracts as :mod:`espnet_multiblank.loss.cuda.launch`
(whose helpers it uses): :func:`tdt_compute` (all four kernels, no host
synchronisation) and :func:`tdt_begin` / :func:`tdt_finish` (the gradient kernel in
the autograd backward with the incoming gradient folded in).

Memory per (b, t, u) row besides the logits and the gradient buffer (the logits'
size and dtype): float64 ``denom`` (B, T, U, 2) and ``lpw`` (B, T, U, 2 + D), kept
until the gradient is finished, ``alphas`` and ``betas`` (B, T, U), freed when
:func:`tdt_begin` returns: 8 (D + 6) bytes per row at the peak, 8 (D + 4) held
between forward and backward, plus O(B).
"""

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch

from espnet_multiblank.loss.cuda.launch import (
    CELL_BLOCK,
    check_device,
    cost_dtype,
    diag_threads,
    factors_tensor,
    kernel_array,
    prepare_ints,
    row_config,
    row_grid,
    run_on_stream,
    storage_of,
)
from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_kernels
from espnet_multiblank.loss.tdt_options import TDTOptions


@dataclass
class PendingCudaTDTGradient:
    """What the TDT gradient kernel needs, kept from ``tdt_begin`` to ``tdt_finish``.

    Attributes:
        buffer: (B, T, U, V + D) logits dtype, uninitialised (becomes the gradient).
        acts: the logits, C-contiguous.
        labels: (B, max(L, 1)) int64; act_lens, label_lens: (B,) int64.
        denom: (B, T, U, 2) float64.  wts: (B, T, U, 2 + D) float64 occupancies.
        logp: (B,) float64.
    """

    buffer: torch.Tensor
    acts: torch.Tensor
    labels: torch.Tensor
    act_lens: torch.Tensor
    label_lens: torch.Tensor
    denom: torch.Tensor
    wts: torch.Tensor
    logp: torch.Tensor

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return (
            self.buffer,
            self.acts,
            self.labels,
            self.act_lens,
            self.label_lens,
            self.denom,
            self.wts,
            self.logp,
        )


def tdt_forward(acts, labels, act_lens, label_lens, opts: TDTOptions, need_grad):
    """Kernels 1-3 (3 only when need_grad): ``(costs, pending or None)``, no host
    synchronisation; costs (B,) float64 for float64 logits, float32 otherwise."""
    check_device(acts)
    acts = acts.detach().contiguous()
    B, T, U, VD = acts.shape
    lattice = opts.lattice
    D = lattice.num_durations
    V = VD - D
    dev = acts.device
    costs = torch.empty((B,), dtype=cost_dtype(acts.dtype), device=dev)
    labels, act_lens, label_lens = prepare_ints(labels, act_lens, label_lens, B, dev)
    ws = dict(dtype=torch.float64, device=dev)
    denom = torch.empty((B, T, U, 2), **ws)
    lpw = torch.empty((B, T, U, 2 + D), **ws)
    logp = torch.empty((B,), **ws)
    pending = None
    if need_grad:
        pending = PendingCudaTDTGradient(
            torch.empty_like(acts), acts, labels, act_lens, label_lens, denom, lpw, logp
        )
    if B == 0:
        return costs, pending
    if T == 0:  # every T_b = 0: the empty path (cost 0) or impossible (+inf)
        lp0 = torch.where(label_lens == 0, 0.0, float("-inf")).to(**ws)
        logp.copy_(lp0)
        costs.copy_(-(1.0 + opts.fastemit_lambda) * lp0 + 0.0)
        return costs, pending

    rows = B * T * U
    alphas = torch.empty((B, T, U), **ws)
    betas = torch.empty((B, T, U) if need_grad else (1, 1, 1), **ws)
    bad = torch.zeros((B,), dtype=torch.int32, device=dev)
    cfg_row = row_config(V)
    row_stats, alpha_beta, weights_k, _ = get_tdt_kernels(
        storage_of(acts.dtype), lattice, cfg_row
    )
    k = kernel_array
    do_beta = 1 if need_grad else 0

    def body(cfg):
        a_lens, a_llens, a_lpw, a_bad = k(act_lens), k(label_lens), k(lpw), k(bad)
        a_alphas, a_betas, a_logp = k(alphas), k(betas), k(logp)
        cfg(row_stats, row_grid(rows, cfg_row), cfg_row[1])(
            k(acts),
            k(labels),
            a_lens,
            a_llens,
            int(lattice.blank),
            V,
            float(opts.sigma),
            k(denom),
            a_lpw,
            a_bad,
        )
        cfg(alpha_beta, (B, 1 + do_beta), diag_threads(T, U))(
            a_lpw,
            a_lens,
            a_llens,
            a_bad,
            float(opts.fastemit_lambda),
            do_beta,
            a_alphas,
            a_betas,
            a_logp,
            k(costs),
        )
        if need_grad:
            cfg(weights_k, -(-rows // CELL_BLOCK), CELL_BLOCK)(
                a_lpw, a_lens, a_llens, a_alphas, a_betas, a_logp
            )

    run_on_stream(dev, body)
    return costs, pending


def tdt_gradient(tensors, opts: TDTOptions, factors: torch.Tensor) -> torch.Tensor:
    """Kernel 4 into the pending buffer (returned); ``factors`` (B,) float64 on the
    logits' device."""
    buffer, acts, labels, act_lens, label_lens, denom, wts, logp = tensors
    B, T, U, VD = acts.shape
    lattice = opts.lattice
    V = VD - lattice.num_durations
    rows = B * T * U
    if rows == 0:
        return buffer
    cfg_row = row_config(V)
    *_, grad_k = get_tdt_kernels(storage_of(acts.dtype), lattice, cfg_row)
    k = kernel_array

    def body(cfg):
        cfg(grad_k, row_grid(rows, cfg_row), cfg_row[1])(
            k(acts),
            k(labels),
            k(act_lens),
            k(label_lens),
            int(lattice.blank),
            V,
            float(opts.fastemit_lambda),
            float(opts.clamp),
            k(factors),
            k(denom),
            k(wts),
            k(logp),
            k(buffer),
        )

    run_on_stream(acts.device, body)
    return buffer


def tdt_begin(acts, labels, act_lens, label_lens, opts: TDTOptions, need_grad: bool):
    """Kernels 1-3: ``(costs (B,) float64 numpy, pending or None)`` (one host sync)."""
    costs, pending = tdt_forward(acts, labels, act_lens, label_lens, opts, need_grad)
    return costs.to("cpu", torch.float64).numpy(), pending


def tdt_finish(tensors, opts: TDTOptions, factors: np.ndarray) -> torch.Tensor:
    """Kernel 4: the gradient (``tensors[0]``, filled), utterance b's clamped
    gradient times ``factors[b]`` ((B,) float64 numpy)."""
    return tdt_gradient(tensors, opts, factors_tensor(factors, tensors[0].device))


def tdt_compute(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    grad_weights: torch.Tensor,
    need_grad: bool,
):
    """See :func:`espnet_multiblank.loss.cuda.tdt_compute` (same contract)."""
    costs, pending = tdt_forward(acts, labels, act_lens, label_lens, opts, need_grad)
    if not need_grad:
        return costs, None
    grads = tdt_gradient(
        pending.tensors(), opts, factors_tensor(grad_weights, pending.acts.device)
    )
    return costs, grads
