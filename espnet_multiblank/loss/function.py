"""The autograd Function around the fused (Numba) kernels.

A kernel computes, in one call, the per-utterance costs and (only when autograd needs
it) the gradient of the *reduced* loss with respect to the logits: every utterance's
gradient is clamped first (``clamp``) and then multiplied by its reduction weight (1 for
"none"/"sum", 1/B for "mean", 1/max(L_b,1) / B for "mean_volume"). The gradient is kept
with ``save_for_backward`` and never modified in place, so ``backward`` may run twice
(``retain_graph=True``). When the incoming gradient is exactly 1 (the usual
``loss.backward()``), the saved tensor itself is returned: no second logits-sized
buffer.
"""

import torch
from torch.autograd.function import once_differentiable

from espnet_multiblank.loss.options import LossOptions


def reduction_weights(
    opts: LossOptions, label_lens: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """(B,) factor that turns d cost_b / d acts into d loss / d acts."""
    B = label_lens.shape[0]
    if opts.reduction == "mean":
        return torch.full((B,), 1.0 / max(B, 1), dtype=dtype, device=label_lens.device)
    if opts.reduction == "mean_volume":
        return 1.0 / (label_lens.clamp(min=1).to(dtype) * max(B, 1))
    return torch.ones((B,), dtype=dtype, device=label_lens.device)


def reduce_costs(costs: torch.Tensor, opts: LossOptions, label_lens: torch.Tensor):
    """Apply ``opts.reduction`` to (B,) costs (plain torch ops, differentiable)."""
    if opts.reduction == "none":
        return costs
    if opts.reduction == "sum":
        return costs.sum()
    if opts.reduction == "mean":
        return costs.sum() / max(costs.shape[0], 1)
    return (costs / label_lens.clamp(min=1).to(costs.dtype)).sum() / max(
        costs.shape[0], 1
    )


# float16 / bfloat16 logits are converted to float32 a few utterances at a time, so the
# float32 copies never hold more than about a quarter of the batch.
HALF_CHUNKS = 4


def _half_in_chunks(
    acts, labels, act_lens, label_lens, opts, weights, need_grad, kernel
):
    """Run a float32 kernel over half-precision ``acts`` (B,T,U,V), chunk by chunk of
    utterances (utterances are independent). Returns float32 costs (B,) and the
    gradient in ``acts.dtype`` (or None): extra memory is about one half-precision
    gradient plus 2 float32 buffers of a quarter of the batch."""
    B = acts.shape[0]
    step = max(1, -(-B // HALF_CHUNKS))
    costs = torch.empty((B,), dtype=torch.float32, device=acts.device)
    grads = (
        torch.empty_like(acts, memory_format=torch.contiguous_format)
        if need_grad
        else None
    )
    for lo in range(0, B, step):
        hi = min(B, lo + step)
        chunk = acts[lo:hi].detach().to(torch.float32).contiguous()
        c, g = kernel(
            chunk,
            labels[lo:hi],
            act_lens[lo:hi],
            label_lens[lo:hi],
            opts,
            weights[lo:hi],
            need_grad,
        )
        costs[lo:hi] = c
        if need_grad:
            grads[lo:hi] = g
        del chunk, g
    return costs, grads


class FusedMultiblankRNNTFunction(torch.autograd.Function):
    """loss = Function.apply(acts, labels, act_lens, label_lens, opts, kernel).

    ``kernel(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad)``
    returns ``(costs (B,), grads (B,T,U,V) or None)``; see
    ``espnet_multiblank.loss.cpu``.
    """

    @staticmethod
    def forward(ctx, acts, labels, act_lens, label_lens, opts: LossOptions, kernel):
        need_grad = ctx.needs_input_grad[0]
        in_dtype = acts.dtype
        compute_dtype = torch.float64 if in_dtype == torch.float64 else torch.float32
        weights = reduction_weights(opts, label_lens, compute_dtype)
        if in_dtype in (torch.float16, torch.bfloat16):
            costs, grads = _half_in_chunks(
                acts, labels, act_lens, label_lens, opts, weights, need_grad, kernel
            )
        else:
            acts_c = acts.detach().contiguous()
            costs, grads = kernel(
                acts_c, labels, act_lens, label_lens, opts, weights, need_grad
            )
            del acts_c
        if bool(torch.isnan(costs).any()):
            b = int(torch.isnan(costs).nonzero()[0])
            raise ValueError(
                f"acts must be finite logits (-inf allowed for masked symbols); "
                f"utterance {b} contains NaN or +inf"
            )
        if need_grad:
            if grads.dtype != in_dtype:
                grads = grads.to(in_dtype)
            ctx.save_for_backward(grads)
        ctx.reduction = opts.reduction
        with torch.no_grad():
            return reduce_costs(costs, opts, label_lens)

    @staticmethod
    @once_differentiable  # the kernels give no second derivative: fail loudly
    def backward(ctx, grad_out):
        (grads,) = ctx.saved_tensors
        if ctx.reduction == "none":
            # d loss / d acts_b = grad_out[b] * grads_b
            if bool((grad_out == 1).all()):
                return grads, None, None, None, None, None
            g = grad_out.to(grads.dtype).view(-1, 1, 1, 1)
        else:
            # one scalar read (a host sync on CUDA) spares a logits-sized copy
            if float(grad_out) == 1.0:
                return grads, None, None, None, None, None
            g = grad_out.to(grads.dtype)
        return grads * g, None, None, None, None, None
