"""Decode exported models with ONNX Runtime and NumPy: no torch, no ESPnet.

``pip install 'espnet-multiblank[runtime]'`` installs what this package needs
(NumPy, ONNX Runtime). Models come from ``python -m espnet_multiblank.bin.export_onnx``
(:mod:`espnet_multiblank.export`); the format is described in
:mod:`espnet_multiblank.runtime.metadata` and docs/deploy.md.

* :class:`Recognizer`: ``recognize(samples, sample_rate)``, ``recognize_batch``,
  ``create_stream`` / ``decode_streams`` (greedy or beam search, every lattice);
* :func:`read_wav`: a wav file's samples;
* ``python -m espnet_multiblank.runtime.decode``: a data set (``wav.scp``) to
  ``text`` and ``decoding_stats.json``.
"""

from espnet_multiblank.runtime.audio import check_samples, read_wav
from espnet_multiblank.runtime.model import ExportedModel
from espnet_multiblank.runtime.recognizer import Recognizer
from espnet_multiblank.runtime.result import Result

__all__ = ["ExportedModel", "Recognizer", "Result", "check_samples", "read_wav"]
