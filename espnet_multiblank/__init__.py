"""espnet-multiblank: multi-blank RNN-T and TDT losses (Numba) and an ESPnet plug-in.

The names below are imported when first used (PEP 562), so that importing a
sub-package that needs neither torch nor ESPnet (:mod:`espnet_multiblank.runtime`,
:mod:`espnet_multiblank.lattice`) does not import them.
"""

import importlib

__version__ = "0.1.0"

#: public name -> module that defines it
_LAZY = {
    "GradMultiply": "espnet_multiblank.autograd",
    "LogSoftmaxGradModification": "espnet_multiblank.autograd",
    "FusedTransducerLoss": "espnet_multiblank.fused",
    "fused_transducer_loss": "espnet_multiblank.fused",
    "MultiblankRNNTLoss": "espnet_multiblank.loss",
    "MultiblankRNNTLossNumba": "espnet_multiblank.loss",
    "TDTLoss": "espnet_multiblank.loss",
    "multiblank_rnnt_loss": "espnet_multiblank.loss",
    "rnnt_loss": "espnet_multiblank.loss",
    "tdt_loss": "espnet_multiblank.loss",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'espnet_multiblank' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("torch", "numba", "typeguard"):
            raise ModuleNotFoundError(
                f"espnet_multiblank.{name} needs {e.name.split('.')[0]}, which is not "
                "installed: pip install 'espnet-multiblank[loss]' (the losses) or "
                "'espnet-multiblank[espnet]' (the ESPnet plug-in); the torch-free "
                "runtime is espnet_multiblank.runtime",
                name=e.name,
            ) from e
        raise
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def register() -> None:
    """Add the plug-in's classes to ESPnet's ASR task choices (idempotent)."""
    from espnet_multiblank.espnet.registration import register as _register

    _register()


__all__ = sorted(_LAZY) + ["register", "__version__"]
