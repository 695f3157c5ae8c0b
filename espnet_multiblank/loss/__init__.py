"""Transducer losses (multi-blank / standard RNN-T and TDT): API, options, validation
and per-device backends."""

from espnet_multiblank.loss.api import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    multiblank_rnnt_loss,
    rnnt_loss,
)
from espnet_multiblank.loss.options import LossOptions, make_options
from espnet_multiblank.loss.reference import reference_costs
from espnet_multiblank.loss.tdt_api import TDTLoss, tdt_loss
from espnet_multiblank.loss.tdt_options import TDTOptions, make_tdt_options
from espnet_multiblank.loss.tdt_reference import tdt_reference_costs

__all__ = [
    "MultiblankRNNTLoss",
    "MultiblankRNNTLossNumba",
    "multiblank_rnnt_loss",
    "rnnt_loss",
    "LossOptions",
    "make_options",
    "reference_costs",
    "TDTLoss",
    "tdt_loss",
    "TDTOptions",
    "make_tdt_options",
    "tdt_reference_costs",
]
