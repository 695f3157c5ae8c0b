"""Tiny random transducer models of every lattice for the search tests, and one
record per lattice that gives a test body its model, searches and references.

* :func:`make_mb_model`: ESPnet's ``TransducerDecoder`` + ``JointNetwork`` of a
  multi-blank model (standard: ``durations=()``), the blanks at ``blank_id -
  len(durations) .. blank_id``; :func:`make_tdt_model`: a TDT's, V token and D
  duration outputs; :func:`enc_batch`: random encoder output.
* :class:`SearchLattice` (made by :func:`standard`, :func:`multiblank`, :func:`tdt`):
  one lattice of a parametrised test, with its searches (through the plug-in's
  factory, or the core classes with a given stepper) and its references
  (:mod:`search_oracles`) under one interface, so that one test body serves every
  lattice.
"""

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Tuple

import pytest
import search_oracles as oracles
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.asr.decoder.transducer_decoder import TransducerDecoder
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.decoding import BeamSearch, GreedySearch, JointStepper
from espnet_multiblank.espnet.inference.search import build_transducer_search
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

#: encoder output width of every model here
D_ENC = 8
#: the multi-blank models' defaults: V = 10 symbols, <blank8> <blank4> <blank2>
#: <blank> at 0..3, labels 4..9
MB_V = 10
MB_DURS = (2, 4, 8)
MB_BLANK = 3
#: the TDT models' default durations
TDT_DURS = (0, 1, 2, 3, 4)


def make_mb_model(
    seed=0, blank_id=MB_BLANK, durations=MB_DURS, blank_bias=2.0, vocab=MB_V
):
    """Random TransducerDecoder + JointNetwork; decoder built like ESPnet (pad 0)."""
    torch.manual_seed(seed)
    decoder = TransducerDecoder(vocab, hidden_size=12, embed_pad=0).eval()
    joint = JointNetwork(vocab, D_ENC, 12, joint_space_size=12).eval()
    with torch.no_grad():  # blanks likely enough that hypotheses stay short
        joint.lin_out.bias[blank_id - len(durations) : blank_id + 1] += blank_bias
        joint.lin_out.weight.mul_(3.0)
    return SimpleNamespace(
        decoder=decoder,
        joint_network=joint,
        blank_id=blank_id,
        big_blank_durations=tuple(durations),
        big_blank_ids=tuple(blank_id - 1 - i for i in range(len(durations))),
        token_list=[f"t{i}" for i in range(vocab)],
    )


def make_tdt_model(
    seed=0, durations=TDT_DURS, blank=0, vocab=6, blank_bias=1.0, scale=3.0
):
    """Random TransducerDecoder (V tokens, ESPnet's pad 0) + JointNetwork with V + D
    outputs, as the plug-in's TDT model has them."""
    torch.manual_seed(seed)
    decoder = TransducerDecoder(vocab, hidden_size=12, embed_pad=0).eval()
    joint = JointNetwork(vocab + len(durations), D_ENC, 12, joint_space_size=12).eval()
    with torch.no_grad():
        joint.lin_out.weight.mul_(scale)
        joint.lin_out.bias[blank] += blank_bias
    return SimpleNamespace(
        decoder=decoder,
        joint_network=joint,
        blank_id=blank,
        tdt_durations=tuple(durations),
        big_blank_durations=(),
        token_list=[f"t{i}" for i in range(vocab)],
    )


def enc_batch(seed, lens):
    """(B, max(lens), D_ENC) random encoder output and its lengths."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(lens), max(lens), D_ENC, generator=g), torch.tensor(lens)


_SHORT = {"standard": "std", "multiblank": "mb", "tdt": "tdt"}


@dataclass(frozen=True)
class SearchLattice:
    """One lattice of a search test.

    Attributes:
        kind: "standard", "multiblank" or "tdt".
        durations: the big blanks' (standard: none) or the TDT's.
        blank: the blank's index.
        model_kw: other arguments of the model maker (``blank_bias``, ``vocab``, ...)
            as sorted (name, value) pairs.
    """

    kind: str
    durations: Tuple[int, ...]
    blank: int
    model_kw: Tuple[Tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        durations = ".".join(map(str, self.durations))
        extra = "".join(f"-{k}{v}" for k, v in self.model_kw)
        return f"{_SHORT[self.kind]}{durations}-b{self.blank}{extra}"

    @property
    def is_tdt(self) -> bool:
        return self.kind == "tdt"

    @property
    def lattice(self):
        """The decoding lattice a model of this record has."""
        if self.is_tdt:
            return TDTLattice.create(self.blank, self.durations)
        return MultiblankLattice.create(self.blank, self.durations)

    @property
    def blank_ids(self) -> frozenset:
        """The blank symbols, by the layout rule: the blank and, in a multi-blank
        lattice, the big blanks just before it."""
        if self.is_tdt:
            return frozenset({self.blank})
        return frozenset(self.blank - i for i in range(len(self.durations) + 1))

    @property
    def greedy_type(self) -> str:
        return "tdt_greedy" if self.is_tdt else "mb_greedy"

    @property
    def beam_type(self) -> str:
        return "tdt_beam" if self.is_tdt else "mb_beam"

    @property
    def greedy_class(self) -> type:
        return GreedySearch

    @property
    def beam_class(self) -> type:
        return BeamSearch

    def model(self, seed=0, **kw) -> SimpleNamespace:
        """The tiny random model (``kw`` overrides ``model_kw``)."""
        kw = {**dict(self.model_kw), **kw}
        if self.is_tdt:
            return make_tdt_model(
                seed, durations=self.durations, blank=self.blank, **kw
            )
        return make_mb_model(seed, blank_id=self.blank, durations=self.durations, **kw)

    def joint_size(self, model) -> int:
        """The joint network's outputs: V, or V + D for a TDT."""
        return model.decoder.odim + (len(self.durations) if self.is_tdt else 0)

    def greedy(self, model, **conf):
        """The plug-in's greedy search of this lattice, through the factory."""
        return build_transducer_search(model, search_type=self.greedy_type, **conf)

    def beam(self, model, beam_size, **conf):
        """The plug-in's beam search of this lattice, through the factory."""
        return build_transducer_search(
            model, search_type=self.beam_type, beam_size=beam_size, **conf
        )

    def core_beam(self, model, stepper=None, **kwargs):
        """The beam search class itself (no ESPnet glue), on ``stepper`` (default: a
        JointStepper of the model)."""
        if stepper is None:
            stepper = JointStepper(
                model.decoder, model.joint_network, self.joint_size(model)
            )
        return self.beam_class(stepper, self.lattice, **kwargs)

    def reference_greedy(self, model, enc, max_sym, decision):
        """The reference greedy rule on one utterance: (labels, score, frames
        skipped, long blanks)."""
        if self.is_tdt:
            return oracles.tdt_reference_greedy(model, enc, max_sym, decision)
        return oracles.mb_greedy_path(model, enc, decision, max_sym)

    def exhaustive(self, model, enc, max_sym):
        """{labels: log P(labels)} over every path of the search lattice."""
        if self.is_tdt:
            return oracles.enumerate_paths(model, enc, max_sym)
        return oracles.brute_force_sequences(model, enc, max_sym)

    def reference_beam(self, model, enc, beam, max_sym, decision):
        """The reference beam rule: ([(labels, score, long blanks, frames skipped)],
        hypotheses per expansion)."""
        if self.is_tdt:
            return oracles.tdt_reference_beam(model, enc, beam, max_sym, decision)
        return oracles.mb_reference_beam(model, enc, beam, max_sym, decision)


def _record(kind, durations, blank, model_kw) -> SearchLattice:
    return SearchLattice(kind, tuple(durations), blank, tuple(sorted(model_kw.items())))


def standard(blank=0, **model_kw) -> SearchLattice:
    """A standard transducer (a multi-blank model without big blanks)."""
    return _record("standard", (), blank, model_kw)


def multiblank(durations=MB_DURS, blank=MB_BLANK, **model_kw) -> SearchLattice:
    return _record("multiblank", durations, blank, model_kw)


def tdt(durations=TDT_DURS, blank=0, **model_kw) -> SearchLattice:
    return _record("tdt", durations, blank, model_kw)


def params(*lattices):
    """``pytest.param`` s of the lattices, with their ids."""
    return [pytest.param(lat, id=lat.id) for lat in lattices]
