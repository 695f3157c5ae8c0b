"""Which waveform samples each feature frame reads: what a stream must know to compute
a frame as soon as its samples have arrived.

Two framings, those of the front ends the plug-in streams and exports:

* ``stft``: ESPnet's ``default`` front end (``torch.stft``): frame j reads ``length
  = n_fft`` samples from ``j shift - offset`` on, ``offset = n_fft // 2`` with
  ``center`` (the waveform reflected at its ends without repeating the edge
  sample: ``-k -> k``, ``L - 1 + k -> L - 1 - k``) and 0 without; ``(L + 2 offset -
  n_fft) // shift + 1`` frames;
* ``kaldi``: Kaldi / kaldi-native-fbank with ``snip_edges: false``
  (``frontend: kaldi_fbank``): frame j reads ``length`` samples from ``j shift +
  shift // 2 - length // 2`` on, reflected with the edge sample repeated (``-1 ->
  0``, ``L -> L - 1``); ``(L + shift // 2) // shift`` frames.

Nothing here imports torch: the plug-in's streams and the torch-free runtime share
it.
"""

from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("stft", "kaldi")


@dataclass(frozen=True)
class Framing:
    """A front end's framing (module docstring).

    Attributes:
        kind: ``"stft"`` or ``"kaldi"``.
        length: Samples one frame reads.
        shift: Samples between two frames.
        center: ``stft`` only: the waveform is reflected at both ends.
    """

    kind: str
    length: int
    shift: int
    center: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"framing kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def offset(self) -> int:
        """Samples of frame 0 before sample 0: frame j starts at ``j shift -
        offset``."""
        if self.kind == "kaldi":
            return self.length // 2 - self.shift // 2
        return self.length // 2 if self.center else 0

    def total_frames(self, samples: int) -> int:
        """Frames of a whole waveform of ``samples`` samples."""
        if samples <= 0:
            return 0
        if self.kind == "kaldi":
            return (samples + self.shift // 2) // self.shift
        pad = 2 * self.offset
        return max((samples + pad - self.length) // self.shift + 1, 0)

    def complete_frames(self, received: int) -> int:
        """Frames whose samples have all arrived (the end not yet reached: no
        reflection after the last sample needed)."""
        return max((received + self.offset - self.length) // self.shift + 1, 0)

    def segment(self, first: int, stop: int):
        """``(lo, hi)``: frames ``first .. stop - 1`` read samples ``lo .. hi - 1``
        (before reflection)."""
        lo = first * self.shift - self.offset
        return lo, (stop - 1) * self.shift - self.offset + self.length

    def reflect(self, positions: np.ndarray, samples: int) -> np.ndarray:
        """Indices into the waveform of (possibly out-of-range) sample positions,
        reflected at its ends as the front end reflects them."""
        last = max(samples - 1, 0)
        p = np.asarray(positions)
        if self.kind == "kaldi":
            for _ in range(2):  # a second time for waveforms shorter than a frame
                p = np.where(p < 0, -p - 1, p)
                p = np.where(p > last, 2 * last + 1 - p, p)
        else:
            p = np.abs(p)
            p = np.where(p > last, 2 * last - p, p)
        return np.clip(p, 0, last)

    def as_dict(self) -> dict:
        return asdict(self)
