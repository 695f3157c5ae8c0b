"""Launch layer of the CUDA TDT kernels: torch tensors in, torch tensors out.

Same scheme as :mod:`espnet_multiblank.loss.cuda.launch` (whose helpers it uses):
every tensor is handed to Numba in place (``__cuda_array_interface__``, no copy, no
synchronisation) and the four kernels are queued on torch's current stream; under
``NUMBA_ENABLE_CUDASIM=1`` the same code takes CPU tensors.

Memory besides the logits and the gradient: ``denom`` (B, T, U, 2), ``lpw``
(B, T, U, 2 + D), ``alphas`` and ``betas`` (B, T, U), all float64, i.e.
8 * (D + 6) bytes per (b, t, u) row, plus O(B).
"""

import warnings

import torch
from numba import cuda

from espnet_multiblank.loss.cuda.launch import (
    SIMULATOR,
    NumbaPerformanceWarning,
    _as_kernel_array,
    _CudaPerfWarning,
    block_sizes,
)
from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_kernels
from espnet_multiblank.loss.tdt_options import TDTOptions


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
    if acts.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"the CUDA kernels take float32/float64 acts, got {acts.dtype}")
    if SIMULATOR:
        if acts.is_cuda:
            raise ValueError(
                "NUMBA_ENABLE_CUDASIM=1: the CUDA simulator takes CPU tensors, got "
                f"acts on {acts.device}"
            )
    elif not acts.is_cuda:
        raise ValueError(
            f"the CUDA backend takes CUDA tensors, got acts on {acts.device}"
        )
    acts = acts.detach().contiguous()
    B, T, U, VD = acts.shape
    lattice = opts.lattice
    D = lattice.num_durations
    V = VD - D
    dev = acts.device
    dtype = acts.dtype
    costs = torch.empty((B,), dtype=dtype, device=dev)
    grads = torch.empty_like(acts) if need_grad else None
    if B == 0:
        return costs, grads
    if T == 0:  # every T_b = 0: the empty path (cost 0) or impossible (+inf)
        costs.copy_(
            torch.where(label_lens == 0, 0.0, float("inf")).to(dtype=dtype, device=dev)
        )
        return costs, grads

    if labels.shape[1] == 0:  # no labels at all: a dummy column keeps a non-empty array
        labels = torch.zeros((B, 1), dtype=torch.int64, device=dev)
    labels = labels.to(torch.int64).contiguous()
    act_lens = act_lens.to(torch.int64).contiguous()
    label_lens = label_lens.to(torch.int64).contiguous()
    grad_weights = grad_weights.detach().to(dtype).contiguous()

    rows = B * T * U
    ws = dict(dtype=torch.float64, device=dev)
    denom = torch.empty((B, T, U, 2), **ws)
    lpw = torch.empty((B, T, U, 2 + D), **ws)
    alphas = torch.empty((B, T, U), **ws)
    betas = torch.empty((B, T, U) if need_grad else (1, 1, 1), **ws)
    logp = torch.empty((B,), **ws)
    bad = torch.zeros((B,), dtype=torch.int32, device=dev)

    row_threads, diag_threads = block_sizes(T, U, V)
    dtype_name = "float64" if dtype == torch.float64 else "float32"
    row_stats, alpha_beta, weights_k, grad_k = get_tdt_kernels(
        dtype_name, lattice, row_threads
    )
    blank = int(lattice.blank)
    sigma = float(opts.sigma)
    lam = float(opts.fastemit_lambda)
    clamp = float(opts.clamp)

    def launch(stream):
        k = _as_kernel_array
        a_acts, a_labels = k(acts), k(labels)
        a_tl, a_ll = k(act_lens), k(label_lens)
        a_denom, a_lpw, a_alphas = k(denom), k(lpw), k(alphas)
        a_betas, a_logp, a_costs, a_bad = k(betas), k(logp), k(costs), k(bad)

        def cfg(kernel, grid, block):
            return (
                kernel[grid, block] if stream is None else kernel[grid, block, stream]
            )

        cfg(row_stats, rows, row_threads)(
            a_acts, a_labels, a_tl, a_ll, blank, V, sigma, a_denom, a_lpw, a_bad
        )
        do_beta = 1 if need_grad else 0
        cfg(alpha_beta, (B, 1 + do_beta), diag_threads)(
            a_lpw, a_tl, a_ll, a_bad, lam, do_beta, a_alphas, a_betas, a_logp, a_costs
        )
        if need_grad:
            cells_per_block = row_threads
            cfg(
                weights_k, (rows + cells_per_block - 1) // cells_per_block, row_threads
            )(a_lpw, a_tl, a_ll, a_alphas, a_betas, a_logp)
            cfg(grad_k, rows, row_threads)(
                a_acts,
                a_labels,
                a_tl,
                a_ll,
                blank,
                V,
                lam,
                clamp,
                k(grad_weights),
                a_denom,
                a_lpw,
                a_logp,
                k(grads),
            )

    if SIMULATOR:
        launch(None)
    else:
        with cuda.gpus[dev.index], warnings.catch_warnings():
            warnings.simplefilter("ignore", NumbaPerformanceWarning)
            warnings.simplefilter("ignore", _CudaPerfWarning)
            stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)
            launch(stream)
    return costs, grads
