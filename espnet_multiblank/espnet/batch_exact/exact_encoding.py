"""Batch-exact encoding: each utterance of a padded batch encoded as if alone.

:func:`make_batch_exact` inspects an ESPnet ASR model's path from the waveform to the
encoder output (frontend, normalisation, pre-encoder, encoder, post-encoder) and, when
every module on it is one whose behaviour on padded input is known, replaces those
that mix padding into valid frames by the padding-invariant versions of
:mod:`espnet_multiblank.espnet.batch_exact.exact_layers`:

* the frontend's ``Stft`` (``center=True``) -> :class:`ExactStft`;
* ``UtteranceMVN`` -> :class:`ExactUtteranceMVN` (variance over valid frames);
* ``Conv2dSubsampling*`` -> the output mask from each utterance's own length
  (a forward hook, :func:`subsampling_mask_hook`);
* the conformer's convolution modules and blocks -> :class:`MaskedConvolutionModule`
  and :class:`MaskedConformerEncoderLayer`.

Encoders defined elsewhere that never let padding reach a valid frame declare their
classes with :func:`declare_padding_invariant` (``encoder: chunk_conformer`` does);
they are accepted as they are. Everything else on the path is per frame (linear
layers, layer norm, activations, log-mel, global MVN) or already masked (self-attention
with absolute or relative (``rel_pos``) positions, whose scores depend on the relative
offset only). Classes are swapped on the instances, so parameters, state-dict keys and
an unpadded utterance's output are unchanged, and training sees the same function as
decoding. A path with any other module (another encoder type, convolutional positional
embedding, ``legacy_rel_pos``, conv1d feed-forwards, WPE/beamformer frontends, ...)
is left untouched and reported as not exact, with the module that prevents it.
"""

import dataclasses
import logging
from typing import Callable, Dict, List, Optional

import torch
from espnet2.asr.encoder.conformer_encoder import ConformerEncoder
from espnet2.asr.encoder.transformer_encoder import TransformerEncoder
from espnet2.asr.espnet_model import ESPnetASRModel
from espnet2.asr.frontend.default import DefaultFrontend
from espnet2.asr.preencoder.linear import LinearProjection
from espnet2.layers.global_mvn import GlobalMVN
from espnet2.layers.log_mel import LogMel
from espnet2.layers.stft import Stft
from espnet2.layers.utterance_mvn import UtteranceMVN

from espnet_multiblank.espnet.batch_exact.exact_layers import (
    ExactStft,
    ExactUtteranceMVN,
    MaskedConformerEncoderLayer,
    MaskedConvolutionModule,
    subsampling_mask_hook,
)
from espnet_multiblank.espnet.compat import (
    ConformerEncoderLayer,
    Conv2dSubsampling,
    Conv2dSubsampling1,
    Conv2dSubsampling2,
    Conv2dSubsampling6,
    Conv2dSubsampling8,
    ConvolutionModule,
    Frontend,
    LayerNorm,
    MultiHeadedAttention,
    MultiSequential,
    PositionalEncoding,
    PositionwiseFeedForward,
    RelPositionalEncoding,
    RelPositionMultiHeadedAttention,
    ScaledPositionalEncoding,
    Swish,
    TransformerEncoderLayer,
)
from espnet_multiblank.espnet.frontends.grad_scaled import (
    GradScaledFrontend,
    GradScaledPreEncoder,
)

logger = logging.getLogger(__name__)

#: model attribute holding the :class:`BatchExactness` of the last inspection
ATTRIBUTE = "batch_exact_encoding"

_ELEMENTWISE = (
    torch.nn.ReLU,
    torch.nn.Hardtanh,
    torch.nn.Tanh,
    torch.nn.SELU,
    torch.nn.SiLU,
    torch.nn.GELU,
    torch.nn.Sigmoid,
    torch.nn.LeakyReLU,
    torch.nn.ELU,
    torch.nn.Dropout,
    torch.nn.Identity,
    Swish,
)

#: modules that act on each frame alone, mask their time mixing, or only call their
#: children (whose types are checked in turn)
_PER_FRAME_OR_MASKED = _ELEMENTWISE + (
    ConformerEncoder,
    TransformerEncoder,
    TransformerEncoderLayer,
    MultiSequential,
    torch.nn.Sequential,
    torch.nn.ModuleList,
    torch.nn.Linear,
    torch.nn.LayerNorm,
    torch.nn.Embedding,
    PositionwiseFeedForward,
    PositionalEncoding,
    ScaledPositionalEncoding,
    RelPositionalEncoding,
    MultiHeadedAttention,
    RelPositionMultiHeadedAttention,
)

_SUBSAMPLING = (
    Conv2dSubsampling,
    Conv2dSubsampling1,
    Conv2dSubsampling2,
    Conv2dSubsampling6,
    Conv2dSubsampling8,
)

_HOOK_HANDLE = "_batch_exact_mask_hook"

#: classes that the modules defining them declare padding-invariant by construction
#: (:func:`declare_padding_invariant`): class -> whether its children are checked
_DECLARED: Dict[type, bool] = {}


def declare_padding_invariant(cls: type, check_children: bool = True) -> None:
    """Declare the modules of class ``cls`` padding-invariant by construction.

    For an encoder defined outside ESPnet (e.g. ``encoder: chunk_conformer``) that
    never lets padding reach a valid frame: :func:`make_batch_exact` accepts it as
    the model's encoder or inside one, leaves it as it is, and checks its children
    (unless ``check_children`` is false: the whole subtree is the module's own
    concern).
    """
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise TypeError(f"cls must be a torch.nn.Module class, got {cls!r}")
    _DECLARED[cls] = bool(check_children)


@dataclasses.dataclass(frozen=True)
class BatchExactness:
    """Whether a model encodes each utterance of a padded batch as alone.

    Attributes:
        exact: True when :func:`make_batch_exact` made the model batch-exact.
        reason: why not (the module that prevents it); "" when exact.
    """

    exact: bool
    reason: str = ""


class _NotExact(Exception):
    pass


def _name(module: torch.nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _unknown(path: str, module: torch.nn.Module) -> _NotExact:
    return _NotExact(f"{path} ({_name(module)}) is not known to be padding-invariant")


def _swap_class(module: torch.nn.Module, cls: type) -> Callable[[], None]:
    def apply():
        module.__class__ = cls

    return apply


def _frontend(frontend, path: str, actions: List[Callable[[], None]]) -> None:
    if frontend is None:
        return
    if type(frontend) is GradScaledFrontend:
        return _frontend(frontend.frontend, path + ".frontend", actions)
    if type(frontend) is not DefaultFrontend:
        raise _unknown(path, frontend)
    stft = frontend.stft
    if stft is not None:
        if type(stft) not in (Stft, ExactStft):
            raise _unknown(path + ".stft", stft)
        if stft.center:
            actions.append(_swap_class(stft, ExactStft))
    enhancement = frontend.frontend
    if enhancement is not None and (
        type(enhancement) is not Frontend
        or enhancement.use_wpe
        or enhancement.use_beamformer
    ):
        raise _NotExact(f"{path}.frontend: WPE / beamforming is not padding-invariant")
    if type(frontend.logmel) is not LogMel:
        raise _unknown(path + ".logmel", frontend.logmel)


def _preencoder(preencoder, path: str) -> None:
    if preencoder is None:
        return
    if type(preencoder) is GradScaledPreEncoder:
        return _preencoder(preencoder.preencoder, path + ".preencoder")
    if type(preencoder) is not LinearProjection:
        raise _unknown(path, preencoder)


def _check_conv2d_stack(stack: torch.nn.Module, path: str) -> None:
    for name, child in stack.named_children():
        if type(child) is not torch.nn.Conv2d and not isinstance(child, _ELEMENTWISE):
            raise _unknown(f"{path}.{name}", child)


def _check_convolution_module(conv: ConvolutionModule, path: str) -> None:
    """The module must be ESPnet's: pointwise -> GLU -> 'same' depthwise -> batch
    norm with running statistics -> activation -> pointwise."""
    dw = conv.depthwise_conv
    k = dw.kernel_size[0]
    same = (
        type(dw) is torch.nn.Conv1d
        and dw.stride == (1,)
        and dw.dilation == (1,)
        and dw.padding == ((k - 1) // 2,)
        and dw.padding_mode == "zeros"
        and dw.groups == dw.in_channels == dw.out_channels
    )
    if not same:
        raise _NotExact(f"{path}.depthwise_conv ({dw}) is not a 'same' depthwise conv")
    for name in ("pointwise_conv1", "pointwise_conv2"):
        pw = getattr(conv, name)
        if type(pw) is not torch.nn.Conv1d or pw.kernel_size != (1,):
            raise _unknown(f"{path}.{name}", pw)
    if type(conv.norm) is not torch.nn.BatchNorm1d or not conv.norm.track_running_stats:
        raise _NotExact(
            f"{path}.norm ({conv.norm}) must be BatchNorm1d with running statistics"
        )
    if not isinstance(conv.activation, _ELEMENTWISE):
        raise _unknown(f"{path}.activation", conv.activation)
    names = {n for n, _ in conv.named_children()}
    expected = {"pointwise_conv1", "depthwise_conv", "norm", "pointwise_conv2"}
    if not names <= expected | {"activation"}:
        raise _NotExact(f"{path} has unexpected submodules {sorted(names - expected)}")


def _encoder_module(
    module: torch.nn.Module, path: str, actions: List[Callable[[], None]]
) -> None:
    """Check ``module`` and its subtree; queue the replacements it needs."""
    kind = type(module)
    if kind in _DECLARED:
        if _DECLARED[kind]:
            for name, child in module.named_children():
                _encoder_module(child, f"{path}.{name}", actions)
        return
    if kind in _SUBSAMPLING:
        # ESPnet 202511: conv, out = Sequential(Linear, positional encoding);
        # 202611: conv, out = Linear, pos_enc: every child but conv is checked
        for name, child in module.named_children():
            if name == "conv":
                _check_conv2d_stack(child, f"{path}.conv")
            else:
                _encoder_module(child, f"{path}.{name}", actions)
        if getattr(module, _HOOK_HANDLE, None) is None:

            def hook(module=module):
                handle = module.register_forward_hook(subsampling_mask_hook)
                setattr(module, _HOOK_HANDLE, handle)

            actions.append(hook)
        return
    if kind in (ConvolutionModule, MaskedConvolutionModule):
        _check_convolution_module(module, path)
        actions.append(_swap_class(module, MaskedConvolutionModule))
        return
    if kind in (ConformerEncoderLayer, MaskedConformerEncoderLayer):
        actions.append(_swap_class(module, MaskedConformerEncoderLayer))
    elif kind is LayerNorm:
        if module.dim != -1:
            raise _NotExact(f"{path} normalises over dim {module.dim}, not features")
    elif kind in (ConformerEncoder, TransformerEncoder):
        if getattr(module, "ctc_trim", False):
            raise _NotExact(f"{path}: ctc_trim is not supported")
    elif kind not in _PER_FRAME_OR_MASKED:
        raise _unknown(path, module)
    for name, child in module.named_children():
        _encoder_module(child, f"{path}.{name}", actions)


def _plan(model: torch.nn.Module) -> List[Callable[[], None]]:
    if not isinstance(model, ESPnetASRModel):
        raise _NotExact(f"model ({_name(model)}) is not an ESPnetASRModel")
    for method in ("encode", "_extract_feats"):
        if getattr(type(model), method) is not getattr(ESPnetASRModel, method):
            raise _NotExact(f"model.{method} is not ESPnet's ESPnetASRModel.{method}")
    actions: List[Callable[[], None]] = []
    _frontend(model.frontend, "frontend", actions)
    normalize = model.normalize
    if type(normalize) in (UtteranceMVN, ExactUtteranceMVN):
        actions.append(_swap_class(normalize, ExactUtteranceMVN))
    elif normalize is not None and type(normalize) is not GlobalMVN:
        raise _unknown("normalize", normalize)
    _preencoder(model.preencoder, "preencoder")
    if model.encoder is not None:
        known = (ConformerEncoder, TransformerEncoder) + tuple(_DECLARED)
        if type(model.encoder) not in known:
            raise _unknown("encoder", model.encoder)
        _encoder_module(model.encoder, "encoder", actions)
    if model.postencoder is not None:
        raise _unknown("postencoder", model.postencoder)
    return actions


def make_batch_exact(model: torch.nn.Module) -> BatchExactness:
    """Make ``model.encode`` give every utterance of a padded batch the encoder output
    and length it gets alone, where the model's modules allow it.

    All or nothing: the model is modified only when the whole path from the input to
    the encoder output can be made exact. Idempotent. The result is also stored as
    ``model.batch_exact_encoding``.

    Args:
        model: an ESPnet ASR model (``ESPnetASRModel`` or a subclass that keeps its
            ``encode``).

    Returns:
        :class:`BatchExactness`; ``reason`` names the module that prevents it.
    """
    try:
        actions = _plan(model)
    except _NotExact as e:
        result = BatchExactness(False, str(e))
    else:
        for apply in actions:
            apply()
        result = BatchExactness(True)
    object.__setattr__(model, ATTRIBUTE, result)
    return result


def batch_exactness(model: torch.nn.Module) -> Optional[BatchExactness]:
    """What :func:`make_batch_exact` found for ``model`` (None if never called)."""
    return getattr(model, ATTRIBUTE, None)
