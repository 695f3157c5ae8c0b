"""LogSoftmaxGradModification: identity forward, gradient clamped to [-clamp, clamp].

Despite its name (kept from ESPnet / NeMo for drop-in compatibility) it computes no
log-softmax. It is placed *before* ``log_softmax`` so that the gradient with respect to
the raw logits is clipped, which is how the RNN-T "gradient clamp" is realised in a loss
that is written with ordinary autograd operations (this project's PyTorch backend).
"""

import math
from numbers import Real

import torch


class LogSoftmaxGradModification(torch.autograd.Function):
    """``y = LogSoftmaxGradModification.apply(acts, clamp)``.

    Forward: ``y`` equals ``acts`` (a view: no copy).
    Backward: ``dL/dacts = clamp(dL/dy, -clamp, clamp)``; ``clamp`` gets no gradient.

    Args:
        acts: tensor of any shape, floating dtype, any device.
        clamp: finite float >= 0. ``clamp == 0`` clips every gradient to 0 (use no
            modification at all to disable clipping); ``clamp < 0`` raises ValueError.
    """

    @staticmethod
    def forward(ctx, acts: torch.Tensor, clamp: float) -> torch.Tensor:
        if not isinstance(acts, torch.Tensor):
            raise TypeError(
                "LogSoftmaxGradModification: acts must be a torch.Tensor, got "
                f"{type(acts).__name__}"
            )
        if isinstance(clamp, bool) or not isinstance(clamp, Real):
            raise TypeError(
                "LogSoftmaxGradModification: clamp must be a real number >= 0, got "
                f"{type(clamp).__name__}"
            )
        clamp = float(clamp)
        if math.isnan(clamp) or clamp < 0:
            raise ValueError(
                f"LogSoftmaxGradModification: clamp must be >= 0, got {clamp}"
            )
        ctx.clamp = clamp
        return acts.view_as(acts)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return grad_output.clamp(-ctx.clamp, ctx.clamp), None
