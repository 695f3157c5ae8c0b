"""Padding-invariant versions of the ESPnet layers that mix padding into valid frames.

In a padded batch, ESPnet's ASR front end and conformer give the frames of a short
utterance values that differ from those it gets alone, in these places:

* :class:`espnet2.layers.stft.Stft` with ``center=True`` pads the *batch* by
  reflection, so the last frames of a shorter utterance see the zeros after it instead
  of its own reflected samples;
* ESPnet's ``Conv2dSubsampling`` (``nets.pytorch_backend.transformer.subsampling``; and
  its 1/2/6/8 variants) derives the output mask by slicing the input mask, which for a
  padded utterance keeps one frame more than the convolutions compute from its own
  samples; that frame is made of padding and is then attended to;
* :class:`espnet2.layers.utterance_mvn.UtteranceMVN` with ``norm_vars`` counts the
  padded frames (minus the mean) in the variance (ESPnet 202511; 202611 zeroes them);
* the conformer's ``ConvolutionModule`` (``nets.pytorch_backend.conformer.convolution``)
  convolves over time without a mask, so the depthwise convolution
  reads the padded frames (the GLU of the bias, not zeros) into the last valid frames,
  and in training its batch norm takes statistics over padded frames too.

The classes here replace them on an existing model without changing its parameters or
state dict (the instance's class is swapped, see
:mod:`espnet_multiblank.espnet.batch_exact.exact_encoding`): each computes, for every
valid frame, what the utterance alone gives (to float rounding) and the same lengths.
"""

import contextlib
from typing import Iterator, Optional, Tuple

import torch
from espnet2.layers.stft import Stft
from espnet2.layers.utterance_mvn import UtteranceMVN

from espnet_multiblank.espnet.compat import (
    ConformerEncoderLayer,
    ConvolutionModule,
    make_pad_mask,
)


def reflect_pad_each(
    signal: torch.Tensor, lengths: torch.Tensor, pad: int
) -> torch.Tensor:
    """Reflect-pad each utterance by ``pad`` samples at both ends of its own samples.

    What ``torch.stft(center=True)`` does to one unpadded utterance, done per row of a
    padded batch. Rows shorter than ``pad + 1`` samples (which ``torch.stft`` refuses
    to reflect alone) are padded with their first/last sample where the reflection
    would leave the utterance.

    Args:
        signal: (B, L) or (B, L, C) padded waveforms, any float dtype.
        lengths: (B,) int64 valid samples per row, <= L.
        pad: samples added at each end (>= 0).

    Returns:
        (B, L + 2 * pad) or (B, L + 2 * pad, C), same dtype as ``signal``; row b holds
        its reflected utterance in ``[0, lengths[b] + 2 * pad)`` and zeros after.
    """
    batch, length = signal.shape[:2]
    pos = torch.arange(length + 2 * pad, device=signal.device) - pad  # (L + 2 pad,)
    lengths = lengths.to(signal.device)[:, None]  # (B, 1)
    last = (lengths - 1).clamp(min=0)
    src = pos[None, :].abs()  # reflection at the start: -k -> k
    src = torch.where(
        src > last, 2 * last - src, src
    )  # at the end: last + k -> last - k
    src = torch.minimum(src.clamp(min=0), last)  # (B, L + 2 pad)
    valid = pos[None, :] < lengths + pad
    index = src.view(batch, -1, *([1] * (signal.dim() - 2))).expand(
        -1, -1, *signal.shape[2:]
    )
    out = torch.gather(signal, 1, index)
    return out * valid.view(batch, -1, *([1] * (signal.dim() - 2))).to(out.dtype)


class ExactStft(Stft):
    """``Stft`` whose frames of each utterance do not depend on the batch's padding.

    With ``center=True`` each utterance is reflect-padded from its own samples (as
    ``torch.stft`` does for it alone) and the transform runs with ``center=False`` on
    the result; output lengths are ESPnet's (``ilens // hop_length + 1`` for an even
    ``n_fft``). Without ``ilens`` or with ``center=False`` this is ESPnet's ``Stft``
    (a non-centred frame only covers samples of its own utterance).
    """

    def forward(
        self, input: torch.Tensor, ilens: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Args: input (B, L) or (B, L, C) float; ilens (B,) int. Returns ESPnet's
        ``(output (B, T, F, 2) or (B, T, C, F, 2), olens (B,))``."""
        if not self.center or ilens is None:
            return super().forward(input, ilens)
        pad = self.n_fft // 2
        padded = reflect_pad_each(input, ilens, pad)
        # ESPnet's olens for center=False on the padded signal equal its olens for
        # center=True on the original one.
        self.center = False
        try:
            return super().forward(padded, ilens + 2 * pad)
        finally:
            self.center = True


class ExactUtteranceMVN(UtteranceMVN):
    """``UtteranceMVN`` whose variance ignores the padded frames.

    With ``norm_means`` and ``norm_vars`` ESPnet's ``utterance_mvn`` subtracts the
    mean from every frame, padded ones included, and then sums the squares of all
    frames: a padded utterance's variance counts ``mean ** 2`` once per padded frame.
    Here the padded frames are zeroed before the squares are summed (padded frames of
    the output are 0). Without ``norm_vars`` (or without ``ilens``) this is ESPnet's.
    """

    def forward(
        self, x: torch.Tensor, ilens: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Args: x (B, T, D) float; ilens (B,) int. Returns ``(x (B, T, D), ilens)``."""
        if not self.norm_vars or ilens is None:
            return super().forward(x, ilens)
        pad = make_pad_mask(ilens, x, 1)  # (B, T, D) bool, True on padded frames
        count = ilens.to(x.device, x.dtype).view(-1, *([1] * (x.dim() - 1)))
        x = x.masked_fill(pad, 0.0)
        mean = x.sum(dim=1, keepdim=True) / count
        centred = (x - mean).masked_fill(pad, 0.0)
        var = centred.pow(2).sum(dim=1, keepdim=True) / count
        std = torch.clamp(var.sqrt(), min=self.eps)
        return (centred if self.norm_means else x) / std, ilens


def masked_batch_norm(
    norm: torch.nn.BatchNorm1d, x: torch.Tensor, mask: Optional[torch.Tensor]
) -> torch.Tensor:
    """``norm(x)`` whose training statistics are taken over the valid frames only.

    In eval mode (or without padding) this is ``norm(x)``: with running statistics
    batch norm treats every frame alone. In training the batch mean/variance and the
    running-statistics update come from the valid frames, exactly as ``norm`` applied
    to their concatenation would compute them; padded frames of the output are 0.

    Args:
        norm: ``torch.nn.BatchNorm1d`` over ``C`` channels.
        x: (B, C, T) float.
        mask: (B, 1, T) bool, True on valid frames; None = all valid.

    Returns:
        (B, C, T), dtype of ``x``.
    """
    if mask is None or not norm.training or bool(mask.all()):
        return norm(x)
    factor = 0.0
    if norm.track_running_stats:
        norm.num_batches_tracked.add_(1)
        if norm.momentum is None:  # cumulative moving average, as torch does
            factor = 1.0 / float(norm.num_batches_tracked)
        else:
            factor = norm.momentum
    frames = x.transpose(1, 2)  # (B, T, C)
    valid = mask[:, 0, :]  # (B, T)
    normed = torch.nn.functional.batch_norm(
        frames[valid],  # (N, C)
        norm.running_mean if norm.track_running_stats else None,
        norm.running_var if norm.track_running_stats else None,
        norm.weight,
        norm.bias,
        True,
        factor,
        norm.eps,
    )
    out = frames.new_zeros(frames.shape)
    out[valid] = normed
    return out.transpose(1, 2)


class MaskedConvolutionModule(ConvolutionModule):
    """The conformer's convolution module with padded frames zeroed before the
    depthwise convolution.

    The padded utterance's valid frames then see zeros after their last frame, as the
    convolution's own zero padding gives the utterance alone, and batch norm's
    training statistics ignore padded frames (:func:`masked_batch_norm`).
    :class:`MaskedConformerEncoderLayer` sets :attr:`frame_mask` for the duration of
    its forward; with ``frame_mask = None`` this is ESPnet's module.
    """

    #: (B, 1, T) bool, True on valid frames, or None (no mask).
    frame_mask: Optional[torch.Tensor] = None

    def forward(
        self, x: torch.Tensor, mask_pad: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Args: x (B, T, C) float; mask_pad (B, 1, T) bool or None: the mask that
        ESPnet 202611's conformer block passes to its convolution module (ESPnet
        202511's passes none; :attr:`frame_mask` then holds it). A ``mask_pad``
        whose shape does not match ``x`` (a cached streaming step) is ignored, as
        ESPnet does. Returns (B, T, C)."""
        mask = self.frame_mask
        if mask is None and mask_pad is not None:
            if mask_pad.shape == (x.size(0), 1, x.size(1)):
                mask = mask_pad.bool()
        if mask is not None and mask.shape != (x.size(0), 1, x.size(1)):
            raise ValueError(
                f"frame_mask must have shape (batch, 1, time) = "
                f"{(x.size(0), 1, x.size(1))}, got {tuple(mask.shape)}"
            )
        x = x.transpose(1, 2)
        x = self.pointwise_conv1(x)  # (B, 2C, T)
        x = torch.nn.functional.glu(x, dim=1)  # (B, C, T)
        if mask is not None:
            x = x.masked_fill(~mask, 0.0)
        x = self.depthwise_conv(x)
        x = self.activation(masked_batch_norm(self.norm, x, mask))
        x = self.pointwise_conv2(x)
        return x.transpose(1, 2)


@contextlib.contextmanager
def masking_frames(
    conv: torch.nn.Module, frame_mask: Optional[torch.Tensor]
) -> Iterator[None]:
    """``conv.frame_mask = frame_mask`` ((B, 1, T) bool, True on valid frames) for
    the duration of a block's forward, None again after it (also after an error):
    how a conformer block gives its convolution module the padding mask that
    ESPnet's block does not pass."""
    conv.frame_mask = frame_mask
    try:
        yield
    finally:
        conv.frame_mask = None


class MaskedConformerEncoderLayer(ConformerEncoderLayer):
    """The conformer block, passing its frame mask to its convolution module.

    ESPnet 202511's block calls ``conv_module(x)`` without the mask it holds
    (202611's passes it as ``mask_pad``, but its batch norm still takes training
    statistics over padded frames); this one sets ``conv_module.frame_mask`` (a
    :class:`MaskedConvolutionModule`) for the duration of the call, in either
    version. In streaming mode (``cache`` given) the module runs unmasked, as in
    ESPnet.
    """

    def forward(self, x_input, mask, cache=None):
        """ESPnet's ``EncoderLayer.forward``: x_input (B, T, D) or ((B, T, D),
        pos_emb); mask (B, 1, T) bool. Returns ``(x, mask)``."""
        conv = self.conv_module
        if not isinstance(conv, MaskedConvolutionModule) or cache is not None:
            return super().forward(x_input, mask, cache)
        with masking_frames(conv, mask):
            return super().forward(x_input, mask, cache)


def conv_output_lengths(
    convs: Tuple[torch.nn.Module, ...], lengths: torch.Tensor
) -> torch.Tensor:
    """Frames a stack of convolutions computes along time (dim 2 of ``Conv2d``'s
    (B, C, T, F) input; dim 2 of ``Conv1d``'s (B, C, T)) from ``lengths`` frames.

    Args:
        convs: the ``Conv1d`` / ``Conv2d`` modules in order.
        lengths: (B,) int64.

    Returns:
        (B,) int64, >= 0.
    """
    for conv in convs:
        k, s = conv.kernel_size[0], conv.stride[0]
        p, d = conv.padding[0], conv.dilation[0]
        lengths = (
            torch.div(lengths + 2 * p - d * (k - 1) - 1, s, rounding_mode="floor") + 1
        )
        lengths = lengths.clamp(min=0)
    return lengths


def subsampling_mask_hook(module: torch.nn.Module, args: tuple, output: tuple):
    """Forward hook of a ``Conv2dSubsampling*``: the output mask from the frames
    its convolutions compute for each utterance's own length.

    ESPnet slices the input mask (``x_mask[:, :, :-2:2][:, :, :-2:2]``), which equals
    this for an unpadded utterance but counts one frame more for a padded one (for
    ``T`` input frames, ``ceil(T / 2)`` instead of ``(T - 1) // 2`` after the first
    stride-2 convolution).

    Args (torch's forward-hook signature):
        args: ``(x (B, T, F), x_mask (B, 1, T) bool or None)``.
        output: ``(x (B, T', D) or (x, pos_emb), x_mask (B, 1, T') bool or None)``.

    Returns:
        ``output`` with the mask replaced (None when there is no input mask).
    """
    if len(args) < 2 or args[1] is None:
        return None
    x_out, _ = output
    frames = (x_out[0] if isinstance(x_out, tuple) else x_out).size(1)
    lengths = args[1][:, 0, :].sum(dim=-1)  # (B,)
    convs = tuple(m for m in module.conv if isinstance(m, torch.nn.Conv2d))
    out_lengths = conv_output_lengths(convs, lengths)
    mask = torch.arange(frames, device=lengths.device)[None, :] < out_lengths[:, None]
    return x_out, mask[:, None, :]
