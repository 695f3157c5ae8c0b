"""Waveforms in: reading wav files and the checks every route into the runtime makes.

:func:`check_samples` turns what a caller passes (a NumPy array or a list of
numbers, mono or one channel of two dimensions) into (L,) float32 samples, or raises
a :class:`ValueError` / :class:`TypeError` that says what is wrong: several
channels, NaN or infinite samples, no samples, fewer than the encoder needs, or a
sample rate other than the model's. :func:`read_wav` reads a wav file with the
standard library (PCM 8/16/24/32-bit, 32/64-bit float), or with ``soundfile`` when it
is installed and the file is another format.

Integer PCM is scaled to [-1, 1) as ESPnet's loaders (``soundfile``) do.
"""

import wave
from pathlib import Path
from typing import Optional, Tuple

import numpy as np


def read_wav(path) -> Tuple[np.ndarray, int]:
    """Samples (L,) or (L, channels) float32 in [-1, 1), and the sample rate."""
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as w:
            rate, channels = w.getframerate(), w.getnchannels()
            width, frames = w.getsampwidth(), w.getnframes()
            raw = w.readframes(frames)
    except (wave.Error, EOFError) as e:  # float wavs, other formats
        try:
            import soundfile
        except ImportError:
            raise ValueError(
                f"{path}: cannot read ({e}); the standard library reads PCM wav "
                "files, install soundfile for other formats"
            ) from None
        data, rate = soundfile.read(str(path), dtype="float32")
        return data, int(rate)
    if width == 1:
        data = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        data = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        value = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        value = np.where(value >= 1 << 23, value - (1 << 24), value)
        data = value.astype(np.float32) / float(1 << 23)
    else:
        data = (np.frombuffer(raw, "<i4").astype(np.float64) / 2.0**31).astype(
            np.float32
        )
    if channels > 1:
        data = data.reshape(-1, channels)
    return data, int(rate)


def check_samples(
    samples,
    sample_rate: Optional[int],
    model_rate: int,
    min_samples: int,
    name: str = "samples",
) -> np.ndarray:
    """Validate one utterance (module docstring).

    Args:
        samples: (L,) or (L, 1) / (1, L) numbers.
        sample_rate: The caller's sample rate (None: not said, taken as the model's).
        model_rate: The model's sample rate.
        min_samples: The fewest samples the encoder takes.
        name: How the messages name the utterance.

    Returns:
        (L,) float32.
    """
    if sample_rate is not None:
        if isinstance(sample_rate, bool) or not isinstance(
            sample_rate, (int, np.integer)
        ):
            raise TypeError(
                f"sample_rate must be an int (samples per second), got "
                f"{sample_rate!r}"
            )
        if int(sample_rate) != model_rate:
            raise ValueError(
                f"{name}: sample rate {int(sample_rate)} Hz, the model takes "
                f"{model_rate} Hz (resample the audio first)"
            )
    if isinstance(samples, (str, bytes, Path)):
        raise TypeError(
            f"{name} must be an array of samples, got {type(samples).__name__} (read "
            "a file with espnet_multiblank.runtime.read_wav)"
        )
    try:
        x = np.asarray(samples)
    except Exception as e:
        raise TypeError(f"{name} must be an array of numbers: {e}") from None
    if x.dtype == object or not (
        np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
    ):
        raise TypeError(f"{name} must be an array of numbers, got dtype {x.dtype}")
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim == 2:
        raise ValueError(
            f"{name}: {min(x.shape)} channels (shape {x.shape}), the model takes "
            "one: pass one channel (e.g. samples[:, 0]) or a mix"
        )
    if x.ndim != 1:
        raise ValueError(f"{name} must have 1 dimension (samples), got shape {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        raise TypeError(
            f"{name} has integer dtype {x.dtype}: pass float samples in [-1, 1] "
            "(int16 PCM / 32768)"
        )
    x = x.astype(np.float32, copy=False)
    if x.size == 0:
        raise ValueError(f"{name}: no samples")
    finite = np.isfinite(x)
    if not finite.all():
        nan = int(np.isnan(x).sum())
        raise ValueError(
            f"{name}: non-finite samples: {nan} NaN, {int((~finite).sum()) - nan} "
            f"inf (of {x.size})"
        )
    if x.size < min_samples:
        raise ValueError(
            f"{name}: too short: {x.size} samples ({x.size / model_rate:.3f} s), "
            f"the encoder needs at least {min_samples}"
        )
    return x
