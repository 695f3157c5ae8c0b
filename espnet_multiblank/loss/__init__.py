"""The multi-blank RNN-T loss: API, options, validation and per-device backends."""

from espnet_multiblank.loss.api import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    multiblank_rnnt_loss,
    rnnt_loss,
)
from espnet_multiblank.loss.options import LossOptions, make_options
from espnet_multiblank.loss.reference import reference_costs

__all__ = [
    "MultiblankRNNTLoss",
    "MultiblankRNNTLossNumba",
    "multiblank_rnnt_loss",
    "rnnt_loss",
    "LossOptions",
    "make_options",
    "reference_costs",
]
