"""Export a transducer trained with ESPnet and the plug-in to ONNX graphs.

``python -m espnet_multiblank.bin.export_onnx --asr_train_config C --asr_model_file M
--output_dir D`` (or :func:`export_model`) writes the directory that
:mod:`espnet_multiblank.runtime` decodes without torch; docs/deploy.md describes
the format.
"""

from espnet_multiblank.export.exporter import export_model
from espnet_multiblank.export.support import ExportError

__all__ = ["ExportError", "export_model"]
