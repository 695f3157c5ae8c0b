"""The joint network's activation, applied and differentiated tile by tile.

The fused loss recomputes ``h = act(pre)`` (``pre = enc[b, t] + pred[b, u]``) in the
backward pass, so it needs the activation as a function it can call twice and
differentiate without a graph kept from the forward pass. Only elementwise
activations without parameters qualify (the gradient of a tile's rows must depend on
those rows alone); :func:`joint_activation` accepts them by name or as the module
(what ESPnet's ``JointNetwork.joint_activation`` holds) and refuses the rest.

The derivative is the one autograd uses for the same module (so the fused gradient is
the dense path's): the functions of ``torch.ops.aten`` that autograd calls for tanh
and ReLU, autograd itself on the recomputed tile for the others.
"""

import copy
from dataclasses import dataclass
from typing import Callable, Union

import torch

#: names accepted for ``activation`` (ESPnet's ``get_activation`` names and torch's)
_TORCH_BY_NAME = {
    "tanh": torch.nn.Tanh,
    "relu": torch.nn.ReLU,
    "identity": torch.nn.Identity,
    "leaky_relu": torch.nn.LeakyReLU,  # ESPnet's default slope 0.01 is torch's
    "hardtanh": torch.nn.Hardtanh,
    "selu": torch.nn.SELU,
    "swish": torch.nn.SiLU,  # ESPnet's Swish with beta = 1 (its default)
    "silu": torch.nn.SiLU,
    "mish": torch.nn.Mish,
    "gelu": torch.nn.GELU,
    "elu": torch.nn.ELU,
    "sigmoid": torch.nn.Sigmoid,
}
#: elementwise torch modules without parameters (exactly these classes: a subclass may
#: compute anything)
_TORCH_MODULES = (
    torch.nn.Tanh,
    torch.nn.ReLU,
    torch.nn.Identity,
    torch.nn.LeakyReLU,
    torch.nn.Hardtanh,
    torch.nn.ReLU6,
    torch.nn.SELU,
    torch.nn.SiLU,
    torch.nn.Mish,
    torch.nn.GELU,
    torch.nn.ELU,
    torch.nn.CELU,
    torch.nn.Sigmoid,
    torch.nn.Softplus,
)
#: ESPnet's own elementwise activations (espnet2.asr_transducer.activation)
_ESPNET_MODULE = "espnet2.asr_transducer.activation"
_ESPNET_CLASSES = ("FTSwish", "Mish", "Smish", "Swish")
#: names ESPnet's get_activation builds from its own classes
_ESPNET_NAMES = ("ftswish", "smish")

ActivationArg = Union[str, torch.nn.Module]


@dataclass(frozen=True)
class JointActivation:
    """An elementwise activation and its exact derivative.

    Attributes:
        name: what it is (for messages and ``repr``).
        module: the module applied (``module(pre)``).
        forward: ``forward(pre, out) -> h``: h = module(pre), written into ``out``
            (same shape and dtype as pre) when the activation has an out= form, else
            a new tensor.
        backward: ``backward(dh, pre, h) -> d_pre``, dh / pre / h (R, J) tensors of
            one dtype; may overwrite ``dh`` (and return it).
    """

    name: str
    module: torch.nn.Module
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    backward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

    def __call__(self, pre: torch.Tensor) -> torch.Tensor:
        return self.module(pre)


def _tanh_forward(pre, out):
    return torch.tanh(pre, out=out)


def _tanh_backward(dh, pre, h):  # autograd's tanh backward, into dh
    return torch.ops.aten.tanh_backward.grad_input(dh, h, grad_input=dh)


def _relu_backward(dh, pre, h):  # autograd's relu backward, into dh
    return torch.ops.aten.threshold_backward.grad_input(dh, h, 0, grad_input=dh)


def _identity_backward(dh, pre, h):
    return dh


def _module_forward(module):
    def forward(pre, out):
        return module(pre)

    return forward


def _autograd_backward(module):
    def backward(dh, pre, h):
        with torch.enable_grad():
            x = pre.detach().requires_grad_(True)
            (d_pre,) = torch.autograd.grad(module(x), x, dh)
        return d_pre

    return backward


def _is_espnet_activation(module) -> bool:
    cls = type(module)
    return cls.__module__ == _ESPNET_MODULE and cls.__name__ in _ESPNET_CLASSES


def _refuse(activation) -> ValueError:
    names = sorted(set(_TORCH_BY_NAME) | set(_ESPNET_NAMES))
    return ValueError(
        "activation must be an elementwise activation without parameters: one of "
        f"{names}, or such a module (torch.nn.Tanh, ReLU, ... or ESPnet's "
        f"{', '.join(_ESPNET_CLASSES)}); got {activation!r}"
    )


def joint_activation(activation: ActivationArg) -> JointActivation:
    """The :class:`JointActivation` of ``activation``.

    Args:
        activation: a name (``"tanh"``, ``"relu"``, ... as ESPnet's
            ``joint_activation_type``; ``"ftswish"`` and ``"smish"`` need ESPnet) or an
            elementwise module without parameters (torch's, or ESPnet's FTSwish, Mish,
            Smish, Swish). A module set to work in place is applied out of place.
    Raises:
        TypeError when ``activation`` is neither a str nor a module; ValueError
        naming it when it is not an activation the fused loss can differentiate.
    """
    if isinstance(activation, str):
        if activation in _TORCH_BY_NAME:
            module = _TORCH_BY_NAME[activation]()
        elif activation in _ESPNET_NAMES:
            from espnet2.asr_transducer.activation import get_activation

            module = get_activation(activation)
        else:
            raise _refuse(activation)
    elif isinstance(activation, torch.nn.Module):
        module = activation
        if not (type(module) in _TORCH_MODULES or _is_espnet_activation(module)):
            raise _refuse(activation)
        if any(True for _ in module.parameters()):
            raise _refuse(activation)
        if getattr(module, "inplace", False):
            module = copy.copy(module)
            module.inplace = False
    else:
        raise TypeError(
            "activation must be a str or a torch.nn.Module, got "
            f"{type(activation).__name__} ({activation!r})"
        )
    forward = _module_forward(module)
    if type(module) is torch.nn.Tanh:
        forward, backward = _tanh_forward, _tanh_backward
    elif type(module) is torch.nn.ReLU:
        backward = _relu_backward
    elif type(module) is torch.nn.Identity:
        backward = _identity_backward
    else:
        backward = _autograd_backward(module)
    name = activation if isinstance(activation, str) else repr(module)
    return JointActivation(name, module, forward, backward)
