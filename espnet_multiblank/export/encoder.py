"""The encoders as graphs whose shapes come from their inputs, never from values.

Tracing an ESPnet encoder as it is gives a silently wrong graph: ``make_pad_mask``
turns the lengths into a Python list, which the trace freezes into constants, and
the positional encodings slice a table whose size the trace fixes. The modules here
call the model's own layers (subsampling convolutions, attention, feed-forward and
convolution modules, layer norms) and compute everything that depends on the
lengths or the number of frames with tensor operations:

* :class:`OfflineEncoder`: front end (:class:`~espnet_multiblank.export.frontend.
  ExportFrontend`) + encoder of a padded batch, each utterance encoded as if alone
  (the plug-in's batch-exact encoding), with, for ``chunk_conformer``, the chunk
  size as an input (0: full context);
* :class:`ChunkEncoderStep`: one chunk of a ``chunk_conformer`` for B streams with
  explicit caches (keys and values of the earlier frames, the causal convolution's
  left context); streams with fewer cached frames are padded at the front and
  masked, which keeps every relative position (the distance from a query to a key)
  unchanged.

Positional encodings are computed from the positions (:func:`sinusoids`), so no
length limit is baked in. Notation: B batch, F feature frames, T encoder frames,
D encoder width, J joint space, H heads, d_k = D / H, N blocks, K kernel size.
"""

import math
from typing import Any, Tuple

import torch

from espnet_multiblank.espnet.batch_exact.exact_layers import conv_output_lengths
from espnet_multiblank.export.frontend import ExportFrontend
from espnet_multiblank.export.support import ExportError


def sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """ESPnet's sinusoidal positional encoding of arbitrary (relative) positions.

    Row r is ``[sin(p div_0), cos(p div_0), sin(p div_1), ...]`` with ``div_i =
    exp(-2 i ln(10000) / d_model)``: ESPnet's ``PositionalEncoding`` table at
    position p >= 0, and ``RelPositionalEncoding`` (``latest``) at relative
    position p (either sign).

    Args:
        positions: (P,) float32.
        d_model: D (even).

    Returns:
        (P, D) float32.
    """
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32)
        * -(math.log(10000.0) / d_model)
    )
    angle = positions.unsqueeze(1) * div.unsqueeze(0)  # (P, D / 2)
    return torch.stack([torch.sin(angle), torch.cos(angle)], 2).reshape(
        positions.numel(), d_model
    )


def embed_parts(embed: Any) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """The subsampling's output projection and positional encoding (ESPnet's
    ``Conv2dSubsampling*`` keep them in ``out`` or, in 202611 and for
    ``Conv2dSubsampling8``, apart)."""
    out = embed.out
    if isinstance(out, torch.nn.Sequential):
        return out[0], out[-1]
    return out, embed.pos_enc


def subsample(embed: Any, feats: torch.Tensor) -> torch.Tensor:
    """(B, F, M) features -> (B, T, D) the subsampling's output before the
    positional encoding (ESPnet's ``Conv2dSubsampling*.forward``)."""
    linear, _ = embed_parts(embed)
    x = embed.conv(feats.unsqueeze(1))  # (B, C, T, M')
    b, c, t, f = x.size()
    return linear(x.transpose(1, 2).reshape(b, t, c * f))


def subsampling_convs(embed: Any) -> Tuple[torch.nn.Module, ...]:
    return tuple(m for m in embed.conv if isinstance(m, torch.nn.Conv2d))


def relative_positions(first: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """(first - last + 1,) float32: first, first - 1, ..., last."""
    return torch.arange(first, last - 1, -1).to(torch.float32)


class OfflineEncoder(torch.nn.Module):
    """``encoder.onnx``: waveform -> encoder output and its joint projection.

    Args:
        model: The ASR model (eval mode; checked by
            :func:`~espnet_multiblank.export.support.check_model`).
        kind: ``"conformer"``, ``"transformer"`` or ``"chunk_conformer"``.

    Inputs: speech (B, L) float32, speech_lengths (B,) int64 and, for
    ``chunk_conformer``, chunk_size () int64 (encoder frames per chunk, 0: full
    context). Outputs: encoder_out (B, T, D) float32, encoder_proj (B, T, J)
    float32 (``lin_enc`` of the joint network), encoder_lengths (B,) int64.
    """

    def __init__(self, model: Any, kind: str):
        super().__init__()
        self.frontend = ExportFrontend(model)
        self.encoder = model.encoder
        self.lin_enc = model.joint_network.lin_enc
        self.kind = kind
        self.convs = subsampling_convs(self.encoder.embed)
        _, pos_enc = embed_parts(self.encoder.embed)
        self.pos_enc = pos_enc
        self.rel_pos = type(pos_enc).__name__ == "RelPositionalEncoding"
        self.scaled = type(pos_enc).__name__ == "ScaledPositionalEncoding"
        self.d_model = int(pos_enc.d_model)
        self.left_chunks = int(getattr(self.encoder, "num_left_chunks", -1))

    def forward(self, speech, speech_lengths, chunk_size=None):
        feats, flens = self.frontend(speech, speech_lengths)
        out, olens = self.encode_features(feats, flens, chunk_size)
        return out, self.lin_enc(out), olens

    def encode_features(self, feats, flens, chunk_size=None):
        """(B, F, M) normalised features, (B,) frames -> (B, T, D) encoder output,
        (B,) int64 lengths (``chunk_size``: chunk_conformer only)."""
        enc = self.encoder
        x = subsample(enc.embed, feats)  # (B, T, D)
        T = x.size(1)
        olens = conv_output_lengths(self.convs, flens)
        frames = torch.arange(T, device=x.device)
        pad_mask = (frames.unsqueeze(0) < olens.unsqueeze(1)).unsqueeze(1)  # (B,1,T)
        if self.rel_pos:
            x = x * self.pos_enc.xscale
            pos = relative_positions(T - 1, -(T - 1))
            x_in = (x, sinusoids(pos, self.d_model).unsqueeze(0))
        else:
            pe = sinusoids(frames.to(torch.float32), self.d_model).unsqueeze(0)
            if self.scaled:
                x_in = x + self.pos_enc.alpha * pe
            else:
                x_in = x * self.pos_enc.xscale + pe
        if self.kind == "chunk_conformer":
            att_mask = pad_mask & self._chunk_mask(frames, chunk_size).unsqueeze(0)
            for layer in enc.encoders:
                x_in, _ = layer(x_in, att_mask, pad_mask=pad_mask)
        else:
            for layer in enc.encoders:
                x_in, _ = layer(x_in, pad_mask)
        out = x_in[0] if isinstance(x_in, tuple) else x_in
        if enc.normalize_before:
            out = enc.after_norm(out)
        return out, olens

    def _chunk_mask(self, frames: torch.Tensor, chunk_size: torch.Tensor):
        """(T, T) bool: the chunk attention mask (every key when chunk_size <= 0)."""
        chunk = torch.clamp(chunk_size, min=1)
        idx = torch.div(frames, chunk, rounding_mode="floor")
        query, key = idx.unsqueeze(1), idx.unsqueeze(0)
        mask = key <= query
        if self.left_chunks >= 0:
            mask = mask & (key >= query - self.left_chunks)
        return mask | (chunk_size <= 0)


class ChunkEncoderStep(torch.nn.Module):
    """``encoder_chunk.onnx``: one chunk of a ``chunk_conformer`` for B streams.

    Inputs:
        feats: (B, F, M) float32 features of the chunk's encoder frames (``F =
            subsampling (C - 1) + receptive_field`` for C frames), from the feature
            frame ``subsampling x`` the stream's encoder frames so far.
        key_cache, value_cache: (N, B, H, L, d_k) float32 keys and values of the L
            frames before the chunk (front-padded where a stream has fewer).
        conv_cache: (N, B, D, K - 1) float32 depthwise-convolution input of the K - 1
            frames before the chunk (zeros before a stream's first frame).
        cache_mask: (B, L) bool, True on a stream's cached frames.
        chunk_frames: (B,) int64, valid frames of each stream's chunk (C, or fewer
            for the last chunk of a stream).

    Outputs: encoder_out (B, C, D), encoder_proj (B, C, J), new_keys, new_values
    (N, B, H, C, d_k) (the chunk's own; the caller appends them to its cache),
    new_conv_cache (N, B, D, K - 1) (valid when the chunk is full).
    """

    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.encoder
        self.lin_enc = model.joint_network.lin_enc
        _, pos_enc = embed_parts(self.encoder.embed)
        self.xscale = float(pos_enc.xscale)
        self.d_model = int(pos_enc.d_model)

    def forward(
        self, feats, key_cache, value_cache, conv_cache, cache_mask, chunk_frames
    ):
        enc = self.encoder
        x = subsample(enc.embed, feats) * self.xscale  # (B, C, D)
        C = x.size(1)
        L = key_cache.size(3)
        chunk_valid = torch.arange(C, device=x.device).unsqueeze(
            0
        ) < chunk_frames.unsqueeze(1)
        key_mask = torch.cat([cache_mask, chunk_valid], 1).unsqueeze(1)  # (B,1,L+C)
        # relative positions L + C - 1 ... -(C - 1) of the chunk's queries
        pos = relative_positions(L + C - 1, -(C - 1))
        pos_emb = sinusoids(pos, self.d_model).unsqueeze(0)
        keys, values, convs = [], [], []
        for n, layer in enumerate(enc.encoders):
            x, k, v, c = _layer_chunk(
                layer, x, pos_emb, key_cache[n], value_cache[n], conv_cache[n], key_mask
            )
            keys.append(k)
            values.append(v)
            convs.append(c)
        out = enc.after_norm(x)
        return (
            out,
            self.lin_enc(out),
            torch.stack(keys),
            torch.stack(values),
            torch.stack(convs),
        )


def _layer_chunk(layer, x, pos_emb, key_cache, value_cache, conv_cache, key_mask):
    """A chunk conformer block on one chunk (the arithmetic of the plug-in's
    ``ChunkConformerEncoderLayer.forward_chunk``, with a key mask).

    Returns (B, C, D) output, the chunk's (B, H, C, d_k) keys and values and the
    (B, D, K - 1) convolution cache after it."""
    if layer.feed_forward_macaron is not None:
        x = x + layer.ff_scale * layer.feed_forward_macaron(layer.norm_ff_macaron(x))
    att = layer.self_attn
    q, k, v = att.forward_qkv(*(layer.norm_mha(x),) * 3)  # (B, H, C, d_k)
    keys = torch.cat([key_cache, k], 2)  # (B, H, L + C, d_k)
    values = torch.cat([value_cache, v], 2)
    C, K = q.size(2), keys.size(2)
    q = q.transpose(1, 2)  # (B, C, H, d_k)
    p = att.linear_pos(pos_emb).view(1, -1, att.h, att.d_k).transpose(1, 2)
    q_u = (q + att.pos_bias_u).transpose(1, 2)
    q_v = (q + att.pos_bias_v).transpose(1, 2)
    ac = torch.matmul(q_u, keys.transpose(-2, -1))  # (B, H, C, L + C)
    bd = torch.matmul(q_v, p.transpose(-2, -1))  # (B, H, C, L + 2C - 1)
    # query i (position L + i), key j: relative position L + i - j at column
    # C - 1 - i + j
    i = torch.arange(C, device=q.device).unsqueeze(1)
    j = torch.arange(K, device=q.device).unsqueeze(0)
    column = (C - 1 - i + j).unsqueeze(0).unsqueeze(0).expand(bd.size(0), att.h, C, K)
    bd = bd.gather(3, column)
    scores = (ac + bd) / math.sqrt(att.d_k)
    x = x + att.forward_attention(values, scores, key_mask)
    new_conv = conv_cache
    conv = layer.conv_module
    if conv is not None:
        # the causal convolution module on [cache, chunk] (its forward without the
        # left zero padding, which the cache replaces)
        y = torch.cat([conv_cache, conv._glu(layer.norm_conv(x))], 2)  # (B,D,K-1+C)
        new_conv = y[:, :, y.size(2) - conv_cache.size(2) :]
        x = x + conv._out(conv._depthwise(y), None)
    x = x + layer.ff_scale * layer.feed_forward(layer.norm_ff(x))
    if conv is not None:
        x = layer.norm_final(x)
    return x, k, v, new_conv


def check_encoder(model: Any) -> str:
    """The encoder kind the exporter handles (``conformer``, ``transformer``,
    ``chunk_conformer``) or :class:`ExportError` saying why not."""
    enc = model.encoder
    name = type(enc).__name__
    kinds = {
        "ChunkConformerEncoder": "chunk_conformer",
        "ConformerEncoder": "conformer",
        "TransformerEncoder": "transformer",
    }
    kind = kinds.get(name)
    if kind is None:
        raise ExportError(
            f"encoder {name} cannot be exported (supported: conformer, transformer, "
            "chunk_conformer)"
        )
    embed = type(enc.embed).__name__
    if not embed.startswith("Conv2dSubsampling"):
        raise ExportError(
            f"encoder input_layer {embed} cannot be exported (supported: conv2d, "
            "conv2d1, conv2d2, conv2d6, conv2d8)"
        )
    _, pos_enc = embed_parts(enc.embed)
    pos = type(pos_enc).__name__
    if pos not in (
        "RelPositionalEncoding",
        "PositionalEncoding",
        "ScaledPositionalEncoding",
    ):
        raise ExportError(
            f"positional encoding {pos} cannot be exported (supported: rel_pos with "
            "rel_pos_type latest, abs_pos, scaled_abs_pos)"
        )
    if getattr(pos_enc, "reverse", False):
        raise ExportError("a reversed positional encoding cannot be exported")
    if getattr(enc, "interctc_use_conditioning", False):
        raise ExportError("interctc_use_conditioning cannot be exported")
    if not getattr(enc, "normalize_before", True) and kind == "chunk_conformer":
        raise ExportError("chunk_conformer needs normalize_before: true")
    for n, layer in enumerate(enc.encoders):
        if getattr(layer, "concat_after", False):
            raise ExportError(f"encoder block {n}: concat_after cannot be exported")
        att = type(getattr(layer, "self_attn", None)).__name__
        expected = (
            "RelPositionMultiHeadedAttention"
            if pos == "RelPositionalEncoding"
            else "MultiHeadedAttention"
        )
        if att != expected:
            raise ExportError(
                f"encoder block {n}: attention {att} cannot be exported with "
                f"{pos} (expected {expected})"
            )
        ff = type(getattr(layer, "feed_forward", None)).__name__
        if ff != "PositionwiseFeedForward":
            raise ExportError(
                f"encoder block {n}: feed-forward {ff} cannot be exported (supported: "
                "positionwise_layer_type linear)"
            )
    return kind
