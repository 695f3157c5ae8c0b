"""Host-side driver of the CPU TDT kernels (workspaces, threads, the kernel contract).

Threads follow the multi-blank driver (:mod:`espnet_multiblank.loss.cpu.driver`): its
``_kernel_set`` decides between the parallel kernels and their single-threaded twins
(small problems, forked children, one torch thread) and sets / restores Numba's thread
count; this module only swaps in the TDT kernels of the same kind.

Entry points, as the autograd Function of ``espnet_multiblank.loss.function`` expects:

* :func:`tdt_compute` ``(acts, labels, act_lens, label_lens, opts, grad_weights,
  need_grad) -> (costs, grads)``: all three passes;
* ``tdt_compute.begin`` (:func:`tdt_begin`): passes 1 and 2, the gradient buffer
  holding the exps; ``tdt_compute.finish`` (:func:`tdt_finish`): pass 3 in place with
  per-utterance factors known only in backward (reduction weight times the incoming
  gradient), so that any incoming gradient costs no second logits-sized buffer.
"""

import contextlib
from dataclasses import dataclass
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


@contextlib.contextmanager
def _kernels(num_elements: int):
    """The TDT kernel triple of the kind (parallel or serial) that the multi-blank
    driver picks, with its thread settings."""
    with driver._kernel_set(num_elements) as chosen:
        yield _PARALLEL if chosen is driver._PARALLEL else _SERIAL


@dataclass
class PendingTDTGradient:
    """What pass 3 needs; ``buffer`` becomes the gradient in place.

    Attributes:
        buffer: (B, T, U, V + D) acts dtype: exp(x - max) of both parts at valid rows.
        occupancy: (B, T, U, 2 + D) float64: W_blank, W_label, W_dur(0..D-1).
        inv_sums: (B, T, U, 2) float64: 1 / sum of exps of each part.
        log_p: (B,) float64.
        labels, act_lens, label_lens: the kernel's int64 inputs.
    """

    buffer: torch.Tensor
    occupancy: torch.Tensor
    inv_sums: torch.Tensor
    log_p: torch.Tensor
    labels: torch.Tensor
    act_lens: torch.Tensor
    label_lens: torch.Tensor

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return (
            self.buffer,
            self.occupancy,
            self.inv_sums,
            self.log_p,
            self.labels,
            self.act_lens,
            self.label_lens,
        )


def tdt_begin(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    need_grad: bool,
) -> Tuple[torch.Tensor, Optional[PendingTDTGradient]]:
    """Passes 1 and 2: costs and, when ``need_grad``, the pending gradient.

    Args:
        acts: (B, T, U, V + D) contiguous float32/float64 CPU tensor of raw logits.
        labels: (B, L) int64, L <= U - 1, padding replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: TDT options (``omega`` is not looked at: the caller draws it).
        need_grad: whether the gradient will be wanted.
    Returns:
        costs: (B,) acts.dtype, ``-(1 + lambda) log P`` (+inf if impossible, NaN if a
            valid row holds NaN / +inf logits, or a part of only -inf).
        pending: :class:`PendingTDTGradient`, or None (not need_grad, or NaN costs).
    """
    B, T, U, VD = acts.shape
    D = opts.num_durations
    V = VD - D
    x = acts.numpy()
    lab = labels.contiguous().numpy()
    al = act_lens.contiguous().numpy()
    ll = label_lens.contiguous().numpy()
    durations = np.asarray(opts.durations, dtype=np.int64)

    lp = torch.empty((B, T, U, 2 + D), dtype=torch.float64)
    inv_sums = torch.empty((B, T, U, 2), dtype=torch.float64)
    alpha = np.empty((B, T, U), np.float64)
    beta = np.empty((B, T, U), np.float64) if need_grad else alpha[:0]
    log_p = torch.empty(B, dtype=torch.float64)
    bad = np.zeros(B, np.uint8)
    buffer = torch.empty_like(acts) if need_grad else None
    exps = buffer.numpy() if need_grad else x[:0]
    with _kernels(acts.numel()) as (row_statistics, alpha_beta, _):
        row_statistics(
            x,
            lab,
            al,
            ll,
            opts.blank,
            V,
            opts.sigma,
            lp.numpy(),
            inv_sums.numpy(),
            bad,
            exps,
            need_grad,
        )
        if bad.any():
            costs = torch.zeros(B, dtype=acts.dtype)
            costs[torch.from_numpy(bad.astype(bool))] = float("nan")
            return costs, None
        alpha_beta(lp.numpy(), al, ll, durations, alpha, beta, log_p.numpy(), need_grad)
    lam = opts.fastemit_lambda
    costs = (-(1.0 + lam) * log_p + 0.0).to(acts.dtype)
    pending = None
    if need_grad:
        pending = PendingTDTGradient(
            buffer, lp, inv_sums, log_p, labels, act_lens, label_lens
        )
    return costs, pending


def tdt_finish(
    tensors: Tuple[torch.Tensor, ...], opts: TDTOptions, factors: torch.Tensor
) -> torch.Tensor:
    """Pass 3 on :meth:`PendingTDTGradient.tensors` (e.g. as saved by autograd): the
    buffer becomes ``factors[b] * clip(d cost_b / d acts_b)`` in place and is returned.

    Args:
        factors: (B,) per-utterance factor (any float dtype and sign, CPU).
    """
    buffer, occupancy, inv_sums, log_p, labels, act_lens, label_lens = tensors
    V = buffer.shape[3] - opts.num_durations
    f = factors.detach().to(torch.float64).contiguous().numpy()
    with _kernels(buffer.numel()) as (_, _, gradients):
        gradients(
            labels.contiguous().numpy(),
            act_lens.contiguous().numpy(),
            label_lens.contiguous().numpy(),
            opts.blank,
            V,
            inv_sums.numpy(),
            occupancy.numpy(),
            log_p.numpy(),
            opts.fastemit_lambda,
            opts.clamp,
            f,
            buffer.numpy(),
        )
    return buffer


def tdt_compute(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    grad_weights: torch.Tensor,
    need_grad: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """TDT costs and (optionally) gradients on CPU (:func:`tdt_begin` + pass 3).

    Args:
        acts: (B, T, U, V + D) contiguous float32/float64 CPU tensor of raw logits.
        labels: (B, L) int64; act_lens, label_lens: (B,) int64.
        opts: TDT options.
        grad_weights: (B,) per-utterance weight applied after the clamp.
        need_grad: whether to compute the gradient.
    Returns:
        costs: (B,) acts.dtype (see :func:`tdt_begin`).
        grads: (B, T, U, V + D) acts.dtype (zeros when a cost is NaN) or None.
    """
    costs, pending = tdt_begin(acts, labels, act_lens, label_lens, opts, need_grad)
    if not need_grad:
        return costs, None
    if pending is None:  # NaN costs: the caller raises
        return costs, torch.zeros_like(acts)
    return costs, tdt_finish(pending.tensors(), opts, grad_weights)


tdt_compute.begin = tdt_begin
tdt_compute.finish = tdt_finish
