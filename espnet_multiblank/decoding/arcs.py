"""The arcs a greedy step chooses: one type for every lattice and search."""

from typing import NamedTuple

import torch


class Arcs(NamedTuple):
    """One arc per row: what a row emits at its node and how far it moves.

    Attributes:
        symbol: (A,) long, the emitted symbol (a label or a blank).
        frames: (A,) long, frames the arc moves on (0: a label that stays), never past
            the utterance's last frame (for rows inside their utterance).
        score: (A,) float32, the step's score (``blank_decision``; with an LM, the
            fused score).
        is_label: (A,) bool.
    """

    symbol: torch.Tensor
    frames: torch.Tensor
    score: torch.Tensor
    is_label: torch.Tensor

    def where(self, mask: torch.Tensor, other: "Arcs") -> "Arcs":
        """``self`` in the rows of ``mask`` ((A,) bool), ``other`` elsewhere."""
        return Arcs(*(torch.where(mask, a, b) for a, b in zip(self, other)))
