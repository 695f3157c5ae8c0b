"""The ESPnet model ``model: multiblank_espnet`` and what it is built from.

* :mod:`~espnet_multiblank.espnet.model.asr_model`:
  :class:`MultiblankESPnetASRModel`, ESPnet's ASR model with the plug-in's
  transducer loss.
* :mod:`~espnet_multiblank.espnet.model.model_conf`: its ``model_conf`` keys,
  checked in one place (:class:`TransducerConf`).
* :mod:`~espnet_multiblank.espnet.model.no_path`: its training loss over the
  utterances that have a path.
* :mod:`~espnet_multiblank.espnet.model.fused_joint`:
  ``model_conf.transducer_fused_joint``, the joint network's output layer inside the
  fused joint + loss.
* :mod:`~espnet_multiblank.espnet.model.error_calculators`: its validation CER/WER.

Imports :mod:`~espnet_multiblank.espnet.batch_exact` and
:mod:`~espnet_multiblank.espnet.errors`; the registration, inference and training
sub-packages import it, never the other way round.

``from espnet_multiblank.espnet.model import MultiblankESPnetASRModel`` (the class's
path when espnet/ was one flat folder) keeps working: the class is loaded on first
use, so importing this package does not import ESPnet.
"""

__all__ = ["MultiblankESPnetASRModel"]


def __getattr__(name: str):
    if name == "MultiblankESPnetASRModel":
        from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel

        return MultiblankESPnetASRModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
