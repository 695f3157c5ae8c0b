"""Gradient-scaling wrappers for ESPnet frontends and pre-encoders.

``frontend: grad_scaled`` / ``preencoder: grad_scaled`` wrap any registered frontend /
pre-encoder; the output goes through :class:`espnet_multiblank.GradMultiply`, so the
forward pass is unchanged and every parameter upstream (the wrapped module's and, for
a pre-encoder, the frontend's) receives ``grad_scale`` x its gradient: wav2vec 2.0 /
HuBERT's ``feature_grad_mult``. Example (ESPnet's raw-waveform front end)::

    frontend: sliding_window
    frontend_conf: {win_length: 400, hop_length: 160}
    preencoder: grad_scaled
    preencoder_conf:
        preencoder: sinc
        preencoder_conf: {in_channels: 1, out_channels: 256}
        grad_scale: 0.1
"""

import math
from typing import Optional, Tuple

import torch
from espnet2.asr.frontend.abs_frontend import AbsFrontend
from espnet2.asr.preencoder.abs_preencoder import AbsPreEncoder
from typeguard import typechecked

from espnet_multiblank.autograd import GradMultiply
from espnet_multiblank.espnet.errors import ConfigError

#: Choice name of both wrappers.
NAME = "grad_scaled"


def _build_inner(kind: str, name: str, conf: Optional[dict], grad_scale: float):
    """Instantiate the wrapped ``kind`` ("frontend"/"preencoder") class ``name``."""
    from espnet2.tasks import asr  # lazily: the task module imports the registry

    key = f"{kind}_conf"
    if isinstance(grad_scale, bool) or not math.isfinite(grad_scale):
        raise ConfigError(
            f"{key}.grad_scale must be a finite number, got {grad_scale!r}"
        )
    choices = getattr(asr, f"{kind}_choices")
    name_l = name.lower()
    if name_l == NAME:
        raise ConfigError(f"{key}.{kind} cannot be {NAME!r} itself")
    if name_l not in choices.classes:
        available = sorted(k for k in choices.classes if k != NAME)
        raise ConfigError(f"{key}.{kind} must be one of {available}, got {name!r}")
    try:
        return choices.classes[name_l](**(conf or {}))
    except TypeError as e:
        raise ConfigError(
            f"{key}.{kind}_conf is invalid for {kind} {name!r}: {e}"
        ) from e


def _scale(x: torch.Tensor, grad_scale: float) -> torch.Tensor:
    if grad_scale == 1.0 or not x.requires_grad:
        return x
    return GradMultiply.apply(x, grad_scale)


class GradScaledFrontend(AbsFrontend):
    """Any ESPnet frontend whose output gradient is multiplied by ``grad_scale``.

    Args:
        frontend: name of the wrapped frontend choice (e.g. "wav2vec_cnn", "s3prl").
        frontend_conf: keyword arguments of the wrapped frontend.
        grad_scale: gradient multiplier (wav2vec 2.0 uses 0.1; 0 freezes the
            frontend's training signal, negative values reverse the gradient).

    The wrapped module is ``self.frontend`` (its parameters are named
    ``frontend.frontend.*`` in the model's state dict).
    """

    @typechecked
    def __init__(
        self,
        frontend: str,
        frontend_conf: Optional[dict] = None,
        grad_scale: float = 1.0,
    ):
        super().__init__()
        self.frontend = _build_inner("frontend", frontend, frontend_conf, grad_scale)
        self.grad_scale = float(grad_scale)

    def output_size(self) -> int:
        return self.frontend.output_size()

    def forward(
        self, input: torch.Tensor, input_lengths: torch.Tensor, *args, **kwargs
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        feats, feats_lengths = self.frontend(input, input_lengths, *args, **kwargs)
        return _scale(feats, self.grad_scale), feats_lengths

    def extra_repr(self) -> str:
        return f"grad_scale={self.grad_scale}"


class GradScaledPreEncoder(AbsPreEncoder):
    """Any ESPnet pre-encoder whose output gradient is multiplied by ``grad_scale``.

    Args:
        preencoder: name of the wrapped pre-encoder choice (e.g. "sinc", "linear").
        preencoder_conf: keyword arguments of the wrapped pre-encoder.
        grad_scale: gradient multiplier for the pre-encoder and everything upstream.
    """

    @typechecked
    def __init__(
        self,
        preencoder: str,
        preencoder_conf: Optional[dict] = None,
        grad_scale: float = 1.0,
    ):
        super().__init__()
        self.preencoder = _build_inner(
            "preencoder", preencoder, preencoder_conf, grad_scale
        )
        self.grad_scale = float(grad_scale)

    def output_size(self) -> int:
        return self.preencoder.output_size()

    def forward(
        self, input: torch.Tensor, input_lengths: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        out, out_lengths = self.preencoder(input, input_lengths)
        return _scale(out, self.grad_scale), out_lengths

    def extra_repr(self) -> str:
        return f"grad_scale={self.grad_scale}"
