"""Token-and-duration transducer (TDT) symbols as tensors, the allowed arcs, and how a
search decides between them.

Built from :class:`espnet_multiblank.lattice.TDTLattice` (the owner of the rules): the
joint network outputs ``V`` token logits (the blank at ``blank``) followed by
``D = len(durations)`` duration logits; an arc emits a token *and* a duration ``e``,
with log-probability ``tok[k] + dur[j] = log_softmax(z[:V])[k] +
log_softmax(z[V:])[j]``. A blank takes only durations >= 1; a label takes any (0 keeps
the frame). The searches add (``docs/decoding.md``, "TDT searches"):

* **end rule** (the lattice's, as for big blanks): from frame t of an utterance with T
  frames, a blank may take ``e <= T - t`` (landing on T completes the hypothesis) and
  a label ``e < T - t`` (a label never lands on T: a blank must end the path). Only
  when a duration set without 1 leaves no allowed arc at all does the most probable
  blank take a longer duration; it then ends the hypothesis (clipped at T).
* **guard**: once ``max_sym_per_frame`` labels stayed at one frame (duration 0), a
  label must take a duration >= 1 there.
* **decision** (``blank_decision``): ``"total"``: every token counts with the total
  probability of its allowed durations (``tok[k] + logsumexp(dur[allowed])``); the
  most probable token is emitted with its most probable allowed duration, and the step
  scores that total. ``"symbol"``: the most probable allowed arc, scored with its own
  log-probability (scores are lattice path log-probabilities).
"""

from typing import Tuple

import torch

from espnet_multiblank.decoding.arcs import Arcs
from espnet_multiblank.lattice import TDTLattice

#: ``end_rule`` values: the lattice's (default) or clip every arc at T
END_RULES = ("exact", "clip")


class TDTSymbolTable:
    """Durations and masks of a TDT lattice on one device.

    Args:
        lattice: The lattice.
        vocab_size: ``V + D``, the joint network's output size.
        device: Where the tensors live.
        end_rule: ``"exact"`` (the lattice's end rule, module docstring) or
            ``"clip"`` (every duration allowed; an arc that reaches or passes T ends
            the hypothesis, as NeMo's TDT greedy search does).

    Attributes:
        num_tokens: V.
        num_durations: D.
        durations: (D,) long, frames of duration slot ``j``; ``durations_list`` the
            same as a list.
        moves: (D,) bool, slots with a duration >= 1 (the blank's slots).
        max_frames: The longest duration.
    """

    def __init__(
        self,
        lattice: TDTLattice,
        vocab_size: int,
        device: torch.device,
        end_rule: str = "exact",
    ):
        lattice.check_vocab_size(vocab_size)
        if end_rule not in END_RULES:
            raise ValueError(f"end_rule must be one of {END_RULES}, got {end_rule!r}")
        self.lattice = lattice
        self.end_rule = end_rule
        self.blank = lattice.blank
        self.num_durations = lattice.num_durations
        self.num_tokens = vocab_size - self.num_durations
        durations = torch.tensor(lattice.durations, dtype=torch.long)
        self.durations = durations.to(device)
        self.durations_list = list(lattice.durations)
        self.moves = self.durations >= 1
        self.max_frames = lattice.max_frames
        label = torch.zeros(self.num_tokens)
        label[self.blank] = float("-inf")
        self.label_mask = label.to(device)  # (V,), -inf on the blank
        # allowed() as a lookup for best_arcs(): the masks depend only on the guard and
        # on min(T - t, R + 1); row g * (R + 1) + r - 1, (blank, label) x D additive
        R1 = self.max_frames + 1
        room = torch.arange(1, R1 + 1, device=device).repeat(2)
        guard = torch.arange(2 * R1, device=device) >= R1
        ok = torch.stack(self.allowed(room, guard), 1)  # (2 (R + 1), 2, D)
        self._mask_rows = torch.zeros(ok.shape, device=device).masked_fill(
            ~ok, float("-inf")
        )
        # column of each token in (blank, label) pairs
        self._token_kind = torch.ones(self.num_tokens, dtype=torch.long, device=device)
        self._token_kind[self.blank] = 0

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

    def allowed(
        self, room: torch.Tensor, guard: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Which durations the blank and the labels may take (module docstring).

        Args:
            room: (A,) long, frames left ``T - t`` (>= 1).
            guard: (A,) bool, rows whose labels must move.

        Returns:
            (A, D) bool for the blank, (A, D) bool for every label.
        """
        e = self.durations.unsqueeze(0)  # (1, D)
        moves = self.moves.unsqueeze(0)
        stay_ok = ~guard.unsqueeze(1) | moves  # (A, D)
        if self.end_rule == "clip":
            return moves.expand_as(stay_ok), stay_ok
        room = room.unsqueeze(1)
        blank_ok = moves & (e <= room)
        label_ok = stay_ok & (e < room)
        # no allowed arc (only with durations sets without 1): any blank, clipped
        stuck = ~(blank_ok.any(1) | label_ok.any(1))
        return blank_ok | (stuck.unsqueeze(1) & moves), label_ok

    def _duration_parts(self, dur, blank_ok, label_ok, decision):
        """Per row, the blank's and the labels' duration term and best slot."""
        neg = torch.tensor(float("-inf"), dtype=dur.dtype, device=dur.device)
        blank_dur = torch.where(blank_ok, dur, neg)
        label_dur = torch.where(label_ok, dur, neg)
        blank_j = blank_dur.argmax(-1)
        label_j = label_dur.argmax(-1)
        if decision == "total":
            return blank_dur.logsumexp(-1), blank_j, label_dur.logsumexp(-1), label_j
        return blank_dur.max(-1)[0], blank_j, label_dur.max(-1)[0], label_j

    def best_arcs(
        self,
        tok: torch.Tensor,
        dur: torch.Tensor,
        room: torch.Tensor,
        guard: torch.Tensor,
        decision: str,
    ) -> Arcs:
        """The arc each row emits (greedy search; module docstring). A tie between
        tokens goes to the lower index.

        Args:
            tok: (A, V) float32 token log-probabilities (with an LM, the fused scores:
                the labels' log-probabilities plus the LM's).
            dur: (A, D) duration log-probabilities.
            room: (A,) long, frames left ``T - t`` (>= 1).
            guard: (A,) bool, rows whose labels must move.
            decision: ``"total"`` or ``"symbol"``.
        """
        R1 = self.max_frames + 1
        which = room.clamp(1, R1) - 1 + R1 * guard.long()
        masked = dur.unsqueeze(1) + self._mask_rows[which]  # (A, 2, D): blank, label
        slots = masked.argmax(-1)  # (A, 2)
        if decision == "total":
            values = masked.logsumexp(-1)
        else:
            values = masked.gather(2, slots.unsqueeze(2)).squeeze(2)
        # each token with its kind's duration term (blank: column 0, labels: 1)
        score, symbol = (tok + values[:, self._token_kind]).max(-1)
        is_label = symbol != self.blank
        slot = slots.gather(1, is_label.long().unsqueeze(1)).squeeze(1)
        frames = torch.minimum(self.durations[slot], room)
        return Arcs(symbol, frames, score, is_label)

    def candidates(
        self,
        tok: torch.Tensor,
        dur: torch.Tensor,
        room: torch.Tensor,
        guard: torch.Tensor,
        decision: str,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every candidate of each row (beam search), -inf where not allowed.

        ``"symbol"``: one candidate per arc (token k, slot j), N = V * D, scored
        ``tok[k] + dur[j]``. ``"total"``: one per token, N = V, scored with the token's
        total over its allowed durations and placed at its most probable one.

        Args: see :meth:`best_arcs`.

        Returns:
            (A, N) scores, (A, N) long tokens, (A, N) long slots.
        """
        A, V = tok.shape
        D = self.num_durations
        blank_ok, label_ok = self.allowed(room, guard)
        neg = torch.tensor(float("-inf"), dtype=dur.dtype, device=dur.device)
        if decision == "symbol":
            is_blank = torch.zeros(V, dtype=torch.bool, device=tok.device)
            is_blank[self.blank] = True
            ok = torch.where(
                is_blank.view(1, V, 1), blank_ok.unsqueeze(1), label_ok.unsqueeze(1)
            )  # (A, V, D)
            scores = torch.where(ok, tok.unsqueeze(2) + dur.unsqueeze(1), neg)
            tokens = torch.arange(V, device=tok.device).repeat_interleave(D)
            slots = torch.arange(D, device=tok.device).repeat(V)
            return scores.view(A, V * D), tokens.expand(A, -1), slots.expand(A, -1)
        b_val, b_j, l_val, l_j = self._duration_parts(dur, blank_ok, label_ok, decision)
        scores = tok + l_val.unsqueeze(1)  # (A, V)
        scores[:, self.blank] = tok[:, self.blank] + b_val
        slots = l_j.unsqueeze(1).repeat(1, V)
        slots[:, self.blank] = b_j
        tokens = torch.arange(V, device=tok.device).expand(A, -1)
        return scores, tokens, slots
