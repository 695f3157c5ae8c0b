"""The per-row decoding step of each lattice kind, defined once for every search.

A greedy step of a row (an utterance, or an utterance's frame in a label-looping
window) evaluates the joint network at the row's node, turns the output into the
scores of the arcs the lattice allows there and takes the best one
(``blank_decision``). Frame-looping greedy search
(:class:`~espnet_multiblank.decoding.base.FrameLoopingGreedySearch`) and
label-looping greedy search
(:class:`~espnet_multiblank.decoding.label_looping.LabelLoopingGreedySearch`) call
:meth:`row_arcs` of the mixin of their lattice kind; the beam searches share the
mixin's lattice type and symbol table.

* :class:`MultiblankRowStep`: standard and multi-blank lattices
  (:class:`~espnet_multiblank.decoding.multiblank_table.SymbolTable.best_arcs`);
* :class:`TDTRowStep`: token-and-duration lattices
  (:class:`~espnet_multiblank.decoding.tdt_table.TDTSymbolTable.best_arcs`).
"""

from typing import Optional

import torch

from espnet_multiblank.decoding.arcs import Arcs
from espnet_multiblank.decoding.multiblank_table import SymbolTable
from espnet_multiblank.decoding.tdt_table import END_RULES, TDTSymbolTable
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice


class MultiblankRowStep:
    """Standard and multi-blank lattices: the joint network's log-softmax, masked by
    the lattice (end rule, ``max_sym_per_frame``), decided by ``blank_decision``."""

    lattice_types = (MultiblankLattice,)

    def row_arcs(
        self,
        table: SymbolTable,
        enc_proj: torch.Tensor,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> Arcs:
        """The greedy arc of A rows.

        Args:
            table: The search's symbol table on the rows' device.
            enc_proj, dec_proj: (A, J) projected encoder frame and prediction output.
            frame: (A,) long, t of each row (rows with ``t >= length`` are past their
                end: their arcs are to be ignored).
            length: (A,) long, T of each row.
            num_sym: (A,) long, labels already emitted at ``frame``.
            lm_labels: (A, V) float32 weighted LM scores of every symbol as the next
                label (0 at the blanks), or None without an LM.
        """
        logp = self.stepper.log_probs(enc_proj, dec_proj)  # (A, V) float32
        if lm_labels is not None:
            logp = logp + lm_labels
        return table.best_arcs(
            logp, frame, length, num_sym, self.max_sym_per_frame, self.blank_decision
        )


class TDTRowStep:
    """Token-and-duration lattices: token and duration log-softmax, the allowed
    durations (end rule, guard), decided by ``blank_decision``.

    Attributes:
        end_rule: ``"exact"`` (the lattice's) or ``"clip"``
            (:class:`~espnet_multiblank.decoding.tdt_table.TDTSymbolTable`).
    """

    lattice_types = (TDTLattice,)
    end_rule = "exact"

    def _set_end_rule(self, end_rule: str) -> None:
        if end_rule not in END_RULES:
            raise ValueError(f"end_rule must be one of {END_RULES}, got {end_rule!r}")
        self.end_rule = end_rule

    def make_table(self, device: torch.device) -> TDTSymbolTable:
        return TDTSymbolTable(
            self.lattice, self.stepper.vocab_size, device, end_rule=self.end_rule
        )

    def row_arcs(
        self,
        table: TDTSymbolTable,
        enc_proj: torch.Tensor,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> Arcs:
        """The greedy arc of A rows; arguments as for
        :meth:`MultiblankRowStep.row_arcs` (``lm_labels``: (A, V) over the V tokens,
        0 at the blank)."""
        tok, dur = table.log_probs(self.stepper.joint(enc_proj, dec_proj))
        if lm_labels is not None:
            tok = tok + lm_labels
        guard = num_sym >= self.max_sym_per_frame
        return table.best_arcs(tok, dur, length - frame, guard, self.blank_decision)
