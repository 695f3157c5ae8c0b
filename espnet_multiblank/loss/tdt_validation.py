"""Old import path of the TDT input checks: one :func:`validate_inputs` in
:mod:`espnet_multiblank.loss.validation` serves every lattice family."""

from espnet_multiblank.loss.validation import validate_inputs

validate_tdt_inputs = validate_inputs
