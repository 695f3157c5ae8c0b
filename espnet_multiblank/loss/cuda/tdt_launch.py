"""Launch layer of the CUDA TDT kernels: torch tensors in, torch tensors out.

The TDT kernel family behind
:class:`espnet_multiblank.loss.cuda.launch.CudaKernelDriver`, with the same two
contracts as the multi-blank kernels: ``tdt_compute`` (all four kernels, no host
synchronisation) and ``tdt_begin`` / ``tdt_finish`` (the gradient kernel in the
autograd backward with the incoming gradient folded in).

Memory per (b, t, u) row besides the logits and the gradient buffer (the logits'
size and dtype): float64 ``denom`` (B, T, U, 2) and ``lpw`` (B, T, U, 2 + D), kept
until the gradient is finished, ``alphas`` and ``betas`` (B, T, U), freed when
:func:`tdt_begin` returns: 8 (D + 6) bytes per row at the peak, 8 (D + 4) held
between forward and backward, plus O(B).
"""

from espnet_multiblank.loss.cuda.launch import CudaKernelDriver
from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_kernels

# token and duration log-sum-exps per row; W_blank, W_label and D duration weights
# per node; the row kernels reduce the V token logits (the D duration logits follow)
tdt_compute = CudaKernelDriver(
    get_tdt_kernels,
    denom_tail=(2,),
    weights_width=lambda opts: 2 + opts.lattice.num_durations,
    num_tokens=lambda opts, width: width - opts.lattice.num_durations,
    tdt=True,
)
tdt_forward = tdt_compute.forward
tdt_gradient = tdt_compute.gradient
tdt_begin = tdt_compute.begin
tdt_finish = tdt_compute.finish
