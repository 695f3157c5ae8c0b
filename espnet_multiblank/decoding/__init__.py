"""Transducer searches over the duration lattice: the decoding core.

Depends on torch and :mod:`espnet_multiblank.lattice` only (no ESPnet import); the
ESPnet glue (``Speech2Text``, the search factory for decode configs) lives in
:mod:`espnet_multiblank.espnet` and imports this package, never the reverse.

* :class:`Stepper` / :class:`JointStepper`: the prediction and joint networks.
* :class:`Hypothesis`: a search result.
* :class:`SymbolTable`: frames per symbol and the allowed-symbol masks of a lattice.
* :class:`TransducerSearch`: the searches' base class; :class:`GreedySearch` (one
  utterance and batched), :class:`LabelLoopingGreedySearch` (batched) and
  :class:`BeamSearch` (every beam rule): one class per search, each for every
  lattice, the lattice's symbol table (:class:`SymbolTable`, or a
  token-and-duration transducer's :class:`TDTSymbolTable`) scoring its arcs.
* :class:`ShallowFusion` of :class:`TokenLM` language models: every search above
  takes one (``fusion=``) and ranks its arcs by the fused score.
* :class:`Arcs`: the arcs a step chooses from or takes (:mod:`.tables`).

See ``docs/decoding.md``.
"""

from espnet_multiblank.decoding.base import TransducerSearch, single_thread_on_cpu
from espnet_multiblank.decoding.beam import BeamSearch
from espnet_multiblank.decoding.fusion import FusionState, ShallowFusion, TokenLM
from espnet_multiblank.decoding.greedy import GreedySearch
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.label_looping import LabelLoopingGreedySearch
from espnet_multiblank.decoding.stepper import JointStepper, Stepper
from espnet_multiblank.decoding.tables import Arcs, SymbolTable, TDTSymbolTable

# The former names: once one class per lattice kind, now aliases of the one search
# (every class decodes every lattice kind).
MultiblankGreedySearch = TDTGreedySearch = GreedySearch
MultiblankBeamSearch = TDTBeamSearch = BeamSearch
MultiblankLabelLoopingSearch = TDTLabelLoopingSearch = LabelLoopingGreedySearch

__all__ = [
    "Arcs",
    "BeamSearch",
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
