"""``frontend: kaldi_fbank``: Kaldi-style log-mel filter banks, the features
sherpa-onnx computes for a NeMo transducer.

sherpa-onnx (and k2's other runtimes) compute their own features with
kaldi-native-fbank; a model deployed there must have been trained on those
features. This front end computes them, with the options as its keys (YAML keys =
argument names) and sherpa-onnx's settings for NeMo transducers as defaults:

* frames of ``frame_length_ms`` every ``frame_shift_ms`` (25 / 10 ms), Kaldi's
  ``snip_edges: false`` framing: ``(L + shift / 2) // shift`` frames, frame i
  centred on sample ``i shift + shift / 2``, samples before the first and after the
  last reflected (``-1 -> 0``, ``L -> L - 1``), each utterance of a padded batch at
  its own ends (batch-exact);
* per frame: optional dither (training only), DC offset removal, pre-emphasis
  (``x[i] -= c x[i - 1]``, ``x[0] -= c x[0]``), the window (``povey``: the Hann
  window to the power 0.85, ``hann`` periodic, ``hamming``, ``rectangular``), zero
  padding to a power of two, the power spectrum;
* the mel filter bank of kaldi-native-fbank's ``is_librosa`` mode (Slaney mel
  scale and Slaney area normalisation, ``n_fft / 2 + 1`` bins, ``low_freq`` to
  ``high_freq``; a ``high_freq`` <= 0 counts from the Nyquist frequency), computed
  in float32 as it computes them;
* ``log(max(energy, float32 epsilon))``; padded frames are 0.

The DFT is a matrix product (the window folded into it), which ONNX exports as it
is. Equal to kaldi-native-fbank's features within 1e-4 (tested against the
package), and so to what sherpa-onnx feeds an exported model.
"""

import math
from typing import Tuple, Union

import numpy as np
import torch
from espnet2.asr.frontend.abs_frontend import AbsFrontend
from typeguard import typechecked

from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.framing import Framing

#: Choice name.
NAME = "kaldi_fbank"
WINDOWS = ("povey", "hann", "hanning", "hamming", "rectangular")
#: float32 machine epsilon: the floor before the log (Kaldi's)
FLOOR = float(np.finfo(np.float32).eps)


def _window(kind: str, n: int) -> np.ndarray:
    """kaldi-native-fbank's windows (computed in float64, stored in float32)."""
    i = np.arange(n, dtype=np.float64)
    a = 2 * math.pi / (n if kind == "hann" else n - 1)
    if kind == "povey":
        w = np.power(0.5 - 0.5 * np.cos(a * i), 0.85)
    elif kind in ("hann", "hanning"):
        w = 0.5 - 0.5 * np.cos(a * i)
    elif kind == "hamming":
        w = 0.54 - 0.46 * np.cos(a * i)
    else:
        w = np.ones(n)
    return w.astype(np.float32)


def _slaney(hz: np.float32) -> np.float32:
    hz = np.float32(hz)
    if hz <= 1000:
        return np.float32(hz * np.float32(3) / np.float32(200.0))
    return np.float32(15) + np.float32(14.545078505785561) * np.log(
        np.float32(hz / np.float32(1000))
    )


def _inverse_slaney(mel: np.float32) -> np.float32:
    mel = np.float32(mel)
    if mel <= 15:
        return np.float32(np.float32(200.0) / np.float32(3) * mel)
    return np.float32(1000) * np.exp(
        np.float32((mel - np.float32(15)) * np.float32(0.06875177742094911))
    )


def librosa_mel_banks(
    fs: float, n_fft: int, n_mels: int, low_freq: float, high_freq: float
) -> np.ndarray:
    """(n_fft / 2 + 1, n_mels) float32 weights of kaldi-native-fbank's
    ``is_librosa`` filter bank (``InitLibrosaMelBanks``: Slaney scale and norm)."""
    f32 = np.float32
    nyquist = f32(0.5) * f32(fs)
    high = f32(high_freq) if high_freq > 0 else nyquist + f32(high_freq)
    low = f32(low_freq)
    if not (0 <= low < nyquist and 0 < high <= nyquist and high > low):
        raise ConfigError(
            f"frontend_conf: low_freq {low_freq} and high_freq {high_freq} must "
            f"satisfy 0 <= low < high <= {float(nyquist)} (the Nyquist frequency; "
            "high_freq <= 0 counts from it)"
        )
    bins = n_fft // 2
    width = f32(fs) / f32(n_fft)
    mel_low, mel_high = _slaney(low), _slaney(high)
    delta = f32((mel_high - mel_low) / f32(n_mels + 1))
    out = np.zeros((bins + 1, n_mels), np.float32)
    for m in range(n_mels):
        left = _inverse_slaney(mel_low + f32(m) * delta)
        center = _inverse_slaney(mel_low + f32(m + 1) * delta)
        right = _inverse_slaney(mel_low + f32(m + 2) * delta)
        for i in range(bins + 1):
            hz = f32(width * f32(i))
            if left < hz < right:
                if hz <= center:
                    w = f32((hz - left) / (center - left))
                else:
                    w = f32((right - hz) / (right - center))
                out[i, m] = f32(w * f32(f32(2) / (right - left)))
        if not out[:, m].any():
            raise ConfigError(
                f"frontend_conf.n_mels = {n_mels} is too large for n_fft {n_fft} at "
                f"{fs} Hz: mel bin {m} has no FFT bin"
            )
    return out


class KaldiFbankFrontend(AbsFrontend):
    """The front end of the module docstring.

    Args:
        fs: Sample rate (``"16k"`` or an int).
        n_mels: Mel bins (the feature dimension).
        frame_length_ms, frame_shift_ms: Frame length and shift.
        preemph_coeff: Pre-emphasis coefficient (0: none).
        window: ``povey``, ``hann``, ``hamming`` or ``rectangular``.
        low_freq, high_freq: The filter bank's range in Hz (``high_freq`` <= 0:
            the Nyquist frequency plus ``high_freq``).
        dither: Gaussian noise added in training (0: none; never when decoding).
        remove_dc_offset: Subtract each frame's mean.
        round_to_power_of_two: Zero-pad each frame to a power of two.
    """

    @typechecked
    def __init__(
        self,
        fs: Union[int, str] = 16000,
        n_mels: int = 80,
        frame_length_ms: float = 25.0,
        frame_shift_ms: float = 10.0,
        preemph_coeff: float = 0.97,
        window: str = "povey",
        low_freq: float = 0.0,
        high_freq: float = -400.0,
        dither: float = 0.0,
        remove_dc_offset: bool = False,
        round_to_power_of_two: bool = True,
    ):
        super().__init__()
        if isinstance(fs, str):
            import humanfriendly

            fs = humanfriendly.parse_size(fs)
        if fs <= 0:
            raise ConfigError(f"frontend_conf.fs must be > 0, got {fs}")
        if window not in WINDOWS:
            raise ConfigError(
                f"frontend_conf.window must be one of {list(WINDOWS)}, got {window!r}"
            )
        if not 0.0 <= preemph_coeff <= 1.0:
            raise ConfigError(
                f"frontend_conf.preemph_coeff must be in [0, 1], got {preemph_coeff}"
            )
        if dither < 0:
            raise ConfigError(f"frontend_conf.dither must be >= 0, got {dither}")
        # kaldi-native-fbank's float arithmetic for the frame sizes
        f32 = np.float32
        self.fs = int(fs)
        self.frame_length = int(f32(fs) * f32(0.001) * f32(frame_length_ms))
        self.frame_shift = int(f32(fs) * f32(0.001) * f32(frame_shift_ms))
        if self.frame_length < 2 or self.frame_shift < 1:
            raise ConfigError(
                f"frontend_conf: frame_length_ms {frame_length_ms} and "
                f"frame_shift_ms {frame_shift_ms} give {self.frame_length} and "
                f"{self.frame_shift} samples at {fs} Hz"
            )
        n = self.frame_length
        self.n_fft = 1 << (n - 1).bit_length() if round_to_power_of_two else n
        self.n_mels = n_mels
        self.window = window
        self.low_freq, self.high_freq = float(low_freq), float(high_freq)
        self.preemph_coeff = float(preemph_coeff)
        self.dither = float(dither)
        self.remove_dc_offset = bool(remove_dc_offset)
        self.hop_length = self.frame_shift  # what ESPnet's tools read
        bins = self.n_fft // 2 + 1
        k = np.arange(bins)[None, :]
        t = np.arange(n)[:, None]
        angle = 2 * np.pi * (k * t % self.n_fft) / self.n_fft  # exact phases
        window_ = _window(window, n).astype(np.float64)[:, None]
        basis = np.concatenate([np.cos(angle), -np.sin(angle)], 1) * window_
        #: (frame_length, 2 bins): window x DFT (the padding's zeros drop out)
        self.register_buffer("basis", torch.from_numpy(basis.astype(np.float32)))
        mel = librosa_mel_banks(fs, self.n_fft, n_mels, low_freq, high_freq)
        self.register_buffer("melmat", torch.from_numpy(mel))

    def output_size(self) -> int:
        return self.n_mels

    def framing(self) -> Framing:
        """Which samples each frame reads (:class:`~espnet_multiblank.framing.
        Framing`, kind ``kaldi``)."""
        return Framing("kaldi", self.frame_length, self.frame_shift)

    def frames(self, lengths: torch.Tensor) -> torch.Tensor:
        """(B,) int64 frames of utterances of ``lengths`` samples."""
        return torch.div(
            lengths + self.frame_shift // 2, self.frame_shift, rounding_mode="floor"
        )

    def forward(
        self, input: torch.Tensor, input_lengths: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Args: input (B, L) float samples (padding after each utterance is
        ignored), input_lengths (B,) int. Returns (B, F, n_mels) float32 features
        (0 on padded frames), (B,) int64 frames."""
        if input.dim() != 2:
            raise ValueError(
                f"{NAME}: input must be (batch, samples) mono, got {tuple(input.shape)}"
            )
        x = input.float()
        lengths = input_lengths.to(x.device).long()
        flens = self.frames(lengths)
        F = torch.div(
            x.size(1) + self.frame_shift // 2, self.frame_shift, rounding_mode="floor"
        )
        frames = _frame_indices(F, self.frame_shift, self.frame_length, x.device)
        last = (lengths - 1).clamp(min=0).view(-1, 1, 1)
        idx = frames.unsqueeze(0)  # (1, F, n)
        # Kaldi's reflection (-1 -> 0, L -> L - 1), twice for very short inputs
        for _ in range(2):
            idx = torch.where(idx < 0, -idx - 1, idx)
            idx = torch.where(idx > last, 2 * last + 1 - idx, idx)
        idx = torch.minimum(idx.clamp(min=0), last)
        B = x.size(0)
        win = torch.gather(x, 1, idx.reshape(B, -1)).view(B, -1, self.frame_length)
        feats = self._frame_features(win)
        valid = torch.arange(feats.size(1), device=x.device)[None, :] < flens[:, None]
        return feats * valid.unsqueeze(-1).to(feats.dtype), flens

    def forward_segment(self, segment: torch.Tensor) -> torch.Tensor:
        """(B, S) samples whose first frame starts at their first sample (a
        stream's segment, already reflected where it passes an end) -> (B, F, n_mels)
        features of its ``(S - frame_length) // frame_shift + 1`` frames."""
        x = segment.float()
        F = (
            torch.div(
                x.size(1) - self.frame_length, self.frame_shift, rounding_mode="floor"
            )
            + 1
        )
        idx = _frame_indices(F, self.frame_shift, self.frame_length, x.device)
        idx = idx + (self.frame_length // 2 - self.frame_shift // 2)  # from 0
        win = x[:, idx]  # (B, F, frame_length)
        return self._frame_features(win)

    def _frame_features(self, win: torch.Tensor) -> torch.Tensor:
        """(B, F, frame_length) frames -> (B, F, n_mels) log-mel features."""
        if self.dither > 0 and self.training:
            win = win + self.dither * torch.randn_like(win)
        if self.remove_dc_offset:
            win = win - win.mean(-1, keepdim=True)
        if self.preemph_coeff:
            c = self.preemph_coeff
            win = torch.cat(
                [win[..., :1] * (1 - c), win[..., 1:] - c * win[..., :-1]], -1
            )
        spec = torch.matmul(win, self.basis)  # (B, F, 2 bins)
        bins = self.n_fft // 2 + 1
        power = spec[..., :bins] ** 2 + spec[..., bins:] ** 2
        return torch.log(torch.matmul(power, self.melmat).clamp(min=FLOOR))


def _frame_indices(num_frames, shift: int, length: int, device) -> torch.Tensor:
    """(F, length) int64 sample index of each frame's samples (may be out of the
    waveform: the caller reflects them)."""
    start = torch.arange(num_frames, device=device) * shift + shift // 2 - length // 2
    return start.unsqueeze(1) + torch.arange(length, device=device).unsqueeze(0)
