"""Transducer losses (multi-blank / standard RNN-T and TDT): API, options, validation,
the family records, the stages and per-device backends."""

from espnet_multiblank.loss.api import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    TDTLoss,
    multiblank_rnnt_loss,
    rnnt_loss,
    tdt_loss,
    transducer_loss,
)
from espnet_multiblank.loss.options import (
    LossOptions,
    TDTOptions,
    make_options,
    make_tdt_options,
)
from espnet_multiblank.loss.reference import reference_costs, tdt_reference_costs

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
    "transducer_loss",
]
