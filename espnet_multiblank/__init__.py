"""espnet-multiblank: multi-blank RNN-T and TDT losses (Numba) and an ESPnet plug-in."""

from espnet_multiblank.autograd import GradMultiply, LogSoftmaxGradModification
from espnet_multiblank.fused import FusedTransducerLoss, fused_transducer_loss
from espnet_multiblank.loss import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    TDTLoss,
    multiblank_rnnt_loss,
    rnnt_loss,
    tdt_loss,
)

__version__ = "0.1.0"


def register() -> None:
    """Add the plug-in's classes to ESPnet's ASR task choices (idempotent)."""
    from espnet_multiblank.espnet.registration import register as _register

    _register()


__all__ = [
    "FusedTransducerLoss",
    "fused_transducer_loss",
    "GradMultiply",
    "LogSoftmaxGradModification",
    "MultiblankRNNTLoss",
    "MultiblankRNNTLossNumba",
    "multiblank_rnnt_loss",
    "rnnt_loss",
    "TDTLoss",
    "tdt_loss",
    "register",
    "__version__",
]
