"""Host-side driver of the CPU TDT kernels (workspaces, threads, the kernel contract).

The same contract as the multi-blank driver (:mod:`espnet_multiblank.loss.cpu.driver`,
whose thread choice it uses: parallel kernels or their single-threaded twins):

* :func:`tdt_begin` runs passes 1 and 2 (costs; the gradient buffer holds the exps)
  and returns the tensors pass 3 needs; :func:`tdt_finish` runs pass 3 on them in
  place with the per-utterance factors known only in backward (reduction weight times
  incoming gradient), so any incoming gradient costs no second logits-sized buffer;
* :func:`tdt_compute` = ``tdt_begin`` + ``tdt_finish(grad_weights)``: the plain
  contract ``(costs, grads)`` shared with the CUDA backend.
"""

import functools
from typing import Optional, Tuple

import numba
import numpy as np
import torch

from espnet_multiblank.loss.cpu import driver, tdt_kernels
from espnet_multiblank.loss.tdt_options import TDTOptions

_PARALLEL = (
    tdt_kernels.tdt_rows_forward,
    tdt_kernels.tdt_lattice,
    tdt_kernels.tdt_rows_backward,
)
_SERIAL = tuple(driver._serial_twin(k) for k in _PARALLEL)


def _pick(num_elements: int):
    """The TDT kernel triple of the kind the multi-blank driver picks, and the Numba
    thread count to restore afterwards (or None)."""
    chosen, prev = driver._pick(num_elements)
    return (_PARALLEL if chosen is driver._PARALLEL else _SERIAL), prev


@functools.lru_cache(maxsize=256)
def _durations(opts: TDTOptions) -> np.ndarray:
    d = np.asarray(opts.durations, dtype=np.int64)
    d.setflags(write=False)
    return d


# pass 2 sweeps the anti-diagonals of several utterances in one vector loop: about
# this many columns (nodes of an anti-diagonal) per group of utterances
GROUP_COLUMNS = 512


def _groups(B: int, U: int, parallel: bool) -> int:
    """Number of groups of utterances of pass 2 (at least one per thread)."""
    groups = -(-B * (U + 1) // GROUP_COLUMNS)
    if parallel:
        groups = max(groups, numba.get_num_threads())
    return max(1, min(B, groups))


def tdt_finish(
    tensors: Tuple[torch.Tensor, ...], opts: TDTOptions, factors
) -> torch.Tensor:
    """Pass 3 on the tensors :func:`tdt_begin` returned (e.g. as saved by autograd):
    the buffer becomes ``factors[b] * clip(d cost_b / d acts_b, -clamp, clamp)`` in
    place and is returned.

    Args:
        tensors: ``(buffer (B, T, U, V + D) acts dtype: the exps of pass 1,
            rows (B, T, U, D + 4) float64: per node W_blank, W_label, W_dur(0..D-1)
            and the two softmax coefficients, log_p (B,) float64, labels, act_lens,
            label_lens)``.
        factors: (B,) per-utterance factor (any sign): a CPU tensor or numpy array.
    """
    buffer, rows, log_p, labels, act_lens, label_lens = tensors
    V = buffer.shape[3] - opts.num_durations
    kernels, prev = _pick(buffer.numel())
    try:
        kernels[2](
            labels.numpy(),
            act_lens.numpy(),
            label_lens.numpy(),
            opts.blank,
            V,
            rows.numpy(),
            log_p.numpy(),
            opts.fastemit_lambda,
            opts.clamp,
            np.ascontiguousarray(factors, dtype=np.float64),
            buffer.numpy(),
        )
    finally:
        if prev is not None:
            numba.set_num_threads(prev)
    return buffer


def tdt_begin(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    need_grad: bool,
) -> Tuple[np.ndarray, Optional[Tuple[torch.Tensor, ...]]]:
    """Passes 1 and 2: costs and, when ``need_grad``, what pass 3 needs.

    Args:
        acts: (B, T, U, V + D) contiguous float32/float64 CPU tensor of raw logits.
        labels: (B, L) int64, L <= U - 1, padding replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: TDT options (``omega`` is not looked at: the caller draws it).
        need_grad: whether the gradient will be wanted.
    Returns:
        costs: (B,) float64 numpy array, ``-(1 + lambda) log P`` (+inf if impossible,
            NaN if a valid row holds NaN / +inf logits, or a part of only -inf).
        pending: the tensors :func:`tdt_finish` takes (the gradient buffer first), or
            None (not need_grad, or NaN costs).
    """
    B, T, U, VD = acts.shape
    D = opts.num_durations
    x = acts.numpy()
    if not labels.is_contiguous():
        labels = labels.contiguous()
    # numpy allocations, as in the multi-blank driver (page faults, see there)
    rows = np.empty((B, T, U, D + 4), np.float64)
    log_p = np.empty(B, np.float64)
    bad = np.zeros(B, np.uint8)
    buffer = np.empty(acts.shape, x.dtype) if need_grad else x
    al = act_lens.numpy()
    ll = label_lens.numpy()
    (rows_forward, lattice, _), prev = _pick(acts.numel())
    try:
        rows_forward(
            x,
            labels.numpy(),
            al,
            ll,
            opts.blank,
            VD - D,
            opts.sigma,
            need_grad,
            buffer,
            rows,
            bad,
        )
        if bad.any():
            costs = np.zeros(B, np.float64)
            costs[bad.astype(bool)] = np.nan
            return costs, None
        lattice(
            rows,
            al,
            ll,
            _durations(opts),
            opts.fastemit_lambda,
            need_grad,
            _groups(B, U, prev is not None or lattice is _PARALLEL[1]),
            log_p,
        )
    finally:
        if prev is not None:
            numba.set_num_threads(prev)
    costs = -(1.0 + opts.fastemit_lambda) * log_p + 0.0
    if not need_grad:
        return costs, None
    from_numpy = torch.from_numpy
    pending = (
        from_numpy(buffer),
        from_numpy(rows),
        from_numpy(log_p),
        labels,
        act_lens,
        label_lens,
    )
    return costs, pending


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
        acts, labels, act_lens, label_lens, opts, need_grad: as for :func:`tdt_begin`.
        grad_weights: (B,) per-utterance weight applied after the clamp.
    Returns:
        costs: (B,) acts.dtype (see :func:`tdt_begin`).
        grads: (B, T, U, V + D) acts.dtype (zeros when a cost is NaN) or None.
    """
    costs, pending = tdt_begin(acts, labels, act_lens, label_lens, opts, need_grad)
    costs = torch.from_numpy(costs).to(acts.dtype)
    if not need_grad:
        return costs, None
    if pending is None:  # NaN costs: the caller raises
        return costs, torch.zeros_like(acts)
    return costs, tdt_finish(pending, opts, grad_weights.detach())


tdt_compute.begin = tdt_begin
tdt_compute.finish = tdt_finish
