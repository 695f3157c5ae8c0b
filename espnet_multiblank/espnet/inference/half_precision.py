"""Decoding in half precision (``--dtype float16`` / ``bfloat16``) with the frontend
and the feature normalisation in float32.

In float16 the STFT's power spectrum overflows (inf features, NaN scores for every
utterance), in bfloat16 the waveform and the features lose all but 8 bits: the
frontend and the normalisation run in float32 on a float32 waveform, and the encoder
gets their output in the model's dtype. The encoder and the search run in the
model's dtype.
"""

import functools
from typing import Any, Tuple

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)


def inputs_to_float32(module: torch.nn.Module, args: Tuple) -> Tuple:
    """Forward pre-hook: the first argument (the waveform, (B, L)) in float32."""
    return (args[0].float(),) + tuple(args[1:])


def features_to(
    dtype: torch.dtype, module: torch.nn.Module, args: Tuple, out: Tuple
) -> Tuple:
    """Forward hook: the features (the output's first entry, (B, T, F)) in
    ``dtype``."""
    return (out[0].to(dtype),) + tuple(out[1:])


def needs_float32_frontend(model: Any, dtype: torch.dtype) -> bool:
    """Whether a model decoded in ``dtype`` needs :func:`run_frontend_in_float32`
    (a half dtype and a frontend)."""
    return dtype in HALF_DTYPES and getattr(model, "frontend", None) is not None


def run_frontend_in_float32(model: Any, dtype: torch.dtype) -> None:
    """Put the model's frontend and normalisation in float32, with hooks that give
    the frontend a float32 waveform and the encoder features in ``dtype`` (the
    model's). The hooks go on the modules there now: make the model batch-exact
    first (that may replace them)."""
    frontend, normalize = model.frontend, getattr(model, "normalize", None)
    for module in (frontend, normalize):
        if module is not None:
            module.float()
    frontend.register_forward_pre_hook(inputs_to_float32)
    last = normalize if normalize is not None else frontend
    last.register_forward_hook(functools.partial(features_to, dtype))
