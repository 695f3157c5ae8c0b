"""One stream's waveform pieces in, encoder chunks out (``encoder: chunk_conformer``).

:class:`FeatureStream` computes the model's features (frontend, normalisation,
pre-encoder) for a waveform that arrives in pieces of any length. A feature frame
reads the samples its front end's :class:`~espnet_multiblank.framing.Framing` says
(ESPnet's ``Stft`` with ``center: true``: ``n_fft`` samples, reflected ``n_fft / 2``
samples at both ends of the utterance; ``kaldi_fbank``: Kaldi's framing); it is
computed from exactly the samples the whole waveform would give it, once they have
arrived (the end reflection: once the stream has ended). This is what ESPnet's
``Speech2TextStreaming`` does with a buffer of samples and frames trimmed at chunk
edges; here the frames are computed by index.

:class:`StreamEncoder` runs the chunk conformer
(:meth:`~espnet_multiblank.espnet.encoders.chunk_conformer.ChunkConformerEncoder.
forward_chunk`) one chunk of ``C`` encoder frames at a time, as soon as the feature
frames the chunk reads have arrived (the subsampling reads ``receptive_field -
subsampling`` frames past the chunk: its look-ahead), and at the end of the stream
the last, shorter chunk. Every computation (the samples a group of feature frames
is computed from, the features of a chunk, the chunk) depends only on the waveform
and the chunk size, never on how the waveform was cut into pieces: a stream's encoder
output, hence its hypotheses, do not depend on the piece lengths (tested).

Notation: L = samples received, F = feature frames, S = subsampling factor, RF =
the subsampling's receptive field in feature frames, C = chunk size in encoder
frames, D = feature / model size.
"""

from typing import Any, List, Optional

import numpy as np
import torch
from espnet2.asr.frontend.default import DefaultFrontend
from espnet2.asr.preencoder.linear import LinearProjection
from espnet2.layers.global_mvn import GlobalMVN

from espnet_multiblank.espnet.encoders.chunk_conformer import ChunkConformerEncoder
from espnet_multiblank.espnet.frontends.grad_scaled import (
    GradScaledFrontend,
    GradScaledPreEncoder,
)
from espnet_multiblank.espnet.frontends.kaldi_fbank import KaldiFbankFrontend
from espnet_multiblank.framing import Framing


def _unwrap(module: Any, wrapper: type, attribute: str) -> Any:
    while isinstance(module, wrapper):
        module = getattr(module, attribute)
    return module


def streaming_support(model: Any) -> Optional[str]:
    """Why ``model`` cannot be decoded streaming (None when it can): the encoder
    must be a chunk conformer, the frontend ESPnet's default (STFT, log-mel) without
    enhancement, the normalisation global (or none), the pre-encoder linear (or
    none), no post-encoder."""
    if not isinstance(getattr(model, "encoder", None), ChunkConformerEncoder):
        name = type(getattr(model, "encoder", None)).__name__
        return (
            f"streaming needs encoder: chunk_conformer (this model's encoder is "
            f"{name}, which looks at the whole utterance)"
        )
    frontend = _unwrap(model.frontend, GradScaledFrontend, "frontend")
    if type(frontend) is KaldiFbankFrontend:
        frontend = None  # no enhancement, nothing else to check
    elif type(frontend) is not DefaultFrontend or frontend.stft is None:
        return (
            "streaming needs ESPnet's default frontend (STFT + log-mel) or "
            "kaldi_fbank"
        )
    enhancement = getattr(frontend, "frontend", None)
    if enhancement is not None and (
        getattr(enhancement, "use_wpe", True)
        or getattr(enhancement, "use_beamformer", True)
    ):
        return "streaming: a frontend with WPE / beamforming is not supported"
    if model.normalize is not None and type(model.normalize) is not GlobalMVN:
        return (
            f"streaming needs normalize: global_mvn or none (not "
            f"{type(model.normalize).__name__}: an utterance's statistics are not "
            "known before it ends)"
        )
    preencoder = _unwrap(model.preencoder, GradScaledPreEncoder, "preencoder")
    if preencoder is not None and type(preencoder) is not LinearProjection:
        return f"streaming: pre-encoder {type(preencoder).__name__} is not supported"
    if getattr(model, "postencoder", None) is not None:
        return "streaming: a post-encoder is not supported"
    return None


def frontend_framing(model: Any) -> Framing:
    """Which samples each feature frame of the model's front end reads (ESPnet's
    default STFT front end, or ``kaldi_fbank``)."""
    frontend = _unwrap(model.frontend, GradScaledFrontend, "frontend")
    if type(frontend) is KaldiFbankFrontend:
        return frontend.framing()
    stft = frontend.stft
    return Framing("stft", int(stft.n_fft), int(stft.hop_length), bool(stft.center))


class FeatureStream:
    """The features of one waveform that arrives in pieces (module docstring).

    Args:
        model: The ASR model (checked with :func:`streaming_support`).
        dtype: The dtype the frontend takes its input in.
        device: Where the features are computed.
    """

    def __init__(self, model: Any, dtype: torch.dtype, device: torch.device):
        self.model = model
        self.frontend = model.frontend
        self.inner = _unwrap(model.frontend, GradScaledFrontend, "frontend")
        self.framing = frontend_framing(model)
        self.dtype = dtype
        self.device = device
        # the samples from sample ``_base`` on (those no frame to come reads are
        # dropped: a stream of any length keeps a few frames' worth)
        self._samples = torch.zeros(0, dtype=torch.float32)
        self._base = 0
        self.received = 0
        self.final = False

    def add(self, piece: torch.Tensor, final: bool = False) -> None:
        """Append (n,) float samples; ``final``: the waveform ends after them."""
        n = piece.numel()
        stored = self.received - self._base
        if stored + n > self._samples.numel():
            grown = torch.zeros(max(2 * self._samples.numel(), stored + n, 4096))
            grown[:stored] = self._samples[:stored]
            self._samples = grown
        self._samples[stored : stored + n] = piece.reshape(-1).float()
        self.received += n
        self.final = self.final or final

    def _forget_before(self, sample: int) -> None:
        """Drop the samples before ``sample`` (when that frees half the buffer)."""
        drop = min(sample, self.received) - self._base
        if drop > self._samples.numel() // 2:
            stored = self.received - self._base - drop
            self._samples[:stored] = self._samples[drop : drop + stored].clone()
            self._base += drop

    def total_frames(self) -> int:
        """F of the whole waveform (once it has ended): the front end's frame count."""
        return self.framing.total_frames(self.received)

    def available(self) -> int:
        """Feature frames whose samples have all arrived (all once ended)."""
        if self.final:
            return self.total_frames()
        return self.framing.complete_frames(self.received)

    def _segment(self, first: int, stop: int) -> torch.Tensor:
        """The samples frames ``first .. stop - 1`` read, reflected at the ends of
        the waveform as the front end reflects them."""
        lo, hi = self.framing.segment(first, stop)
        pos = self.framing.reflect(np.arange(lo, hi), self.received)
        return self._samples[torch.from_numpy(pos - self._base)]

    @torch.no_grad()
    def compute(self, first: int, stop: int) -> torch.Tensor:
        """(1, stop - first, D) features of frames ``first .. stop - 1`` (which
        must be :meth:`available`), normalised and pre-encoded as by
        ``model.encode``."""
        segment = self._segment(first, stop).to(self.device, self.dtype)[None]
        lengths = torch.tensor([segment.size(1)], device=self.device)
        if type(self.inner) is KaldiFbankFrontend:
            feats = self.inner.forward_segment(segment)
            lens = torch.tensor([feats.size(1)], device=self.device)
        else:
            stft = self.inner.stft
            center, stft.center = stft.center, False
            try:
                feats, lens = self.frontend(segment, lengths)
            finally:
                stft.center = center
        if self.model.normalize is not None:
            feats, lens = self.model.normalize(feats, lens)
        if self.model.preencoder is not None:
            feats, lens = self.model.preencoder(feats, lens)
        # the next frame reads from its first sample on; the end reflection of the
        # last frame reaches up to a frame's length further back
        self._forget_before(
            self.framing.segment(stop, stop + 1)[0] - self.framing.length
        )
        return feats


class StreamEncoder:
    """One stream's encoder output, chunk by chunk (module docstring).

    Args:
        model: The ASR model (eval mode; :func:`streaming_support`).
        chunk: C, encoder frames per chunk.
        dtype: The frontend's input dtype.
        device: Where the model runs.

    Attributes:
        frames: Encoder frames computed so far.
    """

    def __init__(
        self, model: Any, chunk: int, dtype: torch.dtype, device: torch.device
    ):
        self.encoder: ChunkConformerEncoder = model.encoder
        self.features = FeatureStream(model, dtype, device)
        self.state = self.encoder.init_stream(1, chunk, device=device)
        self.chunk = chunk
        self._tail: Optional[torch.Tensor] = None  # features the next chunk re-reads
        self._done = 0  # feature frames computed

    @property
    def frames(self) -> int:
        return self.state.frames

    def total_frames(self) -> int:
        """Encoder frames of the whole stream (once it has ended)."""
        F = torch.tensor([self.features.total_frames()])
        return int(self.encoder.output_lengths(F)[0])

    def feed(self, piece: torch.Tensor, final: bool = False) -> List[torch.Tensor]:
        """Add (n,) samples; return the (1, c, D) encoder output of every chunk
        they complete (and, with ``final``, of the rest of the stream)."""
        self.features.add(piece, final)
        out = []
        enc = self.encoder
        while True:
            c = self.chunk
            if final:
                c = min(c, self.total_frames() - self.frames)
                if c <= 0:
                    break
            # the chunk reads feature frames S * frames .. need - 1
            need = enc.subsampling * (self.frames + c - 1) + enc.receptive_field
            if need > self.features.available():
                break
            new = self.features.compute(self._done, need)
            feats = new if self._tail is None else torch.cat([self._tail, new], 1)
            self._done = need
            self._tail = feats[:, enc.subsampling * c :]
            out.append(enc.forward_chunk(feats, self.state))
        return out
