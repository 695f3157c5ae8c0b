"""What every transducer search shares: networks, lattice, symbol tables, interface.

A search is built from a :class:`~espnet_multiblank.decoding.stepper.Stepper` (the
prediction and joint networks) and a lattice from :mod:`espnet_multiblank.lattice`
(which symbols exist and how many frames each covers). Subclasses implement
:meth:`TransducerSearch.search` (one utterance, n-best) and, when they have a batched
algorithm, :meth:`TransducerSearch.search_batch` (B utterances, 1-best each) with
``batched = True``. Frame-looping greedy and beam search are here; label-looping
searches (one emitted label per outer iteration, the inner loop advancing only the
joint network) and searches over other lattices (TDT: a stepper whose joint output
carries duration logits, and a symbol table built from ``TDTLattice``) plug in through
:meth:`TransducerSearch.make_table` and the same two methods.
"""

from abc import ABC, abstractmethod
from numbers import Integral
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from espnet_multiblank.decoding.arcs import Arcs
from espnet_multiblank.decoding.fusion import FusionState, ShallowFusion
from espnet_multiblank.decoding.hypothesis import BatchedHyps, Hypothesis
from espnet_multiblank.decoding.one_run import OneRun
from espnet_multiblank.decoding.stepper import Stepper
from espnet_multiblank.decoding.tables import (
    SymbolTable,
    TDTSymbolTable,
    check_blank_decision,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice, lattice_of

Lattice = Union[MultiblankLattice, TDTLattice]
Table = Union[SymbolTable, TDTSymbolTable]


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
        nbest: Hypotheses :meth:`search` returns.
        fusion: Language models fused into the search
            (:class:`~espnet_multiblank.decoding.fusion.ShallowFusion` over the
            search's tokens), or None.

    Attributes:
        batched: True when :meth:`search_batch` decodes the utterances together.
        lattice_types: The lattice classes the search decodes (the constructor refuses
            others).
    """

    batched = False
    lattice_types: Tuple[type, ...] = (MultiblankLattice,)
    #: how a path may end (:data:`espnet_multiblank.lattice.END_RULES`): the
    #: lattice's own rule unless a search is built with another one it supports
    end_rule = "exact"

    def __init__(
        self,
        stepper: Stepper,
        lattice: Lattice,
        max_sym_per_frame: int = 10,
        nbest: int = 1,
        fusion: Optional[ShallowFusion] = None,
    ):
        if not isinstance(stepper, Stepper):
            raise TypeError(
                f"stepper must be an espnet_multiblank.decoding.Stepper, got "
                f"{type(stepper).__name__}"
            )
        if not lattice_of(lattice, self.lattice_types):
            names = " or ".join(
                f"espnet_multiblank.lattice.{c.__name__}" for c in self.lattice_types
            )
            raise TypeError(
                f"lattice must be a {names} for {type(self).__name__}, got "
                f"{type(lattice).__name__}"
            )
        lattice.check_vocab_size(stepper.vocab_size, "stepper.vocab_size")
        self.stepper = stepper
        self.lattice = lattice
        self.max_sym_per_frame = check_positive_int(
            "max_sym_per_frame", max_sym_per_frame
        )
        self.nbest = check_positive_int("nbest", nbest)
        self._tables: Dict[torch.device, Table] = {}
        self.fusion = self._check_fusion(fusion)

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

    def _set_end_rule(self, end_rule: str) -> None:
        """:attr:`end_rule`, one the lattice supports (its ``end_rules``)."""
        self.end_rule = self.lattice.check_end_rule(end_rule)

    def make_table(self, device: torch.device) -> Table:
        """The symbol table of :attr:`lattice` on ``device``: the tensors its arcs
        are scored and chosen with (a single softmax over the symbols, or a TDT's
        token and duration softmaxes)."""
        kind = TDTSymbolTable if self.lattice.factorised else SymbolTable
        return kind(self.lattice, self.stepper.vocab_size, device, self.end_rule)

    def table(self, device: torch.device) -> Table:
        """:meth:`make_table`, cached per device."""
        table = self._tables.get(device)
        if table is None:
            table = self._tables[device] = self.make_table(device)
        return table

    def row_arcs(
        self,
        table: Table,
        enc_proj: torch.Tensor,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> Arcs:
        """The greedy arc of A rows (every greedy search's step, frame- and
        label-looping): the joint network at the rows' nodes, the arcs the lattice
        allows there (end rule, ``max_sym_per_frame``), the best one by
        ``blank_decision`` (the table's ``best_arcs``).

        Args:
            table: The search's symbol table on the rows' device.
            enc_proj, dec_proj: (A, J) projected encoder frame and prediction output.
            frame: (A,) long, t of each row (rows with ``t >= length`` are past their
                end: their arcs are to be ignored).
            length: (A,) long, T of each row.
            num_sym: (A,) long, labels already emitted at ``frame``.
            lm_labels: (A, V) float32 weighted LM scores of every token as the next
                label (0 at the blanks), or None without an LM.

        Returns:
            :class:`~espnet_multiblank.decoding.arcs.Arcs` of shape (A,).
        """
        scores = table.step_scores(self.stepper, enc_proj, dec_proj, lm_labels)
        return table.best_arcs(
            scores, frame, length, num_sym, self.max_sym_per_frame, self.blank_decision
        )

    def beam_candidates(
        self,
        table: Table,
        enc_proj: torch.Tensor,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> Arcs:
        """The N candidate arcs of each of A hypotheses (every beam search's
        expansion; the table's ``beam_candidates``). Arguments as for
        :meth:`row_arcs` (``frame`` < ``length``).

        Returns:
            :class:`~espnet_multiblank.decoding.arcs.Arcs` of shape (A, N); ``score``
            is -inf where the arc is not allowed.
        """
        scores = table.step_scores(self.stepper, enc_proj, dec_proj, lm_labels)
        return table.beam_candidates(
            scores, frame, length, num_sym, self.max_sym_per_frame, self.blank_decision
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


class FrameLoopingGreedySearch(TransducerSearch):
    """What the frame-looping greedy searches share (multi-blank and TDT): one
    utterance at a time with :meth:`search_one`, and B at once with
    :meth:`search_batch`, which takes one step for every active utterance per
    iteration: one joint call, :meth:`TransducerSearch.row_arcs` for every row,
    one prediction-network call for the rows that emitted a label; each utterance
    advances by its own number of frames and leaves when it reaches its T_b.

    Args: those of :class:`TransducerSearch` (``nbest`` is 1), ``blank_decision``
    (``"total"`` or ``"symbol"``, see
    :mod:`~espnet_multiblank.decoding.tables`) and ``end_rule`` (one of the
    lattice's ``end_rules``: ``"exact"``, or for a TDT ``"clip"``, see
    :mod:`~espnet_multiblank.decoding.tables`).
    """

    batched = True

    def __init__(
        self,
        stepper: Stepper,
        lattice: Lattice,
        max_sym_per_frame: int = 10,
        blank_decision: str = "total",
        fusion: Optional[ShallowFusion] = None,
        end_rule: str = "exact",
    ):
        super().__init__(
            stepper, lattice, max_sym_per_frame=max_sym_per_frame, fusion=fusion
        )
        self.beam_size = 1
        self.blank_decision = check_blank_decision(blank_decision)
        self._set_end_rule(end_rule)

    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        return [self.search_one(enc_out)]

    def search_one(self, enc_out: torch.Tensor) -> Hypothesis:
        """Greedy search for one utterance (a plain Python loop: no batch overhead).

        Args:
            enc_out: (T, D_enc) encoder output.
        """
        return self.search_one_projected(self.stepper.project_enc(enc_out))

    @torch.no_grad()
    def search_one_projected(self, enc_proj: torch.Tensor) -> Hypothesis:
        """:meth:`search_one` on (T, J) projected encoder frames."""
        run = self.start_one(enc_proj.device)
        self.run_one(run, enc_proj, enc_proj.size(0))
        return self.finish_one(run)

    @torch.no_grad()
    def search_projected(
        self, enc_proj: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """:meth:`search_one_projected` for each of B utterances.

        Args:
            enc_proj: (B, T_max, J) projected encoder frames.
            enc_lens: (B,) long, frames of each utterance.
        """
        return [
            self.search_one_projected(enc_proj[b, :n])
            for b, n in enumerate(enc_lens.tolist())
        ]

    def start_one(self, device: torch.device) -> OneRun:
        """The state of a one-utterance search before the first frame."""
        dec_proj, state = self.start(1, device)
        hyp = Hypothesis(score=0.0, yseq=[self.blank_id])
        return OneRun(hyp, dec_proj, state, self.start_lm(1, device))

    @abstractmethod
    def run_one(
        self, run: OneRun, enc_proj: torch.Tensor, length: int, final: bool = True
    ) -> None:
        """Take the steps of one utterance (in place) up to frame ``length``.

        Offline (``final``): ``length`` is T and the run ends at T. A stream
        (``final`` false) has received ``length`` = N frames and its T >= N is not
        known yet. A step at frame t depends on T only through ``min(T - t, R)`` (R
        + 1 for a TDT): at t <= N - R that is R whatever T is, and the step is
        taken; nearer to N, the step is taken if its arc is the one every T >= N
        gives (its score, when T changes it, is held in ``run.terms``), else the run
        stops there until more frames arrive. Each step taken is the one the whole
        utterance takes, so the run ends as offline, bit for bit.

        Args:
            run: The search's state (modified).
            enc_proj: (>= length, J) projected encoder frames.
            length: T, or the frames received N.
            final: Whether ``length`` is T.
        """

    def emit_one(
        self, run: OneRun, label: int, dec_proj, state, lm, device, keep: bool
    ) -> Tuple[torch.Tensor, Any, Any]:
        """The prediction network's output and state and the LMs' state after
        ``label`` (already appended to ``run.hyp.yseq``, emitted at frame t), from
        the stream's cache when one of its runs has computed them; ``keep``: put
        them there (t is near the last frame received)."""
        cache = run.cache
        t = run.hyp.timing[-1][0]
        key = None
        if cache is not None and t >= cache.low:
            key = tuple(run.hyp.yseq)
            got = cache.labels.get(key)
            if got is not None:
                return got[1:]
        labels = torch.full((1,), label, dtype=torch.long, device=device)
        dec_proj, state = self.stepper.step(labels, state)
        if lm is not None:
            lm = self.fusion.step(labels, lm)
        if cache is not None and keep:
            key = tuple(run.hyp.yseq) if key is None else key
            cache.put_labels(key, t, (dec_proj, state, lm))
        return dec_proj, state, lm

    def finish_one(self, run: OneRun) -> Hypothesis:
        """The end of a one-utterance search (every frame consumed): its hypothesis
        with the prediction network's state and output after the last label, and
        with an LM its state and the end-of-sentence score."""
        if run.terms:
            raise ValueError("the run has not ended (run_one with final=True)")
        hyp = run.hyp
        hyp.dec_state = run.state
        hyp.dec_proj = run.dec_proj[0]
        if run.lm is not None:
            hyp.score += float(run.lm.end[0])
            hyp.lm_state = run.lm
        return hyp

    @torch.no_grad()
    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """Greedy search for B utterances at once (the same symbols as
        :meth:`search_one`, tested).

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b.

        Returns:
            B hypotheses, in input order.
        """
        device = enc_out.device
        table = self.table(device)
        stepper = self.stepper
        B = enc_out.size(0)
        lens = enc_lens.to(device=device, dtype=torch.long)
        enc_proj = stepper.project_enc(enc_out)  # (B, T_max, J)
        dec_proj, state = self.start(B, device)  # (B, J)
        lm = self.start_lm(B, device)
        fusion = self.fusion
        hyps = BatchedHyps(B, device)

        active = (hyps.frame < lens).nonzero().squeeze(1)
        while active.numel() > 0:
            t = hyps.frame[active]  # (A,)
            arcs = self.row_arcs(
                table,
                enc_proj[active, t],
                dec_proj[active],
                t,
                lens[active],
                hyps.num_sym[active],
                None if lm is None else lm.labels[active],
            )
            is_label = arcs.is_label
            lm_part = None
            if lm is not None:  # timing: the labels' acoustic part
                lm_part = lm.labels[active].gather(1, arcs.symbol.unsqueeze(1))[:, 0]
            hyps.record(active, arcs.symbol, arcs.frames, arcs.score, is_label, lm_part)
            if bool(is_label.any()):
                rows = active[is_label]
                labels = arcs.symbol[is_label]
                new_proj, new_state = stepper.step(
                    labels, stepper.select_state(state, rows)
                )
                dec_proj[rows] = new_proj
                stepper.scatter_state(state, rows, new_state)
                if lm is not None:
                    fusion.scatter(
                        lm, rows, fusion.step(labels, fusion.select(lm, rows))
                    )
            active = (hyps.frame < lens).nonzero().squeeze(1)

        if lm is not None:  # every hypothesis is complete: the end of the sentence
            hyps.score += lm.end.double()
        return [
            hyps.hypothesis(
                b,
                self.blank_id,
                stepper.select_state(state, torch.tensor([b], device=device)),
                dec_proj[b],
                (
                    None
                    if lm is None
                    else fusion.select(lm, torch.tensor([b], device=device))
                ),
            )
            for b in range(B)
        ]
