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
:class:`~espnet_multiblank.decoding.beam_queues.FrameQueues`; row ``(b Q + q) K + k``
of the store holds the state of slot k of utterance b's queue q, so the current
hypotheses C_b are the slot of t_b and nothing is copied when a frame is taken up.
The number of steps is that of the utterance with the most expansions: every frame
some hypothesis of the beam stands on, times the label rounds there (about 2-3 per
frame with K = 4).
"""

import torch

from espnet_multiblank.decoding.beam_queues import (
    NEG,
    NODE,
    STATS,
    FrameQueues,
    extend_key,
    stats_increment,
)
from espnet_multiblank.decoding.beam_run import BeamRun


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
