"""The candidates of one beam-search expansion, per lattice kind.

The batched beam search (:mod:`~espnet_multiblank.decoding.batched_beam`) is one
algorithm for every lattice; what differs is which arcs leave a hypothesis's node and
what they score. A mixin of this module turns the joint network's output for A
hypotheses into N candidate arcs per hypothesis, with the rules of the
one-utterance beam searches (:mod:`~espnet_multiblank.decoding.beam`,
:mod:`~espnet_multiblank.decoding.tdt_beam`):

* :class:`MultiblankBeamStep` (standard and multi-blank lattices): N = V, one
  candidate per symbol, the masked log-softmax (end rule, ``max_sym_per_frame``);
  with ``blank_decision: "total"`` the blanks are replaced by one candidate, the most
  probable allowed blank scored with the allowed blanks' total;
* :class:`TDTBeamStep` (token-and-duration lattices): the candidates of
  :meth:`~espnet_multiblank.decoding.tdt_table.TDTSymbolTable.candidates` (N = V D
  with ``"symbol"``, V with ``"total"``), each moving by its duration (clipped at T).

With language models the labels' candidates carry the fused score (the blanks' LM
columns are 0).
"""

from typing import NamedTuple, Optional

import torch

from espnet_multiblank.decoding.multiblank_table import SymbolTable
from espnet_multiblank.decoding.tdt_table import TDTSymbolTable


class BeamCandidates(NamedTuple):
    """N candidate arcs for each of A hypotheses.

    Attributes:
        score: (A, N) float32, the arc's (fused) log-probability, -inf where the arc
            is not allowed.
        symbol: (A, N) long, the symbol the arc emits (a label or a blank).
        frames: (A, N) long, frames the arc moves on (0: a label that stays).
        is_label: (A, N) bool.
    """

    score: torch.Tensor
    symbol: torch.Tensor
    frames: torch.Tensor
    is_label: torch.Tensor


class MultiblankBeamStep:
    """Standard and multi-blank lattices: one candidate per symbol (module
    docstring)."""

    def beam_candidates(
        self,
        table: SymbolTable,
        enc_proj: torch.Tensor,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> BeamCandidates:
        """The candidates of A hypotheses.

        Args:
            table: The search's symbol table on the rows' device.
            enc_proj, dec_proj: (A, J) projected encoder frame and prediction output.
            frame: (A,) long, t of each hypothesis (< its T).
            length: (A,) long, T of each hypothesis's utterance.
            num_sym: (A,) long, labels it emitted at t.
            lm_labels: (A, V) float32 weighted LM scores of the next label (0 at the
                blanks), or None.
        """
        logp = self.stepper.log_probs(enc_proj, dec_proj)  # (A, V) float32
        R = table.max_frames
        guard = num_sym >= self.max_sym_per_frame
        which = (length - frame).clamp(0, R) + (R + 1) * guard.long()
        scores = logp + table.mask_rows(self.max_sym_per_frame)[which]
        if lm_labels is not None:
            scores = scores + lm_labels
        if self.blank_decision == "total":  # one blank candidate per hypothesis
            total, best_blank = table.blank_total(scores)
            scores = scores.index_fill(1, table.blank_index, float("-inf"))
            scores.scatter_(1, best_blank.unsqueeze(1), total.unsqueeze(1))
        A, V = scores.shape
        return BeamCandidates(
            scores,
            torch.arange(V, device=scores.device).expand(A, V),
            table.frames.expand(A, V),
            table.is_label.expand(A, V),
        )


class TDTBeamStep:
    """Token-and-duration lattices: (token, duration) candidates (module
    docstring)."""

    def beam_candidates(
        self,
        table: TDTSymbolTable,
        enc_proj: torch.Tensor,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> BeamCandidates:
        """The candidates of A hypotheses; arguments as for
        :meth:`MultiblankBeamStep.beam_candidates` (``lm_labels`` over the V
        tokens)."""
        tok, dur = table.log_probs(self.stepper.joint(enc_proj, dec_proj))
        if lm_labels is not None:
            tok = tok + lm_labels
        room = length - frame
        guard = num_sym >= self.max_sym_per_frame
        scores, tokens, slots = table.candidates(
            tok, dur, room, guard, self.blank_decision
        )
        frames = torch.minimum(table.durations[slots], room.unsqueeze(1))
        return BeamCandidates(scores, tokens, frames, tokens != table.blank)
