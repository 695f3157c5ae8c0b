"""Small autograd functions used by the loss and by the ESPnet model."""

from espnet_multiblank.autograd.grad_multiply import GradMultiply, grad_multiply
from espnet_multiblank.autograd.log_softmax_grad_modification import (
    LogSoftmaxGradModification,
)

__all__ = ["GradMultiply", "grad_multiply", "LogSoftmaxGradModification"]
