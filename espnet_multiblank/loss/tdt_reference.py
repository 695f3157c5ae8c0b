"""Old import path of the TDT reference: it lives in
:mod:`espnet_multiblank.loss.reference` with the multi-blank one."""

from espnet_multiblank.loss.reference import (  # noqa: F401
    tdt_log_likelihood,
    tdt_reference_costs,
)
