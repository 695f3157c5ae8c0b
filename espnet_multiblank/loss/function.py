"""The autograd Function around the fused (Numba) kernels.

The gradient of the *reduced* loss with respect to the logits is, per utterance b,
``factor_b * clip(d cost_b / d acts_b, -clamp, clamp)`` with ``factor_b`` = reduction
weight (``espnet_multiblank.loss.reductions``: 1 for "none"/"sum", 1/B for "mean" and
"mean_batch", 1/max(sum L, 1) for "mean_volume", 1/(B max(L_b, 1)) for
"mean_label_normalized") times the incoming gradient. It costs ONE logits-sized
buffer whatever the incoming gradient (1 - ctc_weight, 1 / accum_grad, an AMP loss
scale...):

* kernels that offer ``kernel.begin`` / ``kernel.finish`` (the CPU kernel for float32
  and float64 logits; see :class:`FusedTransducerFunction` for the contract) leave
  their last pass to ``backward``: the forward pass keeps the buffer of exps and the
  lattice occupancies, and backward turns the buffer into the gradient in place with
  the factors folded in (no extra pass over the logits);
* the others (and float16 / bfloat16 logits on the CPU, computed in float32 chunks)
  return the finished gradient with the reduction weights; backward multiplies the
  incoming gradient into that same buffer in place (one extra pass, no extra buffer).

Either way backward returns the saved buffer itself. ``retain_graph=True``: the buffer
is never modified after it has been returned once, so a gradient handed out earlier
keeps its values; a later backward with the same incoming gradient returns the buffer
again, one with a different incoming gradient returns a new tensor (the buffer
rescaled by the ratio of the two incoming gradients: one more logits-sized buffer, and
its values may differ from a fresh computation in the last bit). An incoming gradient
with a zero or non-finite entry is multiplied into a new tensor as well, so that the
buffer stays rescalable.
"""

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from espnet_multiblank.loss import reductions
from espnet_multiblank.loss.batch import LossBatch
from espnet_multiblank.loss.validation import nonfinite_logits_message


def reduction_weights(opts, label_lens: torch.Tensor, dtype: torch.dtype):
    """(B,) factor that turns d cost_b / d acts into d loss / d acts."""
    return reductions.weights(opts.reduction, label_lens, dtype)


def reduce_costs(costs: torch.Tensor, opts, label_lens: torch.Tensor):
    """Apply ``opts.reduction`` to (B,) costs (plain torch ops, differentiable)."""
    return reductions.reduce_costs(costs, opts.reduction, label_lens)


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


class FusedTransducerFunction(torch.autograd.Function):
    """loss = Function.apply(acts, labels, act_lens, label_lens, opts, kernel), for
    the kernels of every lattice family (``opts`` of either family).

    ``kernel(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad)``
    returns ``(costs (B,), grads (B,T,U,V) or None)``. A kernel may also offer the
    deferred contract, used for the logits dtypes in ``kernel.begin_dtypes`` (default
    float32 and float64):

    * ``kernel.begin(batch, opts, need_grad)`` (batch: the
      :class:`~espnet_multiblank.loss.batch.LossBatch` of the contiguous acts and
      the other three tensors) ->
      ``(costs, pending)``: costs (B,) as a numpy array or a tensor, pending None or
      the tensors to save for backward (a tuple, or an object whose ``tensors()``
      returns it), the gradient buffer first;
    * ``kernel.finish(saved_tensors, opts, factors)`` -> the gradient: the buffer,
      finished in place with ``factors`` ((B,) float64 CPU tensor: reduction weight
      times incoming gradient) folded in.

    See ``espnet_multiblank.loss.cpu.driver``.
    """

    @staticmethod
    def forward(ctx, acts, labels, act_lens, label_lens, opts, kernel):
        need_grad = ctx.needs_input_grad[0]
        in_dtype = acts.dtype
        compute_dtype = torch.float64 if in_dtype == torch.float64 else torch.float32
        begin = getattr(kernel, "begin", None)
        ctx.opts = opts
        ctx.finish = None
        ctx.applied = None  # (B,) float64 numpy: incoming gradient in the buffer
        ctx.returned = False  # whether backward has handed the buffer out
        ctx.reduction = opts.reduction
        if begin is not None and in_dtype in getattr(
            kernel, "begin_dtypes", (torch.float32, torch.float64)
        ):
            # host bookkeeping in numpy: a torch op costs microseconds, a small
            # problem's whole loss well under a millisecond
            batch = LossBatch(acts.detach().contiguous(), labels, act_lens, label_lens)
            costs, pending = begin(batch, opts, need_grad)
            if isinstance(costs, torch.Tensor):
                costs = costs.detach().cpu().numpy()
            costs = costs.astype(np.float64, copy=False)
            if np.isnan(costs).any():
                _raise_nan(int(np.flatnonzero(np.isnan(costs))[0]))
            weights = reductions.weights_np(
                opts.reduction,
                (
                    label_lens if label_lens.device.type == "cpu" else label_lens.cpu()
                ).numpy(),
            )
            if need_grad:
                tensors = getattr(pending, "tensors", None)
                ctx.save_for_backward(*(tensors() if tensors else pending))
                ctx.finish = kernel.finish
                ctx.weights = weights
            del pending
            if opts.reduction == "none":
                out = costs
            else:
                out = np.asarray(np.dot(costs, weights) if costs.size else 0.0)
            out = torch.from_numpy(
                out.astype(np.float64 if in_dtype == torch.float64 else np.float32)
            )
            return out if acts.device.type == "cpu" else out.to(acts.device)
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
            _raise_nan(int(torch.isnan(costs).nonzero()[0]))
        if need_grad:
            if grads.dtype != in_dtype:
                grads = grads.to(in_dtype)
            ctx.save_for_backward(grads)
            ctx.applied = np.ones(acts.shape[0])
        with torch.no_grad():
            return reduce_costs(costs, opts, label_lens)

    @staticmethod
    @once_differentiable  # the kernels give no second derivative: fail loudly
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        grads = saved[0]
        B = grads.shape[0]
        # d loss / d acts_b = grad_out (or grad_out[b] for "none") * gradient_b; the
        # factors go through the host (one sync on CUDA, as any scalar read)
        if grad_out.numel() == 1:
            incoming = np.full(B, grad_out.item(), dtype=np.float64)
        else:
            incoming = grad_out.detach().to("cpu", torch.float64).reshape(-1).numpy()
        usable = bool(np.isfinite(incoming).all() and (incoming != 0).all())
        if ctx.applied is None:  # first backward of a deferred kernel: run pass 3
            if usable:
                ctx.finish(saved, ctx.opts, torch.from_numpy(ctx.weights * incoming))
                ctx.applied = incoming.copy()
                ctx.returned = True
                return grads, None, None, None, None, None
            ctx.finish(saved, ctx.opts, torch.from_numpy(ctx.weights))
            ctx.applied = np.ones(B)
        if np.array_equal(incoming, ctx.applied):
            ctx.returned = True
            return grads, None, None, None, None, None
        ratio = incoming / ctx.applied
        if usable and not ctx.returned:
            # nobody holds the buffer yet: scale it in place (.data: the saved tensor's
            # version counter must not move, or a retain_graph backward would refuse)
            _scale_into(grads.data, grads, ratio)
            ctx.applied = incoming.copy()
            ctx.returned = True
            return grads, None, None, None, None, None
        out = torch.empty_like(grads)
        _scale_into(out, grads, ratio)
        return out, None, None, None, None, None


def _scale_into(out: torch.Tensor, grads: torch.Tensor, ratio: np.ndarray) -> None:
    """out[b] = grads[b] * ratio[b] (out may be grads). Python-float factors: a tensor
    factor of another dtype would make torch materialise a promoted copy of the whole
    gradient (several gradients' worth of memory), a scalar is applied element-wise in
    the op's internal precision."""
    if ratio.size == 0:
        return
    if (ratio == ratio[0]).all():
        torch.mul(grads, float(ratio[0]), out=out)
        return
    for b, r in enumerate(ratio.tolist()):
        torch.mul(grads[b], r, out=out[b])


def _raise_nan(b: int) -> None:
    raise ValueError(nonfinite_logits_message(b))


#: the name this Function had when it served the multi-blank loss only
FusedMultiblankRNNTFunction = FusedTransducerFunction
