"""Launch layer of the CUDA kernels: torch tensors in, torch tensors out.

One :class:`CudaKernelDriver` per lattice family: ``compute`` (multi-blank /
standard RNN-T, ``kernels.py``) and ``tdt_compute`` (TDT, ``tdt_kernels.py``).

On a GPU, every tensor (inputs, outputs and the float64 workspaces, all allocated with
torch's caching allocator) is handed to Numba in place through
``__cuda_array_interface__`` (``numba.cuda.as_cuda_array(t, sync=False)``: torch
exports no stream, so nothing is synchronised; bfloat16 tensors as their int16 view),
and the kernels are queued on torch's current stream of the logits' device
(``numba.cuda.external_stream``). Under ``NUMBA_ENABLE_CUDASIM=1`` the same code
takes CPU tensors and passes numpy views of them to the simulated kernels.

Two contracts (see ``espnet_multiblank.loss.function``):

* ``compute`` ``-> (costs, grads)``: the four kernels in a row, no host
  synchronisation;
* ``begin`` (kernels 1-3: costs, and the transition weights when the gradient
  is needed; one host synchronisation, to hand the costs over as numpy) and
  ``finish`` (kernel 4, in the autograd backward, with the per-utterance factors
  = reduction weight x incoming gradient folded in), so that any incoming gradient
  costs no more than the one logits-sized gradient buffer;

and the lattice stage alone (kernels 2 and 3) on rows a caller extracted itself
(``lattice``: ``espnet_multiblank.loss.stages.run_lattice`` on CUDA rows, the fused
joint + loss), launched by the same code as in ``begin`` / ``compute``
(:meth:`CudaKernelDriver._launch_lattice`).

Memory (per (b, t, u) row; the logits themselves are the caller's): the gradient
buffer, the size and dtype of the logits, allocated by ``begin`` / ``compute`` when the
gradient is needed; float64 workspaces ``denom`` (8 bytes; TDT: 16, a token and a
duration part) and ``lpw`` (8 (N + 2); TDT: 8 (D + 2)), kept until the gradient is
finished, and ``alphas``, ``betas`` (8 each), freed when ``begin`` returns: 8 (N + 5)
bytes per row at the peak, 8 (N + 3) held between forward and backward (TDT: 8 (D +
6) and 8 (D + 4)), plus O(B). With 4-byte logits that is (N + 5) / (V / 2) of the
gradient (0.6 % for V = 1024, N = 3; 25 % for V = 64), with 2-byte logits twice
that. ``begin`` keeps a reference to the logits for ``finish`` (the autograd graph
usually holds them anyway; non-contiguous logits are first copied, and that copy is
what is kept).
"""

import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from numba import cuda
from numba.core.errors import NumbaPerformanceWarning

import espnet_multiblank.loss.cuda.numpy_compat  # noqa: F401 (before a compile)

try:  # numba-cuda has its own warning classes
    from numba.cuda.core.errors import NumbaPerformanceWarning as _CudaPerfWarning
except ImportError:  # pragma: no cover - older numba-cuda / numba's built-in cuda
    _CudaPerfWarning = NumbaPerformanceWarning

from espnet_multiblank.loss.batch import LossBatch
from espnet_multiblank.loss.cuda.device_ops import SIMULATOR
from espnet_multiblank.loss.cuda.kernels import get_dp_kernels, get_kernels
from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_dp_kernels, get_tdt_kernels
from espnet_multiblank.loss.rows import fill_coefficients, multiblank_rows, tdt_rows

#: logits dtypes the kernels read directly
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_STORAGE = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

# Row kernels on a GPU: UNROLL loads in flight per thread; the team (threads per row)
# is the power of two that covers V in one chunk, 4..MAX_TEAM; blocks of at least
# MIN_BLOCK threads (several rows per block for small V). A block of 512 threads
# leaves 128 registers per thread.
UNROLL = 8
MAX_TEAM = 512
MIN_BLOCK = 128

# In the simulator: tiny teams and chunks, so that every path (several chunks per
# thread, a partial last chunk, several rows per block, the shared-memory tree) runs
# on small V; tests may override it (:data:`ROW_CONFIG_OVERRIDE`).
SIM_ROW_CONFIG = (2, 4, 2)
SIM_DIAG_THREADS = 2

#: threads per block of the one-thread-per-cell weights kernels
CELL_BLOCK = 4 if SIMULATOR else 128

#: (team, block, unroll) forced for every launch (tests only), or None
ROW_CONFIG_OVERRIDE: Optional[Tuple[int, int, int]] = None


def _pow2_at_least(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def gpu_row_config(V: int) -> Tuple[int, int, int]:
    """(team, block, unroll) used on a GPU for rows of V logits."""
    team = min(MAX_TEAM, max(4, _pow2_at_least(-(-V // UNROLL))))
    return team, max(team, MIN_BLOCK), UNROLL


def row_config(V: int) -> Tuple[int, int, int]:
    """(team, block, unroll) of the row kernels for rows of V logits (the override,
    the simulator's tiny layout, or :func:`gpu_row_config`)."""
    if ROW_CONFIG_OVERRIDE is not None:
        return ROW_CONFIG_OVERRIDE
    if SIMULATOR:
        return SIM_ROW_CONFIG
    return gpu_row_config(V)


def diag_threads(T: int, U: int) -> int:
    """Threads of the alpha/beta blocks: one per cell of the longest anti-diagonal
    (min(T, U) cells), 32..512, striding beyond (512 threads leave 128 registers
    each, so a launch never fails for lack of registers)."""
    if SIMULATOR:
        return SIM_DIAG_THREADS
    return min(512, max(32, _pow2_at_least(min(T, U))))


def row_grid(rows: int, cfg) -> int:
    team, block, _ = cfg
    per_block = block // team
    return max(1, -(-rows // per_block))


def storage_of(dtype: torch.dtype) -> str:
    return _STORAGE[dtype]


def kernel_array(x: torch.Tensor):
    """A view of ``x`` for the kernels: numpy (simulator) or a Numba device array;
    bfloat16 as its int16 bits."""
    if x.dtype == torch.bfloat16:
        x = x.view(torch.int16)
    if SIMULATOR:
        return x.numpy()
    return cuda.as_cuda_array(x, sync=False)


def check_device(acts: torch.Tensor) -> None:
    if acts.dtype not in DTYPES:
        raise TypeError(
            f"the CUDA kernels take float64/float32/float16/bfloat16 acts, "
            f"got {acts.dtype}"
        )
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


def cost_dtype(dtype: torch.dtype) -> torch.dtype:
    """Costs are float64 for float64 logits, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def prepare_ints(labels, act_lens, label_lens, B: int, dev):
    """int64 contiguous copies; an empty label matrix gets a dummy column (a
    non-empty array for the kernels; never read)."""
    if labels.shape[1] == 0:
        labels = torch.zeros((B, 1), dtype=torch.int64, device=dev)
    return (
        labels.to(torch.int64).contiguous(),
        act_lens.to(torch.int64).contiguous(),
        label_lens.to(torch.int64).contiguous(),
    )


def run_on_stream(dev: torch.device, body) -> None:
    """Call ``body(cfg)`` where ``cfg(kernel, grid, block)`` configures a launch on
    torch's current stream of ``dev`` (no stream in the simulator)."""
    if SIMULATOR:
        body(lambda kernel, grid, block: kernel[grid, block])
        return
    with cuda.gpus[dev.index], warnings.catch_warnings():
        # small grids (the (B, 2) alpha/beta one) are by design: no occupancy warning
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        warnings.simplefilter("ignore", _CudaPerfWarning)
        stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream)
        body(lambda kernel, grid, block: kernel[grid, block, stream])


@dataclass
class PendingCudaGradient:
    """What the gradient kernel needs, kept from ``begin`` to ``finish``.

    Attributes:
        buffer: the logits' shape and dtype, uninitialised; ``finish`` writes the
            gradient into it.
        acts: the logits (B, T, U, V') (V' = V, or V + D for TDT), C-contiguous.
        labels: (B, max(L, 1)) int64; act_lens, label_lens: (B,) int64.
        denom: (B, T, U) or (B, T, U, 2) float64 row log-sum-exps.
        wts: (B, T, U, W) float64 transition weights (occupancies).
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


def factors_tensor(values, device) -> torch.Tensor:
    """(B,) float64 contiguous factors on ``device`` from a tensor or numpy array."""
    if isinstance(values, np.ndarray):
        values = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
    return values.detach().to(device=device, dtype=torch.float64).contiguous()


class CudaKernelDriver:
    """One loss's four CUDA kernels behind both contracts; calling it is ``compute``.

    A kernel family (``get_kernels(storage, lattice, row_config) -> (row_stats,
    alpha_beta, weights, grad)`` and ``get_dp_kernels(lattice) -> (alpha_beta,
    weights)``; the multi-blank and the TDT family share the calling convention)
    differs only in:

    * ``layout(opts)``: its rows (``espnet_multiblank.loss.rows``): the transitions
      per node (``lpw``'s width), the logits a row kernel reduces (V of V + D) and
      the softmax parts of a row (``denom`` holds one log-sum-exp per part, (B, T, U)
      for one part, (B, T, U, 2) for a TDT's token and duration parts);
    * ``tdt``: the TDT row_stats kernel also takes V after ``blank`` (the gradient
      kernels of both families take it) and the TDT kernels a (B,) int32 flag of bad
      rows (row_stats sets it, alpha_beta reads it).
    """

    #: the kernels run on a GPU (on the host in the simulator)
    device_type = "cuda"

    def __init__(self, get_kernels, get_dp_kernels, layout, tdt):
        self.get_kernels = get_kernels
        self.get_dp_kernels = get_dp_kernels
        self.layout = layout
        self.tdt = tdt

    @staticmethod
    def _no_frames(label_lens, logp, costs, fastemit_lambda) -> None:
        """Every T_b = 0: the empty path (cost 0) or impossible (+inf)."""
        lp0 = torch.where(label_lens == 0, 0.0, float("-inf")).to(logp)
        logp.copy_(lp0)
        costs.copy_(-(1.0 + fastemit_lambda) * lp0 + 0.0)

    def _launch_lattice(
        self, cfg, opts, lpw, act_lens, label_lens, flags, need_grad, work
    ) -> None:
        """Kernels 2 and 3 (3 only when need_grad) on ``lpw`` (B, T, U, >= num
        steps) float64, in a launch body of :func:`run_on_stream`: ``work`` =
        ``(alphas, betas, logp, costs)`` tensors; ``flags``: the TDT kernels' bad
        rows (as kernel arrays) or ()."""
        B, T, U = lpw.shape[:3]
        alpha_beta, weights_k = self.get_dp_kernels(opts.lattice)
        alphas, betas, logp, costs = (kernel_array(x) for x in work)
        do_beta = 1 if need_grad else 0
        cfg(alpha_beta, (B, 1 + do_beta), diag_threads(T, U))(
            lpw,
            act_lens,
            label_lens,
            *flags,
            float(opts.fastemit_lambda),
            do_beta,
            alphas,
            betas,
            logp,
            costs,
        )
        if need_grad:
            cfg(weights_k, -(-(B * T * U) // CELL_BLOCK), CELL_BLOCK)(
                lpw, act_lens, label_lens, alphas, betas, logp
            )

    def _lattice_work(self, B, T, U, need_grad, costs, ws):
        """(alphas, betas, logp, costs) workspaces of :meth:`_launch_lattice`."""
        alphas = torch.empty((B, T, U), **ws)
        betas = torch.empty((B, T, U) if need_grad else (1, 1, 1), **ws)
        return alphas, betas, torch.empty((B,), **ws), costs

    def forward(self, acts, labels, act_lens, label_lens, opts, need_grad: bool):
        """Kernels 1-3 (3 only when need_grad): ``(costs, pending or None)``, queued
        on the current stream, no host synchronisation. costs: (B,) float64 for
        float64 logits, float32 otherwise."""
        check_device(acts)
        acts = acts.detach().contiguous()
        B, T, U, width = acts.shape
        layout = self.layout(opts)
        V = layout.num_tokens(width)
        dev = acts.device
        costs = torch.empty((B,), dtype=cost_dtype(acts.dtype), device=dev)
        labels, act_lens, label_lens = prepare_ints(
            labels, act_lens, label_lens, B, dev
        )
        ws = dict(dtype=torch.float64, device=dev)
        denom_tail = () if layout.num_parts == 1 else (layout.num_parts,)
        denom = torch.empty((B, T, U) + denom_tail, **ws)
        lpw = torch.empty((B, T, U, layout.num_steps), **ws)
        work = self._lattice_work(B, T, U, need_grad, costs, ws) if T else None
        logp = work[2] if T else torch.empty((B,), **ws)
        pending = None
        if need_grad:
            pending = PendingCudaGradient(
                torch.empty_like(acts),
                acts,
                labels,
                act_lens,
                label_lens,
                denom,
                lpw,
                logp,
            )
        if B == 0:
            return costs, pending
        if T == 0:
            self._no_frames(label_lens, logp, costs, opts.fastemit_lambda)
            return costs, pending

        cfg_row = row_config(V)
        lattice = opts.lattice
        row_stats = self.get_kernels(storage_of(acts.dtype), lattice, cfg_row)[0]
        k = kernel_array
        # the TDT kernels take V after the blank and flag bad rows for alpha_beta
        tokens = (V,) if self.tdt else ()
        bad = torch.zeros((B,), dtype=torch.int32, device=dev) if self.tdt else None

        def body(cfg):
            flags = (k(bad),) if self.tdt else ()
            a_lens, a_llens, a_lpw = k(act_lens), k(label_lens), k(lpw)
            cfg(row_stats, row_grid(B * T * U, cfg_row), cfg_row[1])(
                k(acts),
                k(labels),
                a_lens,
                a_llens,
                int(lattice.blank),
                *tokens,
                float(opts.sigma),
                k(denom),
                a_lpw,
                *flags,
            )
            self._launch_lattice(
                cfg, opts, a_lpw, a_lens, a_llens, flags, need_grad, work
            )

        run_on_stream(dev, body)
        return costs, pending

    def lattice(self, opts, rows, act_lens, label_lens, need_grad: bool):
        """The lattice stage on rows extracted by the caller (the contract of
        ``espnet_multiblank.loss.rows``), queued on torch's current stream without
        a host synchronisation.

        Args:
            rows: (B, T, U, width) float64 contiguous CUDA tensor (a CPU tensor in
                the simulator); when ``need_grad``, the valid rows of the possible
                utterances are overwritten with the occupancies and coefficients.
            act_lens, label_lens: (B,) int64 tensors on the same device.
        Returns:
            log_p: (B,) float64 tensor on the device.
        """
        B, T, U, _ = rows.shape
        ws = dict(dtype=torch.float64, device=rows.device)
        costs = torch.empty((B,), **ws)
        if B == 0:
            return costs
        if T == 0:
            log_p = torch.empty((B,), **ws)
            self._no_frames(label_lens, log_p, costs, opts.fastemit_lambda)
            return log_p
        work = self._lattice_work(B, T, U, need_grad, costs, ws)
        k = kernel_array
        bad = torch.zeros((B,), dtype=torch.int32, device=rows.device)

        def body(cfg):  # the arrays are made in the device's context
            flags = (k(bad),) if self.tdt else ()
            lens = (k(act_lens), k(label_lens))
            self._launch_lattice(cfg, opts, k(rows), *lens, flags, need_grad, work)

        run_on_stream(rows.device, body)
        log_p = work[2]
        if need_grad:
            fill_coefficients(self.layout(opts), rows, log_p, opts.fastemit_lambda)
        return log_p

    def gradient(self, tensors, opts, factors: torch.Tensor) -> torch.Tensor:
        """Kernel 4 into the pending buffer (returned): ``factors`` (B,) float64
        tensor on the logits' device."""
        buffer, acts, labels, act_lens, label_lens, denom, wts, logp = tensors
        B, T, U, width = acts.shape
        V = self.layout(opts).num_tokens(width)
        rows = B * T * U
        if rows == 0 or width == 0:
            return buffer
        cfg_row = row_config(V)
        lattice = opts.lattice
        *_, grad_k = self.get_kernels(storage_of(acts.dtype), lattice, cfg_row)
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

    def begin(self, batch: LossBatch, opts, need_grad: bool):
        """Kernels 1-3 on a validated
        :class:`~espnet_multiblank.loss.batch.LossBatch` (its tensors on the
        device): ``(costs (B,) float64 numpy, pending or None)`` (one host sync).
        ``pending.tensors()`` is what :meth:`finish` takes (autograd saves them)."""
        costs, pending = self.forward(*batch, opts, need_grad)
        return costs.to("cpu", torch.float64).numpy(), pending

    def finish(self, tensors, opts, factors: np.ndarray) -> torch.Tensor:
        """Kernel 4: the gradient (the pending buffer itself, ``tensors[0]``),
        utterance b's clamped gradient times ``factors[b]`` ((B,) float64 numpy)."""
        return self.gradient(tensors, opts, factors_tensor(factors, tensors[0].device))

    def __call__(
        self, acts, labels, act_lens, label_lens, opts, grad_weights, need_grad
    ):
        """See :func:`espnet_multiblank.loss.cuda.compute` (same contract)."""
        costs, pending = self.forward(
            acts, labels, act_lens, label_lens, opts, need_grad
        )
        if not need_grad:
            return costs, None
        grads = self.gradient(
            pending.tensors(), opts, factors_tensor(grad_weights, pending.acts.device)
        )
        return costs, grads


# the multi-blank family: one log-sum-exp per row, N + 2 transitions per node
compute = CudaKernelDriver(get_kernels, get_dp_kernels, multiblank_rows, tdt=False)

# the TDT family: token and duration log-sum-exps per row; W_blank, W_label and D
# duration weights per node; the row kernels reduce the V token logits (the D
# duration logits follow)
tdt_compute = CudaKernelDriver(get_tdt_kernels, get_tdt_dp_kernels, tdt_rows, tdt=True)
