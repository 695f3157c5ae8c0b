"""The model's front end as operations every ONNX runtime has.

The plug-in's ``kaldi_fbank`` front end is already made of such operations and
is used as it is. ESPnet's ``default`` front end computes the STFT with
``torch.stft`` (complex output, which ONNX export does not support), the power
spectrum, a log-mel filter bank, then the model's ``normalize`` (``global_mvn`` /
``utterance_mvn``) and ``preencoder`` (``linear``). :class:`ExportFrontend` computes
the same with real operations only:

* the centred STFT's reflection at both ends of *each* utterance of a padded batch
  (what ``torch.stft(center=True)`` does to an utterance alone, as the plug-in's
  batch-exact encoding does): a gather with indices from the lengths;
* the STFT as a strided 1-D convolution with the window times the cosine and sine
  of the DFT (``n_fft // 2 + 1`` bins), then ``re**2 + im**2``;
* the log-mel (ESPnet's mel matrix, ``clamp(min=1e-10)``, log) and the
  normalisation, with padded frames set to 0 as ESPnet does.

Tensors: B utterances, L samples, F frames, M = feature dimension.
"""

import math
from typing import Any, Tuple

import torch

from espnet_multiblank.espnet.batch_exact.exact_layers import reflect_pad_each
from espnet_multiblank.export.support import ExportError, unwrap_frontend
from espnet_multiblank.framing import Framing


def _stft_basis(n_fft: int, window: torch.Tensor) -> torch.Tensor:
    """(2 (n_fft // 2 + 1), 1, n_fft) float32 convolution kernels: the window
    (centred in n_fft, as torch.stft pads it) times cos and -sin of every
    one-sided DFT bin, computed in float64."""
    pad = (n_fft - window.numel()) // 2
    full = torch.zeros(n_fft, dtype=torch.float64)
    full[pad : pad + window.numel()] = window.double()
    bins = n_fft // 2 + 1
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(bins, dtype=torch.float64).unsqueeze(1)
    angle = 2.0 * math.pi * k * n / n_fft  # (bins, n_fft)
    real = torch.cos(angle) * full
    imag = -torch.sin(angle) * full
    return torch.cat([real, imag], 0).unsqueeze(1).float()


class ExportFrontend(torch.nn.Module):
    """Waveform -> the encoder's input features, in ONNX-exportable operations.

    Args:
        model: An ESPnet ASR model with ``frontend: default`` (STFT + log-mel, no
            WPE/beamformer) or ``kaldi_fbank``, ``normalize`` ``global_mvn`` /
            ``utterance_mvn`` / none and ``preencoder`` ``linear`` / none (anything
            else: :class:`ExportError`).
        segment: Compute the frames of a segment that already holds the samples
            they read, the first frame starting at its first sample (the streaming
            front end: no reflection at its ends).

    Attributes:
        framing: The front end's :class:`~espnet_multiblank.framing.Framing`.
    """

    def __init__(self, model: Any, segment: bool = False):
        super().__init__()
        frontend = unwrap_frontend(model)
        self.segment = bool(segment)
        self.kaldi = type(frontend).__name__ == "KaldiFbankFrontend"
        if self.kaldi:
            self.fbank = frontend
            self.framing = frontend.framing()
        else:
            self._init_stft(frontend)
        self.normalize = model.normalize
        self.preencoder = _unwrap_preencoder(model.preencoder)
        self.utterance_mvn = type(self.normalize).__name__ in (
            "UtteranceMVN",
            "ExactUtteranceMVN",
        )
        if self.normalize is not None and not self.utterance_mvn:
            self.register_buffer("mean", self.normalize.mean.detach().float().clone())
            self.register_buffer("std", self.normalize.std.detach().float().clone())

    def _init_stft(self, frontend: Any) -> None:
        stft = frontend.stft
        if stft.window is None:
            window = torch.ones(stft.win_length or stft.n_fft)
        else:
            window_fn = getattr(torch, f"{stft.window}_window")
            window = window_fn(stft.win_length or stft.n_fft, dtype=torch.float64)
        self.n_fft = int(stft.n_fft)
        self.hop = int(stft.hop_length)
        self.framing = Framing("stft", self.n_fft, self.hop, bool(stft.center))
        self.center = self.framing.center and not self.segment
        scale = 1.0 / math.sqrt(self.n_fft) if stft.normalized else 1.0
        self.register_buffer("basis", _stft_basis(self.n_fft, window) * scale)
        self.bins = self.n_fft // 2 + 1
        logmel = frontend.logmel
        self.register_buffer("melmat", logmel.melmat.detach().float().clone())
        self.log_base = logmel.log_base

    def frames(self, lengths: torch.Tensor) -> torch.Tensor:
        """(B,) int64 feature frames of utterances (segments) of ``lengths``
        samples."""
        f = self.framing
        if self.segment:
            return torch.div(lengths - f.length, f.shift, rounding_mode="floor") + 1
        if self.kaldi:
            return self.fbank.frames(lengths)
        padded = lengths + 2 * f.offset
        return torch.div(padded - f.length, f.shift, rounding_mode="floor") + 1

    def forward(
        self, speech: torch.Tensor, lengths: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Args: speech (B, L) float32 samples (padding after each utterance is
        ignored), lengths (B,) int64 valid samples.

        Returns: (B, F, M) float32 features (0 on padded frames), (B,) int64 frames.
        """
        if self.kaldi:
            if self.segment:
                feats = self.fbank.forward_segment(speech)
                flens = self.frames(lengths)
            else:
                feats, flens = self.fbank(speech, lengths)
        else:
            feats, flens = self._stft_features(speech, lengths)
        return self.normalized(feats, flens), flens

    def normalized(self, feats: torch.Tensor, flens: torch.Tensor) -> torch.Tensor:
        """(B, F, M) front-end features -> what the encoder reads: padded frames set
        to 0, the model's normalisation and pre-encoder applied."""
        F = feats.size(1)
        frames = torch.arange(F, device=feats.device).unsqueeze(0)
        valid = (frames < flens.unsqueeze(1)).unsqueeze(2)  # (B, F, 1)
        feats = feats * valid.to(feats.dtype)
        feats = self._normalize(feats, flens, valid)
        if self.preencoder is not None:
            feats = self.preencoder.linear_out(feats)
        return feats

    def _stft_features(self, speech, lengths):
        if self.center:
            speech = reflect_pad_each(speech, lengths, self.n_fft // 2)
        flens = self.frames(lengths)
        spec = torch.nn.functional.conv1d(
            speech.unsqueeze(1), self.basis, stride=self.hop
        )  # (B, 2 bins, F)
        real, imag = spec[:, : self.bins], spec[:, self.bins :]
        power = (real * real + imag * imag).transpose(1, 2)  # (B, F, bins)
        mel = torch.matmul(power, self.melmat).clamp(min=1e-10)
        feats = mel.log()
        if self.log_base is not None:
            feats = feats / math.log(self.log_base)
        return feats, flens

    def _normalize(self, feats, flens, valid):
        norm = self.normalize
        if norm is None:
            return feats
        mask = valid.to(feats.dtype)
        if self.utterance_mvn:
            # the plug-in's batch-exact UtteranceMVN: statistics over valid frames
            count = flens.to(feats.dtype).view(-1, 1, 1)
            mean = feats.sum(1, keepdim=True) / count
            centred = (feats - mean) * mask
            x = centred if norm.norm_means else feats
            if norm.norm_vars:
                var = (centred * centred).sum(1, keepdim=True) / count
                x = x / torch.clamp(var.sqrt(), min=norm.eps)
            return x * mask
        x = feats - self.mean if norm.norm_means else feats
        x = x * mask
        if norm.norm_vars:
            x = x / self.std
        return x


def _unwrap_preencoder(preencoder):
    if preencoder is None:
        return None
    while type(preencoder).__name__ == "GradScaledPreEncoder":
        preencoder = preencoder.preencoder
    if type(preencoder).__name__ != "LinearProjection":
        raise ExportError(
            f"preencoder {type(preencoder).__name__} cannot be exported (supported: "
            "linear, or none)"
        )
    return preencoder
