"""Backend dispatch of the losses (both lattice families, dense and fused).

Validated inputs go to a reduced loss the same way for every family: the fused Numba
kernel of the tensors' device when there is one (``backend`` "auto" or "numba"),
else the float64-capable PyTorch reference ("torch", or a device Numba cannot
target). The kernels and the reference come from the family record;
:func:`numba_kernel` is the one choice of a device's kernels, which the dense loss,
the lattice stage (``stages.run_lattice``) and the fused joint + loss share.
"""

import torch

from espnet_multiblank.loss.batch import LossBatch
from espnet_multiblank.loss.function import FusedTransducerFunction, reduce_costs
from espnet_multiblank.loss.validation import check_valid_rows

BACKENDS = ("auto", "numba", "torch")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def numba_kernel(family, device: torch.device, backend: str, tensor: str = "acts"):
    """The family's Numba kernel driver for tensors on ``device``, or None for the
    PyTorch path (``backend="torch"``, or "auto" on a device Numba cannot target).

    Raises:
        ValueError for ``backend="numba"`` on such a device (``tensor``: how the
        message names the tensor on it).
    """
    kernel = None if backend == "torch" else family.kernel(device)
    if kernel is None and backend == "numba":
        raise ValueError(
            "backend='numba' supports cpu and cuda tensors, "
            f"got {tensor} on {device}; use backend='torch' or 'auto'"
        )
    return kernel


class ClampedReferenceFunction(torch.autograd.Function):
    """Torch backend with a gradient clamp: each utterance's gradient
    d cost_b / d acts_b is clamped (inside ``reference``, by
    LogSoftmaxGradModification) before the reduction and before any incoming gradient
    scale, exactly as in the fused kernels. Impossible utterances (+inf cost) get a
    zero gradient."""

    @staticmethod
    def forward(ctx, acts, labels, act_lens, label_lens, opts, reference):
        with torch.enable_grad():
            x = acts.detach().requires_grad_(True)
            costs = reference(x, labels, act_lens, label_lens, opts, clamp=opts.clamp)
            finite = torch.isfinite(costs)
            (grads,) = torch.autograd.grad(costs[finite].sum(), x, allow_unused=True)
        if grads is None:
            grads = torch.zeros_like(acts)
        ctx.save_for_backward(grads)
        return costs.detach()

    @staticmethod
    def backward(ctx, grad_out):
        (grads,) = ctx.saved_tensors
        g = grad_out.view(-1, 1, 1, 1).to(grads.dtype)
        return grads * g, None, None, None, None, None


def dispatch_loss(batch: LossBatch, opts, family, backend: str) -> torch.Tensor:
    """The reduced loss of a validated batch.

    Args:
        batch: the :class:`~espnet_multiblank.loss.batch.LossBatch` (acts (B, T, U,
            V') float, labels (B, L) int64, lengths (B,) int64), validated for
            ``family`` and ``opts``.
        family: the :class:`~espnet_multiblank.loss.families.LatticeFamily` of opts.
        backend: one of BACKENDS.
    Returns:
        The reduced loss (scalar) or the (B,) costs (reduction "none").
    """
    check_backend(backend)
    acts = batch.acts
    kernel = numba_kernel(family, acts.device, backend)
    if kernel is not None:
        return FusedTransducerFunction.apply(*batch, opts, kernel)
    # the kernels flag these rows themselves (NaN costs); the reference would not
    parts = family.layout(opts).parts(acts.shape[3])
    check_valid_rows(acts, batch.act_lens, batch.label_lens, parts)
    if opts.clamp > 0 and acts.requires_grad and torch.is_grad_enabled():
        costs = ClampedReferenceFunction.apply(*batch, opts, family.reference)
    else:
        costs = family.reference(*batch, opts)
    return reduce_costs(costs, opts, batch.label_lens)
