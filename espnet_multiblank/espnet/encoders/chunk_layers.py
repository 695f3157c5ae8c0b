"""The layers of ``encoder: chunk_conformer`` and their chunk-by-chunk forward.

* :class:`CausalConvolutionModule`: ESPnet's conformer convolution module whose
  depthwise convolution looks only to the left (``K - 1`` frames of zeros before the
  first frame instead of ``(K - 1) / 2`` on each side): a frame's output never
  depends on a later frame, so the module streams, and padding after an utterance
  never reaches its frames. Same parameters as ESPnet's module (the class is
  swapped on the instance); batch norm takes its training statistics over valid
  frames only (:func:`~espnet_multiblank.espnet.batch_exact.exact_layers.
  masked_batch_norm`).
* :class:`ChunkConformerEncoderLayer`: ESPnet's conformer block, given the padding
  mask for its convolution module, with :meth:`~ChunkConformerEncoderLayer.
  forward_chunk`: one chunk of frames with the keys and values of the frames before
  it (:class:`LayerCache`) and the convolution's left context.
* :func:`rel_attention_chunk`: ESPnet's relative-position self-attention
  (``rel_pos_type: latest``) for the queries of one chunk against cached keys.

The chunk forward computes what the full forward with the chunk attention mask
computes (to float rounding; tested): the same keys, the same relative positions,
the same left context of the convolution.

Notation: B = batch, C = frames of the chunk, L = cached frames before it,
D = model size, H = heads, d_k = D / H, K = depthwise kernel size.
"""

import math
from typing import NamedTuple, Optional, Tuple

import torch

from espnet_multiblank.espnet.batch_exact.exact_layers import (
    masked_batch_norm,
    masking_frames,
)
from espnet_multiblank.espnet.compat import ConformerEncoderLayer as EncoderLayer
from espnet_multiblank.espnet.compat import ConvolutionModule


class LayerCache(NamedTuple):
    """What a block keeps of the frames before the current chunk.

    Attributes:
        key, value: (B, H, L, d_k) the self-attention's keys and values of the last
            L frames (those the next chunk may attend to).
        conv: (B, D, K - 1) the depthwise convolution's input of the last K - 1
            frames (zeros before the first frame), or None without a convolution
            module.
    """

    key: torch.Tensor
    value: torch.Tensor
    conv: Optional[torch.Tensor]


class CausalConvolutionModule(ConvolutionModule):
    """The conformer convolution module with a causal depthwise convolution (module
    docstring).

    :attr:`frame_mask` ((B, 1, T) bool, True on valid frames) is set by the block for
    the duration of its forward: padded frames are zeroed before the depthwise
    convolution and left out of batch norm's training statistics.
    """

    frame_mask: Optional[torch.Tensor] = None

    @property
    def context(self) -> int:
        """K - 1: the frames before a frame that its output depends on."""
        return self.depthwise_conv.kernel_size[0] - 1

    def _depthwise(self, x: torch.Tensor) -> torch.Tensor:
        """The depthwise convolution without padding: (B, D, K - 1 + C) -> (B, D, C)."""
        dw = self.depthwise_conv
        return torch.nn.functional.conv1d(x, dw.weight, dw.bias, groups=dw.groups)

    def _glu(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> pointwise convolution and GLU, (B, D, T)."""
        x = self.pointwise_conv1(x.transpose(1, 2))  # (B, 2 D, T)
        return torch.nn.functional.glu(x, dim=1)

    def _out(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """(B, D, T) after the depthwise convolution -> (B, T, D)."""
        x = self.activation(masked_batch_norm(self.norm, x, mask))
        return self.pointwise_conv2(x).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask_pad: Optional[torch.Tensor] = None):
        """Args: x (B, T, D) float (``mask_pad`` is ignored: :attr:`frame_mask`
        holds the padding mask). Returns (B, T, D)."""
        mask = self.frame_mask
        x = self._glu(x)
        if mask is not None:
            x = x.masked_fill(~mask, 0.0)
        x = torch.nn.functional.pad(x, (self.context, 0))
        return self._out(self._depthwise(x), mask)

    def forward_chunk(
        self, x: torch.Tensor, cache: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """One chunk after the frames whose depthwise input is ``cache`` (eval
        mode). The same arithmetic as :meth:`forward` in another form, cheaper on a
        few frames: the pointwise convolutions as matrix products, the depthwise one
        as a sum over the kernel's taps.

        Args:
            x: (B, C, D) the chunk's input.
            cache: (B, D, K - 1) depthwise input of the K - 1 frames before it.

        Returns:
            (B, C, D) output and the (B, D, K - 1) cache for the next chunk.
        """
        pw1, dw, pw2 = self.pointwise_conv1, self.depthwise_conv, self.pointwise_conv2
        x = torch.nn.functional.linear(x, pw1.weight[:, :, 0], pw1.bias)  # (B, C, 2D)
        x = torch.nn.functional.glu(x, dim=2).transpose(1, 2)  # (B, D, C)
        x = torch.cat([cache, x], dim=2)  # (B, D, K - 1 + C)
        C = x.size(2) - self.context
        new_cache = x[:, :, C:]
        taps = x.unfold(2, self.context + 1, 1)  # (B, D, C, K)
        x = (taps * dw.weight[:, 0].unsqueeze(1)).sum(3)  # (B, D, C)
        if dw.bias is not None:
            x = x + dw.bias.unsqueeze(1)
        x = self.activation(self.norm(x)).transpose(1, 2)  # (B, C, D)
        return torch.nn.functional.linear(x, pw2.weight[:, :, 0], pw2.bias), new_cache


def rel_attention_chunk(
    att: torch.nn.Module,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    pos_emb: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ESPnet's ``RelPositionMultiHeadedAttention`` for one chunk of queries.

    The C frames of the chunk attend to the L cached frames and to each other
    (all of them: the chunk mask allows a whole chunk). ESPnet's full forward takes
    the score of query i and key j from the embedding of the relative position
    ``i - j`` (``rel_shift``); here the queries are the last C of L + C positions,
    so the relative positions run from ``L + C - 1`` down to ``-(C - 1)``.

    Args:
        att: The block's attention module.
        query: (B, C, D) normalised chunk frames (queries, and new keys/values).
        key_cache, value_cache: (B, H, L, d_k).
        pos_emb: (1, L + 2 C - 1, D) positional embeddings of the relative
            positions ``L + C - 1, ..., -(C - 1)``.

    Returns:
        (B, C, D) attention output, and the (B, H, L + C, d_k) keys and values.
    """
    q, k, v = att.forward_qkv(query, query, query)  # (B, H, C, d_k)
    k = torch.cat([key_cache, k], dim=2)  # (B, H, L + C, d_k)
    v = torch.cat([value_cache, v], dim=2)
    C, K = q.size(2), k.size(2)
    q = q.transpose(1, 2)  # (B, C, H, d_k)
    p = att.linear_pos(pos_emb).view(pos_emb.size(0), -1, att.h, att.d_k)
    p = p.transpose(1, 2)  # (1, H, K + C - 1, d_k)
    q_u = (q + att.pos_bias_u).transpose(1, 2)  # (B, H, C, d_k)
    q_v = (q + att.pos_bias_v).transpose(1, 2)
    ac = torch.matmul(q_u, k.transpose(-2, -1))  # (B, H, C, K)
    bd = torch.matmul(q_v, p.transpose(-2, -1))  # (B, H, C, K + C - 1)
    # query i (position L + i), key j: relative position L + i - j, at column
    # (L + C - 1) - (L + i - j) = C - 1 - i + j
    i = torch.arange(C, device=q.device).unsqueeze(1)
    j = torch.arange(K, device=q.device).unsqueeze(0)
    column = (C - 1 - i + j).expand(*bd.shape[:2], C, K)
    bd = bd.gather(3, column)
    scores = (ac + bd) / math.sqrt(att.d_k)
    return att.forward_attention(v, scores, None), k, v


class ChunkConformerEncoderLayer(EncoderLayer):
    """ESPnet's conformer block with a :class:`CausalConvolutionModule` (module
    docstring)."""

    def forward(self, x_input, mask, cache=None, pad_mask=None):
        """ESPnet's ``EncoderLayer.forward`` (x_input ((B, T, D), pos_emb); mask
        (B, T, T) bool attention mask), with ``pad_mask`` ((B, 1, T) bool, True on
        valid frames) given to the convolution module. Returns ``(x, mask)``."""
        conv = self.conv_module
        if conv is None:
            return super().forward(x_input, mask, cache)
        with masking_frames(conv, pad_mask):
            return super().forward(x_input, mask, cache)

    def forward_chunk(
        self,
        x: torch.Tensor,
        pos_emb: torch.Tensor,
        cache: LayerCache,
        keep: int,
    ) -> Tuple[torch.Tensor, LayerCache]:
        """One chunk after the frames in ``cache`` (eval mode; the block's
        ``normalize_before`` is true and ``concat_after`` false: the encoder checks).

        Args:
            x: (B, C, D) the chunk's input.
            pos_emb: (1, L + 2 C - 1, D), see :func:`rel_attention_chunk`.
            cache: The frames before the chunk.
            keep: Frames of keys and values the next chunk may attend to (< 0: all).

        Returns:
            (B, C, D) output and the cache for the next chunk.
        """
        if self.feed_forward_macaron is not None:
            x = x + self.ff_scale * self.feed_forward_macaron(self.norm_ff_macaron(x))
        att, key, value = rel_attention_chunk(
            self.self_attn, self.norm_mha(x), cache.key, cache.value, pos_emb
        )
        x = x + att
        conv_cache = cache.conv
        if self.conv_module is not None:
            y, conv_cache = self.conv_module.forward_chunk(
                self.norm_conv(x), cache.conv
            )
            x = x + y
        x = x + self.ff_scale * self.feed_forward(self.norm_ff(x))
        if self.conv_module is not None:
            x = self.norm_final(x)
        if keep >= 0:
            start = max(key.size(2) - keep, 0)
            key, value = key[:, :, start:], value[:, :, start:]
        return x, LayerCache(key, value, conv_cache)
