"""Transducer searches over the duration lattice: the decoding core.

Depends on torch and :mod:`espnet_multiblank.lattice` only (no ESPnet import); the
ESPnet glue (``Speech2Text``, the search factory for decode configs) lives in
:mod:`espnet_multiblank.espnet` and imports this package, never the reverse.

* :class:`Stepper` / :class:`JointStepper`: the prediction and joint networks.
* :class:`Hypothesis`, :class:`BatchedHyps`: search results and batched bookkeeping.
* :class:`SymbolTable`: frames per symbol and the allowed-symbol masks of a lattice.
* :class:`TransducerSearch`: the searches' base class; :class:`GreedySearch` (one
  utterance and batched) and :class:`MultiblankBeamSearch` (every beam rule), one
  search for every lattice, the lattice's symbol table (:class:`SymbolTable`, or a
  token-and-duration transducer's :class:`TDTSymbolTable`) scoring its arcs.
  :class:`MultiblankGreedySearch`, :class:`TDTGreedySearch` and
  :class:`TDTBeamSearch` are the same searches restricted to one lattice kind (the
  former classes).
* :class:`LabelLoopingGreedySearch`: label-looping greedy search (batched), with
  :class:`MultiblankLabelLoopingSearch` and :class:`TDTLabelLoopingSearch`.
* :class:`ShallowFusion` of :class:`TokenLM` language models: every search above
  takes one (``fusion=``) and ranks its arcs by the fused score.
* :class:`Arcs`: the arcs a step chooses from or takes (:mod:`.arcs`).

See ``docs/decoding.md``.
"""

from espnet_multiblank.decoding.arcs import Arcs
from espnet_multiblank.decoding.base import TransducerSearch
from espnet_multiblank.decoding.beam import MultiblankBeamSearch, TDTBeamSearch
from espnet_multiblank.decoding.fusion import FusionState, ShallowFusion, TokenLM
from espnet_multiblank.decoding.greedy import (
    GreedySearch,
    MultiblankGreedySearch,
    TDTGreedySearch,
)
from espnet_multiblank.decoding.hypothesis import BatchedHyps, Hypothesis
from espnet_multiblank.decoding.label_looping import (
    LabelLoopingGreedySearch,
    MultiblankLabelLoopingSearch,
    TDTLabelLoopingSearch,
)
from espnet_multiblank.decoding.stepper import JointStepper, Stepper
from espnet_multiblank.decoding.tables import SymbolTable, TDTSymbolTable
from espnet_multiblank.decoding.threads import single_thread_on_cpu

__all__ = [
    "Arcs",
    "BatchedHyps",
    "FusionState",
    "GreedySearch",
    "Hypothesis",
    "JointStepper",
    "LabelLoopingGreedySearch",
    "MultiblankBeamSearch",
    "MultiblankGreedySearch",
    "MultiblankLabelLoopingSearch",
    "ShallowFusion",
    "Stepper",
    "SymbolTable",
    "TDTBeamSearch",
    "TDTGreedySearch",
    "TDTLabelLoopingSearch",
    "TDTSymbolTable",
    "TokenLM",
    "TransducerSearch",
    "single_thread_on_cpu",
]
