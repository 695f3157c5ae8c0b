"""Old import path of the TDT options: they live in
:mod:`espnet_multiblank.loss.options` with the multi-blank ones."""

from espnet_multiblank.loss.options import (  # noqa: F401
    TDTOptions,
    check_probability,
    make_tdt_options,
)
