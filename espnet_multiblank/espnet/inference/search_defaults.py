"""The defaults of every transducer search type: moved to
:mod:`espnet_multiblank.search_defaults` (torch-free, beside ``lattice.py``, where the
runtime reads them too); this old path re-exports it."""

from espnet_multiblank.search_defaults import (  # noqa: F401
    DEFAULT_SEARCH_TYPE,
    ESPNET_BEAM_SIZE,
    SEARCH_DEFAULTS,
    TRANSDUCER_CONF_KEYS,
    defaults_help,
    search_settings,
)
