"""``encoder: chunk_conformer``: a conformer trained once, decoded offline or streaming.

ESPnet's :class:`~espnet2.asr.encoder.conformer_encoder.ConformerEncoder` (same
parameters, same keys of ``encoder_conf``, same state dict) with

* **chunk-masked self-attention**: the frames are split into chunks of ``chunk``
  frames; a frame attends to its own chunk and ``num_left_chunks`` chunks before it
  (all of them by default), never to a later one
  (:mod:`~espnet_multiblank.espnet.encoders.chunk_masks`);
* **causal convolution**: the depthwise convolution of each block looks only to the
  left (:class:`~espnet_multiblank.espnet.encoders.chunk_layers.
  CausalConvolutionModule`), so no layer looks past the end of a chunk (the
  convolutional subsampling looks ``receptive_field - stride`` input frames ahead,
  its own look-ahead);
* **dynamic chunk training** (WeNet / U2, ESPnet's ``asr_transducer``): each
  training batch draws its chunk size, full context with probability
  ``full_context_prob``, else uniformly from ``chunk_size_range``;
* **decoding at a chunk size chosen then**: in eval mode the forward uses
  ``decoding_chunk_size`` (0: full context, the offline model;
  :meth:`ChunkConformerEncoder.set_decoding_chunk`), and
  :meth:`ChunkConformerEncoder.forward_chunk` computes one chunk after another with
  caches (the keys and values of the earlier frames, the convolution's left context):
  the output of the full forward at that chunk size, chunk by chunk (to float
  rounding; tested);
* **batch-exact**: padding never reaches a valid frame (the attention masks padded
  keys, the convolution is causal, batch norm's training statistics skip padded
  frames, the subsampled lengths come from each utterance's own length).

Supported: ``input_layer`` conv2d, conv2d1, conv2d2, conv2d6, conv2d8;
``pos_enc_layer_type: rel_pos`` with ``selfattention_layer_type: rel_selfattn`` and
``rel_pos_type: latest``; ``normalize_before: true``; ``positionwise_layer_type:
linear``; ``macaron_style`` either way. Everything else is refused by name.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch
from espnet2.asr.encoder.conformer_encoder import ConformerEncoder
from typeguard import typechecked

from espnet_multiblank.espnet.batch_exact.exact_encoding import (
    declare_padding_invariant,
)
from espnet_multiblank.espnet.batch_exact.exact_layers import conv_output_lengths
from espnet_multiblank.espnet.compat import (
    TooShortUttError,
    check_short_utt,
    make_pad_mask,
)
from espnet_multiblank.espnet.encoders.chunk_layers import (
    CausalConvolutionModule,
    ChunkConformerEncoderLayer,
    LayerCache,
)
from espnet_multiblank.espnet.encoders.chunk_masks import chunk_mask, draw_chunk
from espnet_multiblank.espnet.errors import ConfigError

#: the ``encoder`` choice name
NAME = "chunk_conformer"


def _refuse(key: str, value, expected: str) -> None:
    raise ConfigError(
        f"encoder_conf.{key} must be {expected} for encoder: {NAME}, got {value!r}"
    )


@dataclass
class EncoderStream:
    """The state of one chunk-by-chunk encoding (:meth:`ChunkConformerEncoder.
    init_stream`).

    Attributes:
        chunk: Frames per chunk (>= 1).
        keep: Frames of keys and values a chunk attends to before itself
            (``num_left_chunks * chunk``; -1: all).
        layers: One :class:`~espnet_multiblank.espnet.encoders.chunk_layers.
            LayerCache` per block.
        frames: Encoder frames computed so far.
    """

    chunk: int
    keep: int
    layers: List[LayerCache]
    frames: int = 0


class ChunkConformerEncoder(ConformerEncoder):
    """The conformer of the module docstring.

    Args:
        input_size, output_size, attention_heads, linear_units, num_blocks,
        dropout_rate, positional_dropout_rate, attention_dropout_rate, input_layer,
        normalize_before, positionwise_layer_type, macaron_style, rel_pos_type,
        pos_enc_layer_type, selfattention_layer_type, activation_type,
        use_cnn_module, cnn_module_kernel, stochastic_depth_rate, max_pos_emb_len:
            ESPnet's ``ConformerEncoder`` arguments (the supported values: module
            docstring).
        chunk_size_range: ``[min, max]`` encoder frames of the chunks drawn in
            training.
        full_context_prob: Probability that a training batch has full context.
        num_left_chunks: Chunks to the left a frame attends to (-1: all), in
            training and decoding.
        decoding_chunk_size: Encoder frames per chunk in eval mode (0: full
            context).
        dynamic_chunk_training: False trains at ``decoding_chunk_size`` throughout.
    """

    @typechecked
    def __init__(
        self,
        input_size: int,
        output_size: int = 256,
        attention_heads: int = 4,
        linear_units: int = 2048,
        num_blocks: int = 6,
        dropout_rate: float = 0.1,
        positional_dropout_rate: float = 0.1,
        attention_dropout_rate: float = 0.0,
        input_layer: str = "conv2d",
        normalize_before: bool = True,
        positionwise_layer_type: str = "linear",
        macaron_style: bool = False,
        rel_pos_type: str = "latest",
        pos_enc_layer_type: str = "rel_pos",
        selfattention_layer_type: str = "rel_selfattn",
        activation_type: str = "swish",
        use_cnn_module: bool = True,
        cnn_module_kernel: int = 15,
        stochastic_depth_rate: Union[float, List[float]] = 0.0,
        max_pos_emb_len: int = 5000,
        chunk_size_range: List[int] = [1, 25],
        full_context_prob: float = 0.5,
        num_left_chunks: int = -1,
        decoding_chunk_size: int = 0,
        dynamic_chunk_training: bool = True,
    ):
        if rel_pos_type != "latest":
            _refuse("rel_pos_type", rel_pos_type, "'latest'")
        if pos_enc_layer_type != "rel_pos":
            _refuse("pos_enc_layer_type", pos_enc_layer_type, "'rel_pos'")
        if selfattention_layer_type != "rel_selfattn":
            _refuse(
                "selfattention_layer_type", selfattention_layer_type, "'rel_selfattn'"
            )
        if not normalize_before:
            _refuse("normalize_before", normalize_before, "true")
        if positionwise_layer_type != "linear":
            _refuse("positionwise_layer_type", positionwise_layer_type, "'linear'")
        if input_layer not in ("conv2d", "conv2d1", "conv2d2", "conv2d6", "conv2d8"):
            _refuse(
                "input_layer",
                input_layer,
                "conv2d, conv2d1, conv2d2, conv2d6 or conv2d8",
            )
        if (
            len(chunk_size_range) != 2
            or chunk_size_range[0] < 1
            or chunk_size_range[1] < chunk_size_range[0]
        ):
            _refuse(
                "chunk_size_range", chunk_size_range, "[min, max] with 1 <= min <= max"
            )
        if not 0.0 <= full_context_prob <= 1.0:
            _refuse("full_context_prob", full_context_prob, "in [0, 1]")
        if num_left_chunks < -1:
            _refuse("num_left_chunks", num_left_chunks, ">= 0, or -1 (all)")
        if decoding_chunk_size < 0:
            _refuse(
                "decoding_chunk_size", decoding_chunk_size, ">= 0 (0: full context)"
            )
        super().__init__(
            input_size,
            output_size=output_size,
            attention_heads=attention_heads,
            linear_units=linear_units,
            num_blocks=num_blocks,
            dropout_rate=dropout_rate,
            positional_dropout_rate=positional_dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            input_layer=input_layer,
            normalize_before=normalize_before,
            positionwise_layer_type=positionwise_layer_type,
            macaron_style=macaron_style,
            rel_pos_type=rel_pos_type,
            pos_enc_layer_type=pos_enc_layer_type,
            selfattention_layer_type=selfattention_layer_type,
            activation_type=activation_type,
            use_cnn_module=use_cnn_module,
            cnn_module_kernel=cnn_module_kernel,
            stochastic_depth_rate=stochastic_depth_rate,
            max_pos_emb_len=max_pos_emb_len,
        )
        for layer in self.encoders:
            layer.__class__ = ChunkConformerEncoderLayer
            if layer.conv_module is not None:
                layer.conv_module.__class__ = CausalConvolutionModule
        self.chunk_size_range = (int(chunk_size_range[0]), int(chunk_size_range[1]))
        self.full_context_prob = float(full_context_prob)
        self.num_left_chunks = int(num_left_chunks)
        self.decoding_chunk_size = int(decoding_chunk_size)
        self.dynamic_chunk_training = bool(dynamic_chunk_training)
        self._convs = tuple(
            m for m in self.embed.conv if isinstance(m, torch.nn.Conv2d)
        )
        stride, field = 1, 1
        for conv in self._convs:
            field += (conv.kernel_size[0] - 1) * stride
            stride *= conv.stride[0]
        #: input frames per encoder frame, and input frames one encoder frame reads
        self.subsampling = stride
        self.receptive_field = field

    # ------------------------------------------------------------ chunk sizes

    def set_decoding_chunk(
        self, chunk_size: int, num_left_chunks: Optional[int] = None
    ) -> None:
        """Decode (eval mode) at ``chunk_size`` encoder frames per chunk (0: full
        context), attending to ``num_left_chunks`` chunks to the left (None: the
        trained value; -1: all)."""
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
            raise TypeError(f"chunk_size must be an int >= 0, got {chunk_size!r}")
        if chunk_size < 0:
            raise ValueError(
                f"chunk_size must be >= 0 (0: full context), got {chunk_size}"
            )
        if num_left_chunks is not None:
            if isinstance(num_left_chunks, bool) or not isinstance(
                num_left_chunks, int
            ):
                raise TypeError(
                    f"num_left_chunks must be an int >= -1, got {num_left_chunks!r}"
                )
            if num_left_chunks < -1:
                raise ValueError(
                    f"num_left_chunks must be >= 0, or -1 (all), got {num_left_chunks}"
                )
            self.num_left_chunks = num_left_chunks
        self.decoding_chunk_size = chunk_size

    def current_chunk(self) -> int:
        """The chunk size of this forward call (0: full context)."""
        if self.training and self.dynamic_chunk_training:
            return draw_chunk(self.full_context_prob, self.chunk_size_range)
        return self.decoding_chunk_size

    def output_lengths(self, ilens: torch.Tensor) -> torch.Tensor:
        """(B,) encoder frames of inputs of ``ilens`` frames (each utterance's own)."""
        return conv_output_lengths(self._convs, ilens)

    def input_frames(self, frames: int) -> int:
        """Input frames that ``frames`` >= 1 consecutive encoder frames read."""
        return self.subsampling * (frames - 1) + self.receptive_field

    # --------------------------------------------------------------- forward

    def forward(
        self,
        xs_pad: torch.Tensor,
        ilens: torch.Tensor,
        prev_states: torch.Tensor = None,
        masks: torch.Tensor = None,
        ctc=None,
        return_all_hs: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Chunk-masked forward of a padded batch (chunk: :meth:`current_chunk`).

        Args:
            xs_pad: (B, L, input_size) float features.
            ilens: (B,) int64 valid frames.
            prev_states, masks, ctc: ESPnet's arguments; ``masks`` must be None.
            return_all_hs: Also return every block's output.

        Returns:
            (B, T, D) output, (B,) int64 lengths, None (or, with ``return_all_hs``,
            ``(output, [block outputs])`` first, as ESPnet's conformer).
        """
        if masks is not None:
            raise ValueError(f"encoder: {NAME} takes no masks (it derives them)")
        short, limit = check_short_utt(self.embed, xs_pad.size(1))
        if short:
            raise TooShortUttError(
                f"has {xs_pad.size(1)} frames and is too short for subsampling "
                f"(it needs more than {limit} frames), return empty results",
                xs_pad.size(1),
                limit,
            )
        in_mask = ~make_pad_mask(ilens, maxlen=xs_pad.size(1))[:, None, :]
        x, _ = self.embed(xs_pad, in_mask.to(xs_pad.device))  # (x, pos_emb)
        T = x[0].size(1)
        olens = self.output_lengths(ilens.to(xs_pad.device))
        pad_mask = (torch.arange(T, device=xs_pad.device) < olens.unsqueeze(1))[
            :, None, :
        ]  # (B, 1, T)
        chunk = self.current_chunk()
        att_mask = pad_mask
        if chunk > 0:
            att_mask = pad_mask & chunk_mask(
                T, chunk, self.num_left_chunks, xs_pad.device
            ).unsqueeze(0)
        hidden = []
        for layer in self.encoders:
            x, _ = layer(x, att_mask, pad_mask=pad_mask)
            if return_all_hs:
                hidden.append(x[0])
        out = self.after_norm(x[0])
        if return_all_hs:
            return (out, hidden), olens, None
        return out, olens, None

    # ----------------------------------------------------- chunk by chunk

    def init_stream(
        self,
        batch: int = 1,
        chunk: Optional[int] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> EncoderStream:
        """A fresh chunk-by-chunk encoding of ``batch`` utterances.

        Args:
            chunk: Encoder frames per chunk (default ``decoding_chunk_size``, which
                must then be >= 1).
            device, dtype: Of the caches (default: the parameters').
        """
        chunk = self.decoding_chunk_size if chunk is None else chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(
                f"chunk must be an int >= 1 (encoder frames per chunk), got {chunk!r}"
            )
        weight = self.after_norm.weight
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        layers = []
        for layer in self.encoders:
            att = layer.self_attn
            empty = torch.zeros(batch, att.h, 0, att.d_k, device=device, dtype=dtype)
            conv = None
            if layer.conv_module is not None:
                conv = torch.zeros(
                    batch,
                    self.output_size(),
                    layer.conv_module.context,
                    device=device,
                    dtype=dtype,
                )
            layers.append(LayerCache(empty, empty, conv))
        keep = -1 if self.num_left_chunks < 0 else self.num_left_chunks * chunk
        return EncoderStream(chunk, keep, layers)

    def _embed_parts(self) -> Tuple[torch.nn.Module, torch.nn.Module]:
        """The subsampling's output projection and positional encoding (ESPnet's
        ``Conv2dSubsampling8`` keeps them apart, the others in ``out``)."""
        out = self.embed.out
        if isinstance(out, torch.nn.Sequential):
            return out[0], out[-1]
        return out, self.embed.pos_enc

    def _pos_emb(self, cached: int, frames: int, like: torch.Tensor) -> torch.Tensor:
        """(1, cached + 2 frames - 1, D): embeddings of the relative positions
        ``cached + frames - 1, ..., -(frames - 1)`` (ESPnet's table: row
        ``center - r`` for position r)."""
        pos_enc = self._embed_parts()[1]
        pos_enc.extend_pe(like.new_empty(1, cached + frames))
        center = pos_enc.pe.size(1) // 2
        return pos_enc.pe[:, center - (cached + frames - 1) : center + frames]

    @torch.no_grad()
    def forward_chunk(self, feats: torch.Tensor, stream: EncoderStream) -> torch.Tensor:
        """Encode the next chunk of a stream (eval mode).

        Args:
            feats: (B, F, input_size) the input frames the chunk's encoder frames
                read: ``input_frames(C)`` frames for C encoder frames (C =
                ``stream.chunk``, or fewer for the last chunk of an utterance),
                starting at input frame ``subsampling * stream.frames``.
            stream: The stream's state (updated in place).

        Returns:
            (B, C, D) encoder output of the chunk.
        """
        if self.training:
            raise RuntimeError(f"encoder: {NAME}: forward_chunk needs eval mode")
        frames = (feats.size(1) - self.receptive_field) // self.subsampling + 1
        if frames < 1 or frames > stream.chunk:
            raise ValueError(
                f"feats must hold the input of 1 .. {stream.chunk} encoder frames "
                f"(>= {self.receptive_field} input frames), got {feats.size(1)}"
            )
        linear, pos_enc = self._embed_parts()
        x = self.embed.conv(feats.unsqueeze(1))  # (B, channels, C, F')
        b, c, t, f = x.size()
        x = linear(x.transpose(1, 2).reshape(b, t, c * f)) * pos_enc.xscale
        cached = stream.layers[0].key.size(2)
        pos_emb = self._pos_emb(cached, t, x)
        new_layers = []
        for layer, cache in zip(self.encoders, stream.layers):
            x, cache = layer.forward_chunk(x, pos_emb, cache, stream.keep)
            new_layers.append(cache)
        stream.layers = new_layers
        stream.frames += t
        return self.after_norm(x)


declare_padding_invariant(ChunkConformerEncoder, check_children=True)
declare_padding_invariant(ChunkConformerEncoderLayer, check_children=True)
declare_padding_invariant(CausalConvolutionModule, check_children=False)
