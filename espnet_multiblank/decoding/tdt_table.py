"""Token-and-duration transducer (TDT) symbols as tensors, and the allowed arcs.

Built from :class:`espnet_multiblank.lattice.TDTLattice` (the owner of the rules): the
joint network outputs ``V`` token logits (the blank at ``blank``) followed by
``D = len(durations)`` duration logits; an arc emits a token *and* a duration, with
log-probability ``log_softmax(z[:V])[k] + log_softmax(z[V:])[j]``. A blank takes only
durations >= 1; a label takes any (0 keeps the frame).

What the searches add to the lattice (``docs/decoding.md``, "TDT searches"):

* **guard**: once ``max_sym_per_frame`` labels were emitted at a frame without moving,
  a label must take a duration >= 1 there (every emission moves on);
* **end rule**: an arc from frame ``t`` with duration ``e`` covers
  ``min(e, T - t)`` frames; reaching ``T`` ends the hypothesis, whether the arc is a
  blank or a label (an overshooting duration is clipped at ``T``).
"""

from typing import Tuple

import torch

from espnet_multiblank.lattice import TDTLattice


class TDTSymbolTable:
    """Durations and masks of a TDT lattice on one device.

    Args:
        lattice: The lattice.
        vocab_size: ``V + D``, the joint network's output size.
        device: Where the tensors live.

    Attributes:
        num_tokens: V.
        num_durations: D.
        durations: (D,) long, frames of duration slot ``j``; ``durations_list`` the
            same as a list.
        moves: (D,) bool, slots with a duration >= 1 (the blank's slots).
        max_frames: The longest duration.
    """

    def __init__(self, lattice: TDTLattice, vocab_size: int, device: torch.device):
        lattice.check_vocab_size(vocab_size)
        self.lattice = lattice
        self.blank = lattice.blank
        self.num_durations = lattice.num_durations
        self.num_tokens = vocab_size - self.num_durations
        durations = torch.tensor(lattice.durations, dtype=torch.long)
        self.durations = durations.to(device)
        self.durations_list = list(lattice.durations)
        self.moves = self.durations >= 1
        self.max_frames = lattice.max_frames
        self.has_zero = 0 in lattice.durations
        neg = float("-inf")
        # additive masks: 0 where allowed, -inf where not
        stay = torch.zeros(self.num_durations)
        stay[durations == 0] = neg
        self.stay_mask = stay.to(device)  # (D,), -inf on duration 0
        label = torch.zeros(self.num_tokens)
        label[self.blank] = neg
        self.label_mask = label.to(device)  # (V,), -inf on the blank

    def log_probs(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Token and duration log-probabilities of raw joint outputs.

        Args:
            logits: (A, V + D) raw joint-network output.

        Returns:
            (A, V) token and (A, D) duration log-probabilities, float32 (decoding
            applies no sigma).
        """
        logits = logits.float()
        V = self.num_tokens
        return logits[:, :V].log_softmax(-1), logits[:, V:].log_softmax(-1)

    def best_arcs(
        self, tok: torch.Tensor, dur: torch.Tensor, guard: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The most probable allowed arc of each row (greedy search).

        Token and duration are independent, so the best label arc is the best label
        token with the best duration it may take, and the best blank arc is the blank
        with the best duration >= 1; the more probable of the two wins (a tie goes to
        the blank).

        Args:
            tok: (A, V) token log-probabilities.
            dur: (A, D) duration log-probabilities.
            guard: (A,) bool, rows whose labels must move (``max_sym_per_frame``
                labels already stayed at this frame).

        Returns:
            symbol (A,) long, duration slot (A,) long, arc log-probability (A,),
            is_label (A,) bool.
        """
        move_best, move_j = (dur + self.stay_mask).max(-1)  # durations >= 1
        if self.has_zero:
            any_best, any_j = dur.max(-1)
            label_dur = torch.where(guard, move_best, any_best)
            label_j = torch.where(guard, move_j, any_j)
        else:
            label_dur, label_j = move_best, move_j
        label_tok, label_k = (tok + self.label_mask).max(-1)
        label_score = label_tok + label_dur
        blank_score = tok[:, self.blank] + move_best
        is_label = label_score > blank_score
        symbol = torch.where(is_label, label_k, torch.full_like(label_k, self.blank))
        slot = torch.where(is_label, label_j, move_j)
        score = torch.where(is_label, label_score, blank_score)
        return symbol, slot, score, is_label

    def arc_scores(
        self, tok: torch.Tensor, dur: torch.Tensor, guard: torch.Tensor
    ) -> torch.Tensor:
        """Log-probability of every arc, -inf for those not allowed (beam search).

        Args:
            tok: (A, V) token log-probabilities.
            dur: (A, D) duration log-probabilities.
            guard: (A,) bool, see :meth:`best_arcs`.

        Returns:
            (A, V, D): ``tok[a, k] + dur[a, j]``, -inf for the blank with a duration
            0 and, in guarded rows, for every token with a duration 0.
        """
        scores = tok.unsqueeze(2) + dur.unsqueeze(1)  # (A, V, D)
        scores[:, self.blank] += self.stay_mask
        if self.has_zero and bool(guard.any()):
            scores[guard] += self.stay_mask
        return scores
