"""Transducer decoding for multi-blank models: greedy (batched) and beam search.

See ``docs/decoding.md``. Import order: this package imports ``espnet2``; import
``espnet_multiblank.espnet.quiet`` first in scripts to silence nltk.
"""

import espnet_multiblank.espnet.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet_multiblank.decoding.beam import MultiblankBeamSearch
from espnet_multiblank.decoding.common import MultiblankHypothesis
from espnet_multiblank.decoding.greedy import MultiblankGreedySearch
from espnet_multiblank.decoding.layout import (
    BlankLayout,
    fix_decoder_blank,
    layout_from_model,
)
from espnet_multiblank.decoding.search import (
    ESPNET_SEARCH_TYPES,
    MULTIBLANK_SEARCH_TYPES,
    build_transducer_search,
    resolve_search_type,
)

__all__ = [
    "BlankLayout",
    "ESPNET_SEARCH_TYPES",
    "MULTIBLANK_SEARCH_TYPES",
    "MultiblankBeamSearch",
    "MultiblankGreedySearch",
    "MultiblankHypothesis",
    "build_transducer_search",
    "fix_decoder_blank",
    "layout_from_model",
    "resolve_search_type",
]
