"""Frame-synchronous batched beam search (``beam_sync: frame``): the one-utterance
beam search's rule, B utterances at once.

The rule of :mod:`~espnet_multiblank.decoding.beam` (one queue of hypotheses per
frame position, keyed by the label sequence, equal label sequences merged by log-add;
the K best of a frame's queue expanded; the K best candidates of each expansion kept;
labels that stay at the frame dropped below the K-th best hypothesis queued at t + 1),
with every step working on all utterances at once, each at its own frame:

    one step, for every utterance b that has not finished:
        C_b = its hypotheses at its frame t_b (at most K)
        one joint-network call for the rows of every C_b; the K best candidates
            of each utterance (BeamRun.expand)
        one prediction-network call (and one step of the fused LMs) for every
            label kept
        blanks, big blanks and labels that move -> the queue Q_b[t_b + frames]
            (merged with an equal label sequence there, log-add)
        labels that stay at t_b -> the next C_b
        C_b empty: t_b <- the next frame whose queue holds a hypothesis; at T_b the
            utterance has finished (its n-best is Q_b[T_b]) and leaves the work

It returns, utterance by utterance, the one-utterance search's n-best lists (labels,
scores to float rounding, statistics, timing; tested). The queues are
:class:`FrameQueues`; row ``(b Q + q) K + k``
of the store holds the state of slot k of utterance b's queue q, so the current
hypotheses C_b are the slot of t_b and nothing is copied when a frame is taken up.
The number of steps is that of the utterance with the most expansions: every frame
some hypothesis of the beam stands on, times the label rounds there (about 2-3 per
frame with K = 4).

The queues (:class:`FrameQueues`), as tensors. Utterance b of a batch stands at its
frame t_b; its hypotheses are queued at the frames t_b .. t_b + R (R: the most frames
one arc covers), a ring of Q = R + 1 slots (frame t in slot ``t % Q``). A slot holds
the K best hypotheses of its frame: score (float64, -inf when empty), label-sequence
key, and ``meta`` = (last label's node, packed statistics). Row ``(b Q + q) K + k``
of every ``(B, Q, K)`` tensor is also the row of the hypothesis's prediction-network
and LM state in the search's store.

The one-utterance search keeps every hypothesis of a frame and expands the K best; a
hypothesis outside them can still be raised into them by a later alignment of the
same labels (the scores are log-added). So a hypothesis that leaves a frame's K
slots, or never gets one, goes to the frame's overflow (score, key, meta: no state),
where a newcomer with the same labels finds it: the newcomer takes the summed score
(and the better alignment's meta) and, its state being that of the same labels,
competes for a slot. A frame's overflow is dropped when the frame is taken up: its
hypotheses are not among the K best.

Notation: B utterances, Q slots, K beam, M overflow capacity per frame.
"""

from typing import Tuple

import torch

from espnet_multiblank.decoding.beam_run import (
    NEG,
    NODE,
    STATS,
    BeamRun,
    extend_key,
    merge_equal,
    stats_increment,
)


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


class FrameSyncRun(BeamRun):
    """One batch of the frame-synchronous beam search (module docstring)."""

    def __init__(self, search, enc_out: torch.Tensor, lens: torch.Tensor):
        B, K = enc_out.size(0), search.beam_size
        Q = search.table(enc_out.device).max_frames + 1
        super().__init__(search, enc_out, lens, B * Q * K)
        self.Q = Q
        # a TDT label that moves (parent y, label k) can meet the blank of the
        # parent y + k in one step (and arcs clipped at T meet there): merged first;
        # in a multi-blank lattice labels stay and blanks keep different labels
        self.queues = FrameQueues(
            B,
            Q,
            K,
            search.initial_overflow,
            self.device,
            merge_in_step=search.lattice.labels_move,
        )
        self.frame = torch.zeros(B, dtype=torch.long, device=self.device)
        self.num_sym = torch.zeros(B, K, dtype=torch.long, device=self.device)
        first = self.utts * Q * K  # slot 0 of queue (b, 0)
        root_meta = torch.tensor([[-1, 0]], device=self.device).expand(B, 2)
        self.queues.write(first, self.root_score(), torch.zeros_like(first), root_meta)

    def step(self) -> bool:
        """One expansion of every unfinished utterance; False when all finished."""
        active = ~self.done
        if not bool(active.any()):
            return False
        B, K, Q = self.B, self.K, self.Q
        qs = self.queues
        utts = self.utts.unsqueeze(1)
        queue = self.utts * Q + self.frame % Q  # (B,) the current hypotheses' queue
        current = qs.score.view(B * Q, K)[queue]  # (B, K)
        rows = qs.rows(queue)  # (B, K) their store rows
        frame = self.frame.unsqueeze(1).expand(B, K)
        ex = self.expand(
            current, frame, self.num_sym, rows, (current > NEG) & active.unsqueeze(1)
        )
        # labels that stay must reach the K-th best hypothesis queued at t + 1
        # (-inf while fewer are queued: empty slots are -inf)
        ahead = qs.score.view(B * Q, K)[self.utts * Q + (self.frame + 1) % Q]
        moved = ex.frames > 0
        ok = torch.isfinite(ex.score)
        stay = ok & ex.is_label & ~moved
        stay &= ex.score >= ahead.min(1).values.unsqueeze(1)
        move = ok & moved
        stepped = ex.is_label & (stay | move)  # one prediction step each
        p_row = rows.gather(1, ex.parent)  # (B, K) the parents' store rows
        key = qs.key.view(-1)[p_row]
        key = torch.where(stepped, extend_key(key, ex.symbol), key)
        meta = qs.meta.view(-1, 2)[p_row]  # (B, K, 2)
        meta[..., STATS] += stats_increment(ex.frames, ex.is_label)
        lab, new, ids = self.step_expanded(
            ex, stepped, p_row, qs.score, meta[..., NODE], frame
        )
        if new is not None:
            meta.view(-1, 2)[lab, NODE] = ids

        # blanks and labels that move: queued at t + frames
        target = self.frame.unsqueeze(1) + ex.frames
        score = ex.score
        if self.lm is not None:  # a hypothesis that ends: the end of the sentence
            end = self.lm.end[p_row].double()
            if new is not None:
                end.view(-1)[lab] = new[2].end.double()
            score = score + torch.where(target == self.lens.unsqueeze(1), end, 0.0)
        admitted, dest = qs.insert(move, utts * Q + target % Q, score, key, meta)
        blank_in = admitted & ~ex.is_label
        if bool(blank_in.any()):  # a blank keeps its parent's state
            self.write_state(dest[blank_in], p_row[blank_in], self.stored())
        # labels that stay: the next hypotheses of frame t
        qs.score.view(B * Q, K)[queue] = torch.where(active.unsqueeze(1), NEG, current)
        pos = stay.long().cumsum(1) - 1
        stay_row = queue.unsqueeze(1) * K + pos
        qs.write(stay_row[stay], ex.score[stay], key[stay], meta[stay])
        num_sym = self.num_sym.gather(1, ex.parent) + 1
        self.num_sym.view(-1)[(utts * K + pos)[stay]] = num_sym[stay]
        if new is not None:  # the stepped labels' states: where they went
            went = (stay | admitted).view(-1)[lab]
            dest_rows = torch.where(stay, stay_row, dest).view(-1)[lab][went]
            self.write_state(dest_rows, went.nonzero().squeeze(1), new)
        self._advance(active)
        return True

    def _advance(self, active: torch.Tensor) -> None:
        """Utterances without current hypotheses take up the next frame whose queue
        holds one; at T_b (or with none left) they finish."""
        Q = self.Q
        held = (self.queues.score > NEG).any(2)  # (B, Q)
        empty = active & ~held.gather(1, (self.frame % Q).unsqueeze(1)).squeeze(1)
        if not bool(empty.any()):
            return
        ahead = self.frame.unsqueeze(1) + torch.arange(1, Q, device=self.device)
        there = held.gather(1, ahead % Q) & (ahead <= self.lens.unsqueeze(1))
        found = there.any(1)
        nxt = self.frame + there.long().argmax(1) + 1
        go = empty & found
        self.frame = torch.where(go, nxt, self.frame)
        self.lost |= empty & ~found
        self.done |= (empty & ~found) | (go & (nxt == self.lens))
        load = go & (nxt < self.lens)
        if bool(load.any()):  # nothing stays yet; the frame's overflow is dropped
            self.queues.take_up((self.utts * Q + self.frame % Q)[load])
            self.num_sym[load] = 0

    def results(self):
        """The n-best of every utterance: its queue at T_b, ranked."""
        return self.ranked(self.queues.entries(self.utts * self.Q + self.lens % self.Q))
