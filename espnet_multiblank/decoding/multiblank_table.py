"""Per-vocabulary tensors of a multi-blank lattice, which symbols a search allows, and
how it decides between a blank and a label.

Built from :class:`espnet_multiblank.lattice.MultiblankLattice` (the owner of the
symbol rules): the standard blank covers 1 frame, big blank ``i`` (index
``blank - 1 - i``) covers ``d_i`` frames, every other symbol is a label (0 frames).

Blank decisions (``docs/decoding.md``, "Blank or label"):

* ``"total"``: a step is a blank when the allowed blanks together are at least as
  probable as the best label, and then the most probable allowed blank; its score is
  the blanks' total log-probability. A multi-blank model spreads the blank mass over
  several durations, so a label can beat every single blank while the blanks
  together beat the label; the arg-max over symbols then emits that label (most often
  a repeated or extra last word).
* ``"symbol"``: the arg-max over all allowed symbols, scored with that symbol's
  log-probability (the paper's and ESPnet's greedy rule): scores are lattice path
  log-probabilities.
"""

import math
from typing import Dict, List, Tuple

import torch

from espnet_multiblank.decoding.arcs import Arcs
from espnet_multiblank.lattice import MultiblankLattice

#: ``blank_decision`` values (module docstring)
BLANK_DECISIONS = ("total", "symbol")


def check_blank_decision(value) -> str:
    if value not in BLANK_DECISIONS:
        raise ValueError(
            f"blank_decision must be one of {list(BLANK_DECISIONS)}, got {value!r}"
        )
    return value


def log_sum_exp(values: List[float]) -> float:
    """log(sum(exp(values))) of a short Python list (-inf when all are -inf)."""
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum([math.exp(v - top) for v in values]))


class SymbolTable:
    """Frames covered by each symbol, as tensors on one device, and the masks.

    Args:
        lattice: The lattice.
        vocab_size: V, the joint network's output size.
        device: Where the tensors live.

    Attributes:
        frames: (V,) long, frames covered by each symbol (0 for labels);
            ``frames_list`` is the same as a Python list.
        is_label: (V,) bool.
        blank_index: (N + 1,) long, every blank: the standard blank, then big blank
            0, 1, ...; ``blank_index_list`` as a Python list.
        blank_range: ``(lo, hi)``: the blanks are the indices ``lo .. hi - 1``.
        big_ids: (N,) long, index of big blank i.
        durations: (N,) long, d_i.
        max_frames: The most frames one symbol covers.
    """

    def __init__(
        self, lattice: MultiblankLattice, vocab_size: int, device: torch.device
    ):
        lattice.check_vocab_size(vocab_size)
        self.lattice = lattice
        self.vocab_size = vocab_size
        self.frames = torch.zeros(vocab_size, dtype=torch.long, device=device)
        for symbol, n in lattice.blank_moves:
            self.frames[symbol] = n
        self.big_ids = torch.tensor(
            lattice.big_blank_ids, dtype=torch.long, device=device
        )
        self.durations = torch.tensor(
            lattice.big_blank_durations, dtype=torch.long, device=device
        )
        self.is_label = self.frames == 0
        self.frames_list: List[int] = self.frames.tolist()
        self.max_frames = lattice.max_frames
        self.blank_index = torch.tensor(
            lattice.blank_ids, dtype=torch.long, device=device
        )
        self.blank_index_list: List[int] = list(lattice.blank_ids)
        # the blanks are the contiguous indices blank - N .. blank
        self.blank_range = (lattice.blank - lattice.num_big_blanks, lattice.blank + 1)
        self._mask_rows: Dict[int, torch.Tensor] = {}

    def mask(
        self,
        logp: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        max_sym: int,
    ) -> torch.Tensor:
        """Set the log-probability of the symbols a search may not emit to -inf.

        Not allowed: labels once ``max_sym`` labels were emitted at this frame, and big
        blank ``i`` where ``frame + d_i > length`` (a path ends exactly on T, as in
        the loss). The standard blank is always allowed.

        Args:
            logp: (A, V) log-probabilities (not modified).
            frame: (A,) long, current frame t of each row.
            length: (A,) long, T of each row.
            num_sym: (A,) long, labels already emitted at ``frame``.
            max_sym: Labels allowed per frame.

        Returns:
            (A, V) masked copy.
        """
        neg = torch.tensor(float("-inf"), dtype=logp.dtype, device=logp.device)
        out = torch.where(
            (num_sym >= max_sym).unsqueeze(1) & self.is_label.unsqueeze(0), neg, logp
        )
        if self.big_ids.numel():
            over = (frame.unsqueeze(1) + self.durations.unsqueeze(0)) > (
                length.unsqueeze(1)
            )
            out[:, self.big_ids] = torch.where(over, neg, out[:, self.big_ids])
        return out

    def blank_total(self, masked: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Total log-probability of the allowed blanks and the most probable one.

        Args:
            masked: (A, V) log-probabilities, disallowed symbols at -inf.

        Returns:
            (A,) log-sum-exp over the blanks, (A,) long index of the best blank.
        """
        blanks = masked[:, self.blank_index]  # (A, N + 1)
        return torch.logsumexp(blanks, -1), self.blank_index[blanks.argmax(-1)]

    def decide(
        self, logp: torch.Tensor, masked: torch.Tensor, blank_decision: str
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The symbol each row emits, and its score (module docstring).

        Args:
            logp: (A, V) log-probabilities.
            masked: (A, V) the same with disallowed symbols at -inf.
            blank_decision: ``"total"`` or ``"symbol"``.

        Returns:
            (A,) long symbols, (A,) their scores (``logp``'s dtype).
        """
        k = masked.argmax(dim=-1)
        if blank_decision == "symbol":
            return k, logp.gather(1, k.unsqueeze(1)).squeeze(1)
        total, best_blank = self.blank_total(masked)
        label_lp = logp.gather(1, k.unsqueeze(1)).squeeze(1)
        is_label = self.is_label[k] & (label_lp > total)
        k = torch.where(is_label, k, best_blank)
        return k, torch.where(is_label, label_lp, total)

    def mask_rows(self, max_sym: int) -> torch.Tensor:
        """:meth:`mask` as a lookup (cached per ``max_sym``).

        The mask of a row depends only on whether the guard holds (``num_sym >=
        max_sym``) and on the frames left, ``T - t``, up to the longest blank: row
        ``g * (R + 1) + r`` (``R = max_frames``) is the mask of a row with guard ``g``
        and ``min(T - t, R) = r`` frames left, taken from :meth:`mask` itself.

        Returns:
            (2 (R + 1), V) additive masks: 0 where allowed, -inf where not.
        """
        rows = self._mask_rows.get(max_sym)
        if rows is None:
            device = self.frames.device
            R = self.max_frames
            left = torch.arange(R + 1, device=device).repeat(2)
            n = left.numel()
            guard = torch.arange(n, device=device) > R
            rows = self.mask(
                torch.zeros(n, self.vocab_size, device=device),
                frame=R - left,
                length=torch.full((n,), R, device=device),
                num_sym=guard.long() * max_sym,
                max_sym=max_sym,
            )
            self._mask_rows[max_sym] = rows
        return rows

    def best_arcs(
        self,
        logp: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        max_sym: int,
        blank_decision: str,
    ) -> Arcs:
        """The greedy step of each row: the allowed symbol it emits (:meth:`decide`).

        Args:
            logp: (A, V) float32 log-probabilities of the row's node (with an LM, the
                fused scores: the labels' log-probabilities plus the LM's).
            frame: (A,) long, t of each row (rows with ``t >= length`` are past their
                end: their arcs are to be ignored).
            length: (A,) long, T of each row.
            num_sym: (A,) long, labels already emitted at ``frame``.
            max_sym: Labels allowed per frame.
            blank_decision: ``"total"`` or ``"symbol"``.
        """
        R = self.max_frames
        which = (length - frame).clamp(0, R) + (R + 1) * (num_sym >= max_sym)
        masked = logp + self.mask_rows(max_sym)[which]
        symbol, score = self.decide(logp, masked, blank_decision)
        frames = self.frames[symbol]
        return Arcs(symbol, frames, score, frames == 0)
