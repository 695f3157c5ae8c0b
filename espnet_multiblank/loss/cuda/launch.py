"""Launch layer of the CUDA kernels: torch tensors in, torch tensors out.

On a GPU, every tensor (inputs, outputs and the float64 workspaces, all allocated with
torch's caching allocator) is handed to Numba in place through
``__cuda_array_interface__`` (``numba.cuda.as_cuda_array(t, sync=False)``: torch
exports no stream, so nothing is synchronised), and the kernels (two for the costs,
four with the gradient) are queued on
torch's current stream of the logits' device (``numba.cuda.external_stream``). Nothing
here waits for the GPU: the host synchronisations of a loss call are the validation's
and the caller's NaN check only.

Under ``NUMBA_ENABLE_CUDASIM=1`` the same code takes CPU tensors and passes numpy
views of them to the simulated kernels (no stream).

Memory: besides the logits and the gradient (each (B, T, U, V)), the workspaces are
``denom``, ``alphas``, ``betas`` (B, T, U) and ``lpw`` (B, T, U, N + 2), all float64,
i.e. 8 * (N + 5) bytes per (b, t, u) row, plus O(B).
"""

import warnings

import torch
from numba import config as _numba_config
from numba import cuda
from numba.core.errors import NumbaPerformanceWarning

try:  # numba-cuda has its own warning classes
    from numba.cuda.core.errors import NumbaPerformanceWarning as _CudaPerfWarning
except ImportError:  # pragma: no cover - older numba-cuda / numba's built-in cuda
    _CudaPerfWarning = NumbaPerformanceWarning

from espnet_multiblank.loss.cuda.kernels import get_kernels
from espnet_multiblank.loss.options import LossOptions

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

# Block sizes in the simulator: tiny, so that the strided loops and the shared-memory
# reductions run with several elements per thread and several cells per diagonal.
SIM_ROW_THREADS = 4
SIM_DIAG_THREADS = 2


def _pow2_at_least(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def block_sizes(T: int, U: int, V: int):
    """(row_threads, diag_threads) for a (B, T, U, V) problem.

    row kernels: about 8 logits per thread, 32..256 threads (a power of two, as the
    shared-memory reduction needs); alpha/beta: one thread per cell of the longest
    anti-diagonal (min(T, U) cells), 32..512 threads, looping in strides beyond.
    The caps keep 65536 / threads >= 128 registers per thread available, so that a
    launch never fails with "too many resources requested" whatever the compiler
    allocates for the float64 code.
    """
    if SIMULATOR:
        return SIM_ROW_THREADS, SIM_DIAG_THREADS
    row = min(256, max(32, _pow2_at_least((V + 7) // 8)))
    diag = min(512, max(32, _pow2_at_least(min(T, U))))
    return row, diag


def _as_kernel_array(x: torch.Tensor):
    """A view of ``x`` for the kernels: numpy (simulator) or a Numba device array."""
    if SIMULATOR:
        return x.numpy()
    return cuda.as_cuda_array(x, sync=False)


def compute(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: LossOptions,
    grad_weights: torch.Tensor,
    need_grad: bool,
):
    """See :func:`espnet_multiblank.loss.cuda.compute` (same contract)."""
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
    B, T, U, V = acts.shape
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

    N = opts.num_big_blanks
    rows = B * T * U
    ws = dict(dtype=torch.float64, device=dev)
    denom = torch.empty((B, T, U), **ws)
    lpw = torch.empty((B, T, U, N + 2), **ws)
    alphas = torch.empty((B, T, U), **ws)
    betas = torch.empty((B, T, U) if need_grad else (1, 1, 1), **ws)
    logp = torch.empty((B,), **ws)

    row_threads, diag_threads = block_sizes(T, U, V)
    dtype_name = "float64" if dtype == torch.float64 else "float32"
    lattice = opts.lattice
    row_stats, alpha_beta, weights_k, grad_k = get_kernels(
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
        a_betas, a_logp, a_costs = k(betas), k(logp), k(costs)

        def cfg(kernel, grid, block):
            return (
                kernel[grid, block] if stream is None else kernel[grid, block, stream]
            )

        if rows > 0:
            cfg(row_stats, rows, row_threads)(
                a_acts, a_labels, a_tl, a_ll, blank, sigma, a_denom, a_lpw
            )
        do_beta = 1 if (need_grad and rows > 0) else 0
        cfg(alpha_beta, (B, 1 + do_beta), diag_threads)(
            a_lpw, a_tl, a_ll, lam, do_beta, a_alphas, a_betas, a_logp, a_costs
        )
        if need_grad and rows > 0:
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
            # the (B, 2) alpha/beta grid is small by design: no occupancy warning
            warnings.simplefilter("ignore", NumbaPerformanceWarning)
            warnings.simplefilter("ignore", _CudaPerfWarning)
            stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)
            launch(stream)
    return costs, grads
