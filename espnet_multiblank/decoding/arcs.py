"""A search step's rows and the arcs it chooses from or takes: one type each for
every lattice and search."""

from typing import NamedTuple, Optional

import torch


class RowNodes(NamedTuple):
    """A rows at their lattice nodes: what a step (greedy or beam) reads there.

    A node (t, y) fixes the joint network's inputs (encoder frame t, prediction
    output after y) and, with T and the labels emitted at t, the arcs allowed.

    Attributes:
        enc_proj, dec_proj: (A, J) projected encoder frame and prediction output.
        frame: (A,) long, t of each row (rows with ``t >= length`` are past their
            end: their arcs are to be ignored).
        length: (A,) long, T of each row.
        num_sym: (A,) long, labels already emitted at ``frame``.
        lm_labels: (A, V) float32 weighted LM scores of every token as the next
            label (0 at the blanks), or None without an LM.
    """

    enc_proj: torch.Tensor
    dec_proj: torch.Tensor
    frame: torch.Tensor
    length: torch.Tensor
    num_sym: torch.Tensor
    lm_labels: Optional[torch.Tensor] = None


class Arcs(NamedTuple):
    """Arcs leaving the rows' nodes: what each emits and how far it moves.

    A greedy step has one arc per row (shapes (A,), the tables' ``best_arcs``); a
    beam expansion N candidates per row (shapes (A, N), ``beam_candidates``).

    Attributes:
        symbol: long, the emitted symbol (a label or a blank).
        frames: long, frames the arc moves on (0: a label that stays), never past
            the utterance's last frame (for rows inside their utterance).
        score: float32, the arc's score (``blank_decision``; with an LM, the fused
            score); a candidate that is not allowed scores -inf.
        is_label: bool.
    """

    symbol: torch.Tensor
    frames: torch.Tensor
    score: torch.Tensor
    is_label: torch.Tensor

    def where(self, mask: torch.Tensor, other: "Arcs") -> "Arcs":
        """``self`` in the rows of ``mask`` ((A,) bool), ``other`` elsewhere."""
        return Arcs(*(torch.where(mask, a, b) for a, b in zip(self, other)))
