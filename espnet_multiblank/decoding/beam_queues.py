"""The frame queues of the batched beam search, as tensors.

Utterance b of a batch stands at its frame t_b; its hypotheses are queued at the
frames t_b .. t_b + R (R: the most frames one arc covers), a ring of Q = R + 1 slots
(frame t in slot ``t % Q``). A slot holds the K best hypotheses of its frame: score
(float64, -inf when empty), label-sequence key, and ``meta`` = (last label's node,
packed statistics). Row ``(b Q + q) K + k`` of every ``(B, Q, K)`` tensor is also the
row of the hypothesis's prediction-network and LM state in the search's store.

The one-utterance search keeps every hypothesis of a frame and expands the K best; a
hypothesis outside them can still be raised into them by a later alignment of the
same labels (the scores are log-added). So a hypothesis that leaves a frame's K
slots, or never gets one, goes to the frame's overflow (score, key, meta: no state),
where a newcomer with the same labels finds it: the newcomer takes the summed score
(and the better alignment's meta) and, its state being that of the same labels,
competes for a slot. A frame's overflow is dropped when the frame is taken up: its
hypotheses are not among the K best.

Keys: a polynomial hash of the label sequence modulo 2^64 (int64 arithmetic wraps);
two different label sequences share a key with probability about 2^-64 per pair.
Statistics: big-blank emissions << 32 | frames skipped.

Notation: B utterances, Q slots, K beam, M overflow capacity per frame.
"""

from typing import Tuple

import torch

NEG = float("-inf")
#: multiplier of the label-sequence hash (odd: every key is reachable)
KEY_MULT = 0x5851F42D4C957F2D
#: ``meta`` columns
NODE, STATS = 0, 1
#: statistics: big-blank emissions in the high 32 bits, frames skipped in the low
BIG_SHIFT = 32


def extend_key(key: torch.Tensor, symbol: torch.Tensor) -> torch.Tensor:
    """The key of a label sequence extended by ``symbol`` (same shapes, long)."""
    return key * KEY_MULT + (symbol + 1)


def stats_increment(frames: torch.Tensor, is_label: torch.Tensor) -> torch.Tensor:
    """Packed statistics of arcs covering ``frames`` frames: frames skipped
    (``frames - 1``) and, for a blank over more than one frame, a big-blank
    emission."""
    big = (~is_label & (frames > 1)).long() << BIG_SHIFT
    return big + (frames - 1).clamp(min=0)


def merge_equal(
    mask: torch.Tensor, score: torch.Tensor, key: torch.Tensor, place: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge the hypotheses ``mask`` of each utterance that carry the same labels to
    the same place into the first of them (the best: the candidates are sorted).

    Args:
        mask: (B, K) bool, the hypotheses that may merge.
        score: (B, K) float64, sorted best first per utterance.
        key: (B, K) long, label-sequence keys.
        place: (B, K) long, where each goes (a frame, a queue).

    Returns:
        (B, K) bool, the hypotheses of ``mask`` that are first of their group, and
        the scores with each first one's group log-added (the others unchanged).
    """
    same = (
        mask.unsqueeze(2)
        & mask.unsqueeze(1)
        & (key.unsqueeze(2) == key.unsqueeze(1))
        & (place.unsqueeze(2) == place.unsqueeze(1))
    )  # (B, K, K)
    first = mask & (
        same.long().argmax(2) == torch.arange(mask.size(1), device=mask.device)
    )
    merged = torch.logsumexp(torch.where(same, score.unsqueeze(1), NEG), 2)
    return first, torch.where(first, merged, score)


def unpack_stats(stats: int) -> Tuple[int, int]:
    """(big-blank emissions, frames skipped) of packed statistics."""
    return stats >> BIG_SHIFT, stats & ((1 << BIG_SHIFT) - 1)


class FrameQueues:
    """The queues of B utterances (module docstring).

    Args:
        batch: B.
        slots: Q.
        beam: K.
        overflow: First capacity M of a frame's overflow (doubled when full).
        device: Where the tensors live.
        merge_in_step: Whether two newcomers of one step can carry the same labels to
            the same frame (then they are merged first).
    """

    def __init__(
        self,
        batch: int,
        slots: int,
        beam: int,
        overflow: int,
        device: torch.device,
        merge_in_step: bool,
    ):
        B, Q, K = batch, slots, beam
        self.B, self.Q, self.K = B, Q, K
        self.device = device
        self.merge_in_step = merge_in_step
        self.score = torch.full((B, Q, K), NEG, dtype=torch.float64, device=device)
        self.key = torch.zeros(B, Q, K, dtype=torch.long, device=device)
        self.meta = torch.zeros(B, Q, K, 2, dtype=torch.long, device=device)
        self.meta[..., NODE] = -1
        self.o_score = torch.full(
            (B, Q, overflow), NEG, dtype=torch.float64, device=device
        )
        self.o_key = torch.zeros(B, Q, overflow, dtype=torch.long, device=device)
        self.o_meta = torch.zeros(B, Q, overflow, 2, dtype=torch.long, device=device)
        self.o_count = torch.zeros(B, Q, dtype=torch.long, device=device)
        self.queue_ids = torch.arange(B * Q, device=device).view(B, Q)
        self.slot_ids = torch.arange(Q, device=device).view(1, Q, 1)
        self.beam_ids = torch.arange(K, device=device)

    def rows(self, queue: torch.Tensor) -> torch.Tensor:
        """(..., K) store rows of the slots of queues ``queue`` (flat ``b Q + q``)."""
        return queue.unsqueeze(-1) * self.K + self.beam_ids

    def insert(
        self,
        ins: torch.Tensor,
        queue: torch.Tensor,
        score: torch.Tensor,
        key: torch.Tensor,
        meta: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Queue the newcomers ``ins`` of every utterance.

        Args:
            ins: (B, K) bool, the newcomers.
            queue: (B, K) long, their queue ``b Q + (t % Q)``.
            score: (B, K) float64, their scores (sorted, best first, per utterance).
            key: (B, K) long, their label-sequence keys.
            meta: (B, K, 2) long, their node and statistics.

        Returns:
            (B, K) bool, the newcomers that took a slot, and (B, K) long, their store
            rows (their states are to be written there).
        """
        B, Q, K = self.B, self.Q, self.K
        # a merge keeps the better alignment's meta: the newcomer's own score decides,
        # as when the one-utterance search inserts them one by one
        single = score
        score, meta = score.clone(), meta.clone()
        if self.merge_in_step:
            ins = self._merge_siblings(ins, queue, score, key)
        slot_score = self.score.view(B * Q, K)[queue]  # (B, K, K)
        hit = (
            ins.unsqueeze(2)
            & (self.key.view(B * Q, K)[queue] == key.unsqueeze(2))
            & (slot_score > NEG)
        )
        has = hit.any(2)
        if bool(has.any()):  # merged into a hypothesis in the slots
            rows = (queue * K + hit.long().argmax(2))[has]
            old = self.score.view(-1)[rows]
            better = (single[has] > old).unsqueeze(1)
            self.score.view(-1)[rows] = torch.logaddexp(old, score[has])
            flat = self.meta.view(-1, 2)
            flat[rows] = torch.where(better, meta[has], flat[rows])
            ins = ins & ~has
        if bool(self.o_count.any()):
            self._merge_overflow(ins, queue, single, score, key, meta)

        # the K best of a frame's slots and its newcomers keep (or get) a slot
        ring = queue - self.queue_ids[:, :1]  # (B, K) slot q
        onehot = (ring.unsqueeze(1) == self.slot_ids) & ins.unsqueeze(1)  # (B, Q, K)
        new_score = torch.where(onehot, score.unsqueeze(1), NEG)
        both = torch.cat([self.score, new_score], 2)  # (B, Q, 2K)
        best, which = both.topk(K, dim=2)
        chosen = torch.zeros_like(both, dtype=torch.bool)
        chosen.scatter_(2, which, best > NEG)
        keep, admit = chosen[..., :K], chosen[..., K:]
        evicted = (self.score > NEG) & ~keep
        rejected = onehot & ~admit
        if bool((evicted | rejected).any()):
            new_key = torch.where(onehot, key.unsqueeze(1), 0)
            new_meta = torch.where(onehot.unsqueeze(3), meta.unsqueeze(1), 0)
            self._spill(evicted, rejected, new_score, new_key, new_meta)
            self.score.masked_fill_(evicted, NEG)
        # the i-th admitted newcomer of a frame takes its i-th free slot
        rank = (admit.long().cumsum(2) - 1).clamp(min=0)
        free = keep.long().argsort(dim=2, stable=True)  # free slots first
        slot = (free.gather(2, rank) * admit).sum(1)  # (B, K)
        admitted = admit.any(1)
        dest = queue * K + slot
        self.write(dest[admitted], score[admitted], key[admitted], meta[admitted])
        return admitted, dest

    def write(self, rows, score, key, meta) -> None:
        """Slot rows ``rows`` ((n,)) get ``score``, ``key`` ((n,)) and ``meta``
        ((n, 2))."""
        self.score.view(-1)[rows] = score
        self.key.view(-1)[rows] = key
        self.meta.view(-1, 2)[rows] = meta

    def _merge_siblings(self, ins, queue, score, key) -> torch.Tensor:
        """Merge newcomers of one utterance bound for the same frame with the same
        labels into the first (the best), whose meta is kept; ``score`` in place.
        Returns the newcomers left."""
        leader, merged = merge_equal(ins, score, key, queue)
        score.copy_(merged)
        return leader

    def _merge_overflow(self, ins, queue, single, score, key, meta) -> None:
        """Newcomers with the labels of a hypothesis in their frame's overflow take
        it out: the summed score, the better alignment's meta (in place)."""
        M = self.o_score.size(2)
        o_rows = queue.unsqueeze(2) * M + torch.arange(M, device=self.device)
        hit = (
            ins.unsqueeze(2)
            & (self.o_key.view(-1)[o_rows] == key.unsqueeze(2))
            & (self.o_score.view(-1)[o_rows] > NEG)
        )  # (B, K, M)
        has = hit.any(2)
        if not bool(has.any()):
            return
        rows = o_rows.gather(2, hit.long().argmax(2, keepdim=True)).squeeze(2)[has]
        old = self.o_score.view(-1)[rows]
        keep_old = (old >= single[has]).unsqueeze(1)
        score[has] = torch.logaddexp(old, score[has])
        meta[has] = torch.where(keep_old, self.o_meta.view(-1, 2)[rows], meta[has])
        self.o_score.view(-1)[rows] = NEG

    def _spill(self, evicted, rejected, new_score, new_key, new_meta) -> None:
        """Append the hypotheses that left (``evicted``, (B, Q, K)) or did not get
        (``rejected``) a frame's slots to the frame's overflow."""
        out = torch.cat([evicted, rejected], 2)  # (B, Q, 2K)
        count = out.long().sum(2)
        need = int((self.o_count + count).max())
        if need > self.o_score.size(2):
            self._grow(need)
        M = self.o_score.size(2)
        pos = self.o_count.unsqueeze(2) + out.long().cumsum(2) - 1
        rows = (self.queue_ids.unsqueeze(2) * M + pos)[out]
        self.o_score.view(-1)[rows] = torch.cat([self.score, new_score], 2)[out]
        self.o_key.view(-1)[rows] = torch.cat([self.key, new_key], 2)[out]
        self.o_meta.view(-1, 2)[rows] = torch.cat([self.meta, new_meta], 2)[out]
        self.o_count += count

    def _grow(self, need: int) -> None:
        M = self.o_score.size(2)
        while M < need:
            M *= 2
        for name, fill in (("o_score", NEG), ("o_key", 0), ("o_meta", 0)):
            old = getattr(self, name)
            new = old.new_full((self.B, self.Q, M) + old.shape[3:], fill)
            new[:, :, : old.size(2)] = old
            setattr(self, name, new)

    def take_up(self, queue: torch.Tensor) -> None:
        """Frames taken up (queues ``queue``, (n,)): their overflow is dropped."""
        self.o_score.view(self.B * self.Q, -1)[queue] = NEG
        self.o_count.view(-1)[queue] = 0

    def entries(self, queue: torch.Tensor):
        """Everything queued in ``queue`` ((B,), one per utterance), as Python lists
        per utterance: (score, node, stats, store row or -1 in the overflow)."""
        B, Q, K = self.B, self.Q, self.K
        M = self.o_score.size(2)
        score = torch.cat(
            [
                self.score.view(B * Q, K)[queue],
                self.o_score.view(B * Q, M)[queue],
            ],
            1,
        )
        meta = torch.cat(
            [self.meta.view(B * Q, K, 2)[queue], self.o_meta.view(B * Q, M, 2)[queue]],
            1,
        )
        rows = torch.cat([self.rows(queue), torch.full_like(score, -1).long()], 1)
        out = []
        for s, m, r in zip(score.tolist(), meta.tolist(), rows.tolist()):
            out.append(
                [(x, n, st, row) for x, (n, st), row in zip(s, m, r) if x != NEG]
            )
        return out
