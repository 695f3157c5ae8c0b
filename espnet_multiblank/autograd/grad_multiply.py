"""GradMultiply: identity in the forward pass, gradient x scale in the backward pass.

Used to damp (scale < 1) or amplify the gradient that flows into a learnable feature
extractor, as fairseq / wav2vec 2.0 / HuBERT / AV-HuBERT do with ``feature_grad_mult``.
"""

import math
from numbers import Real

import torch


def _check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, Real):
        raise TypeError(
            "GradMultiply: scale must be a real number (float), "
            f"got {type(scale).__name__}"
        )
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"GradMultiply: scale must be finite, got {scale}")
    return scale


class GradMultiply(torch.autograd.Function):
    """``y = GradMultiply.apply(x, scale)``.

    Forward: ``y`` equals ``x`` (a view of it: no copy of the data).
    Backward: ``dL/dx = scale * dL/dy``; ``scale`` gets no gradient.

    Args:
        x: tensor of any shape, dtype and device.
        scale: finite Python float (ValueError otherwise).

    Unlike ESPnet's BEATs copy, ``x`` is passed as a tensor (not a tuple), so autograd
    sees it and the parameters upstream of ``x`` receive the scaled gradient.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"GradMultiply: x must be a torch.Tensor, got {type(x).__name__}"
            )
        ctx.scale = _check_scale(scale)
        # view_as: autograd needs a distinct output tensor, but no data is copied.
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def grad_multiply(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Functional form of :class:`GradMultiply`; a no-op (returns ``x``) when
    scale == 1."""
    if _check_scale(scale) == 1.0:
        return x
    return GradMultiply.apply(x, scale)
