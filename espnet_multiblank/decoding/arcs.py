"""The arcs a search step chooses from or takes: one type for every lattice and
search."""

from typing import NamedTuple

import torch


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


#: the candidates of a beam expansion: (A, N) :class:`Arcs` (the former name)
BeamCandidates = Arcs
