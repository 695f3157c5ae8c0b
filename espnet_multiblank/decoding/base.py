"""What every transducer search shares: networks, lattice, symbol tables, interface.

A search is built from a :class:`~espnet_multiblank.decoding.stepper.Stepper` (the
prediction and joint networks) and a lattice from :mod:`espnet_multiblank.lattice`
(which symbols exist and how many frames each covers). Subclasses implement
:meth:`TransducerSearch.search` (one utterance, n-best) and, when they have a batched
algorithm, :meth:`TransducerSearch.search_batch` (B utterances, 1-best each) with
``batched = True``. The searches (:mod:`.greedy`, :mod:`.label_looping`,
:mod:`.beam`) are written once for every lattice: what a lattice kind changes
reaches them through its symbol table (:meth:`TransducerSearch.table`).
:func:`single_thread_on_cpu` is the block the callers run a search in (one intra-op
thread on a CPU).
"""

import contextlib
from abc import ABC, abstractmethod
from numbers import Integral
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch

from espnet_multiblank.decoding.fusion import FusionState, ShallowFusion
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.stepper import Stepper
from espnet_multiblank.decoding.tables import (
    Arcs,
    RowNodes,
    SymbolTable,
    TDTSymbolTable,
    check_blank_decision,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice, is_lattice

Lattice = Union[MultiblankLattice, TDTLattice]
Table = Union[SymbolTable, TDTSymbolTable]


@contextlib.contextmanager
def single_thread_on_cpu(device: Any) -> Iterator[None]:
    """Run the block with one intra-op thread when ``device`` is the CPU.

    A search step works on a handful of rows ((A, J) matrices, one RNN step): extra
    threads cannot split that work and only add synchronisation, which on a loaded
    machine costs more than the step itself (``bench/decode_steps.py`` measures it).
    The encoder, which does gain from threads, runs outside this block.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def check_batch(enc_out: torch.Tensor, enc_lens: torch.Tensor) -> torch.Tensor:
    """The batched searches' inputs checked: ``enc_out`` (B, T_max, D_enc) and
    ``enc_lens`` (B,) in [0, T_max]; returns ``enc_lens`` as long on ``enc_out``'s
    device."""
    if enc_out.dim() != 3 or enc_lens.shape != (enc_out.size(0),):
        raise ValueError(
            "enc_out must be (B, T_max, D_enc) and enc_lens (B,), got "
            f"{tuple(enc_out.shape)} and {tuple(enc_lens.shape)}"
        )
    B, T_max = enc_out.shape[:2]
    lens = enc_lens.to(device=enc_out.device, dtype=torch.long)
    if B and bool(((lens < 0) | (lens > T_max)).any()):
        raise ValueError(
            f"enc_lens must be in [0, T_max = {T_max}], got {enc_lens.tolist()}"
        )
    return lens


class TransducerSearch(ABC):
    """Base class of the transducer searches.

    Args:
        stepper: The prediction and joint networks.
        lattice: The lattice the model was trained on (its ``blank`` is also the
            prediction network's start symbol, as in training).
        max_sym_per_frame: Labels a hypothesis may emit at one frame; after that only
            blanks are allowed there.
        blank_decision: How a step chooses between blanks and labels: ``"total"``
            or ``"symbol"`` (:mod:`~espnet_multiblank.decoding.tables`).
        fusion: Language models fused into the search
            (:class:`~espnet_multiblank.decoding.fusion.ShallowFusion` over the
            search's tokens), or None.
        end_rule: How a path may end: one of the lattice's ``end_rules``
            (:data:`espnet_multiblank.lattice.END_RULES`): ``"exact"``, or for a
            TDT ``"clip"`` (every duration allowed, clipped at T,
            :class:`~espnet_multiblank.decoding.tables.TDTSymbolTable`).

    Attributes:
        batched: True when :meth:`search_batch` decodes the utterances together.
        nbest: Hypotheses :meth:`search` returns (1; a beam search's own).
        beam_size: Hypotheses kept per step (1; a beam search's own).

    Every search decodes every lattice kind (the lattice gives its rules and its
    symbol table); the constructor refuses what is not a lattice.
    """

    batched = False
    nbest = 1
    beam_size = 1

    def __init__(
        self,
        stepper: Stepper,
        lattice: Lattice,
        max_sym_per_frame: int = 10,
        blank_decision: str = "total",
        fusion: Optional[ShallowFusion] = None,
        end_rule: str = "exact",
    ):
        if not isinstance(stepper, Stepper):
            raise TypeError(
                f"stepper must be an espnet_multiblank.decoding.Stepper, got "
                f"{type(stepper).__name__}"
            )
        if not is_lattice(lattice):
            raise TypeError(
                "lattice must be a espnet_multiblank.lattice.MultiblankLattice or "
                f"espnet_multiblank.lattice.TDTLattice for {type(self).__name__}, got "
                f"{type(lattice).__name__}"
            )
        lattice.check_vocab_size(stepper.vocab_size, "stepper.vocab_size")
        self.stepper = stepper
        self.lattice = lattice
        self.max_sym_per_frame = check_positive_int(
            "max_sym_per_frame", max_sym_per_frame
        )
        self._tables: Dict[torch.device, Table] = {}
        self.fusion = self._check_fusion(fusion)
        self.blank_decision = check_blank_decision(blank_decision)
        self.end_rule = lattice.check_end_rule(end_rule)

    #: the arguments every search takes, kept under their own names
    SETTINGS = (
        "stepper",
        "lattice",
        "max_sym_per_frame",
        "blank_decision",
        "fusion",
        "end_rule",
    )

    def settings(self, **changes) -> Dict[str, Any]:
        """The arguments every search takes (:attr:`SETTINGS`) as this search has
        them, with ``changes``: another search of the same model that decides as this
        one does is ``Other(**search.settings())``."""
        return {**{name: getattr(self, name) for name in self.SETTINGS}, **changes}

    @property
    def num_tokens(self) -> int:
        """V: the joint network's token outputs (a TDT's duration logits excluded)."""
        return self.lattice.num_tokens(self.stepper.vocab_size)

    def _check_fusion(self, fusion: Optional[ShallowFusion]):
        if fusion is None:
            return None
        if not isinstance(fusion, ShallowFusion):
            raise TypeError(
                "fusion must be an espnet_multiblank.decoding.ShallowFusion, got "
                f"{type(fusion).__name__}"
            )
        if fusion.vocab_size != self.num_tokens:
            raise ValueError(
                f"the fused language models score {fusion.vocab_size} tokens, the "
                f"model has {self.num_tokens}"
            )
        missing = set(self.lattice.blank_ids) - set(fusion.blank_ids)
        if missing:
            raise ValueError(
                f"the fusion must leave every blank of the lattice unscored; it does "
                f"not know {sorted(missing)}"
            )
        return fusion

    def start_lm(self, batch: int, device: torch.device) -> Optional[FusionState]:
        """The fused language models at the start of the sentence for ``batch`` rows
        (None without an LM)."""
        if self.fusion is None:
            return None
        return self.fusion.start(batch, device)

    @property
    def blank_id(self) -> int:
        """The standard blank (the start symbol of every hypothesis)."""
        return self.lattice.blank

    def table(self, device: torch.device) -> Table:
        """The symbol table of :attr:`lattice` on ``device`` (built once per
        device): the tensors its arcs are scored and chosen with (a single softmax
        over the symbols, or a TDT's token and duration softmaxes)."""
        table = self._tables.get(device)
        if table is None:
            kind = TDTSymbolTable if self.lattice.factorised else SymbolTable
            table = kind(self.lattice, self.stepper.vocab_size, device, self.end_rule)
            self._tables[device] = table
        return table

    def row_arcs(self, table: Table, nodes: RowNodes) -> Arcs:
        """The greedy arc of A rows (every greedy search's step, frame- and
        label-looping): the joint network at the rows' nodes, the arcs the lattice
        allows there (end rule, ``max_sym_per_frame``), the best one by
        ``blank_decision`` (the table's ``best_arcs``).

        Args:
            table: The search's symbol table on the rows' device.
            nodes: The rows at their nodes
                (:class:`~espnet_multiblank.decoding.tables.RowNodes`).

        Returns:
            :class:`~espnet_multiblank.decoding.tables.Arcs` of shape (A,).
        """
        scores = table.step_scores(self.stepper, nodes)
        return table.best_arcs(
            scores, nodes, self.max_sym_per_frame, self.blank_decision
        )

    def beam_candidates(self, table: Table, nodes: RowNodes) -> Arcs:
        """The N candidate arcs of each of A hypotheses (every beam search's
        expansion; the table's ``beam_candidates``). Arguments as for
        :meth:`row_arcs` (``frame`` < ``length``).

        Returns:
            :class:`~espnet_multiblank.decoding.tables.Arcs` of shape (A, N); ``score``
            is -inf where the arc is not allowed.
        """
        scores = table.step_scores(self.stepper, nodes)
        return table.beam_candidates(
            scores, nodes, self.max_sym_per_frame, self.blank_decision
        )

    def start(self, batch: int, device: torch.device) -> Tuple[torch.Tensor, Any]:
        """Prediction network after the start symbol, for ``batch`` rows.

        Returns:
            (batch, J) projected outputs and the state (fresh tensors: the batched
            searches write into them).
        """
        self.stepper.prepare(device)
        start = torch.full((batch,), self.blank_id, dtype=torch.long, device=device)
        return self.stepper.step(start, self.stepper.init_state(batch))

    def __call__(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        """ESPnet's search interface: :meth:`search`."""
        return self.search(enc_out)

    @abstractmethod
    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        """Decode one utterance.

        Args:
            enc_out: (T, D_enc) encoder output.

        Returns:
            Up to :attr:`nbest` complete hypotheses (``frame == T``), best first.
        """

    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """Decode B utterances (here one after the other; batched subclasses override).

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b.

        Returns:
            The best hypothesis of each utterance, in input order.
        """
        lens = enc_lens.tolist()
        return [self.search(enc_out[b, : lens[b]])[0] for b in range(len(lens))]

    def search_batch_nbest(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[List[Hypothesis]]:
        """Decode B utterances, n-best each (beam searches override; a batched greedy
        search gives its one hypothesis, the others decode one after the other).

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b.

        Returns:
            Up to :attr:`nbest` hypotheses of each utterance, best first, in input
            order.
        """
        if self.batched:
            return [[hyp] for hyp in self.search_batch(enc_out, enc_lens)]
        lens = enc_lens.tolist()
        return [self.search(enc_out[b, : lens[b]]) for b in range(len(lens))]
