"""Backend dispatch shared by the multi-blank and the TDT loss.

Both losses take validated inputs to a reduced loss the same way: the fused Numba
kernel of the tensors' device when there is one (``backend`` "auto" or "numba"), else
the float64-capable PyTorch reference ("torch", or a device Numba cannot target). Only
the kernels, the reference and the checks of the torch path differ; they come in as
arguments.
"""

from typing import Callable, Optional

import torch

from espnet_multiblank.loss.function import FusedMultiblankRNNTFunction, reduce_costs

BACKENDS = ("auto", "numba", "torch")

# reference(acts, labels, act_lens, label_lens, opts, clamp=...) -> (B,) costs
ReferenceCosts = Callable[..., torch.Tensor]


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def valid_nodes(acts, act_lens, label_lens) -> torch.Tensor:
    """(B, T, U) bool: the lattice nodes (t < T_b, u <= L_b) whose logits row is read;
    the other rows of ``acts`` (B, T, U, V) are padding."""
    B, T, U = acts.shape[:3]
    t = torch.arange(T, device=acts.device)
    u = torch.arange(U, device=acts.device)
    return (t.view(1, T, 1) < act_lens.view(B, 1, 1).to(acts.device)) & (
        u.view(1, 1, U) <= label_lens.view(B, 1, 1).to(acts.device)
    )


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


def dispatch_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts,
    backend: str,
    kernel: Optional[Callable],
    reference: ReferenceCosts,
    check_reference_input: Callable = lambda acts, act_lens, label_lens: None,
    check_reference_costs: Callable = lambda costs: None,
) -> torch.Tensor:
    """The reduced loss of validated inputs.

    Args:
        acts, labels, act_lens, label_lens, opts: validated by the loss's own checks.
        backend: one of BACKENDS.
        kernel: the Numba kernel of ``acts.device`` (None: Numba cannot target it).
        reference: the PyTorch costs function (the torch backend).
        check_reference_input / check_reference_costs: what the torch path checks
            before and after the reference, so that it raises where the kernels do.
    """
    check_backend(backend)
    if backend == "torch":
        kernel = None
    elif kernel is None and backend == "numba":
        raise ValueError(
            "backend='numba' supports cpu and cuda tensors, "
            f"got acts on {acts.device}; use backend='torch' or 'auto'"
        )
    if kernel is not None:
        return FusedMultiblankRNNTFunction.apply(
            acts, labels, act_lens, label_lens, opts, kernel
        )
    check_reference_input(acts, act_lens, label_lens)
    if opts.clamp > 0 and acts.requires_grad and torch.is_grad_enabled():
        costs = ClampedReferenceFunction.apply(
            acts, labels, act_lens, label_lens, opts, reference
        )
    else:
        costs = reference(acts, labels, act_lens, label_lens, opts)
    check_reference_costs(costs)
    return reduce_costs(costs, opts, label_lens)
