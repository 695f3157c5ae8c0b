"""Step-synchronous batched beam search (``beam_sync: step``): every hypothesis takes
one arc per step, pruned per step.

The frame-synchronous rule (:mod:`.frame_sync_beam`) expands the hypotheses frame by
frame: a beam whose hypotheses stand on different frames (a big blank or a TDT
duration parks one ahead) visits every one of those frames, two or three label rounds
each, so it takes about as many steps on a multi-blank or TDT model as on a standard
one. Here, as in the alignment-length synchronous searches (Saon et al. 2020; NeMo's
``malsd_batch``, Grigoryan et al. 2025), each step moves every hypothesis of the
beam by one arc from its own frame, so a big blank or a duration of d frames costs one
step, not d:

    beam_b = the K hypotheses of utterance b, each at its own frame t_h
    one step, for every utterance b that has not finished:
        one joint-network call for every hypothesis with t_h < T_b
        candidates of each (its lattice's arcs, ``beam_candidates``); a
            hypothesis that has reached T_b competes as it is (pinned)
        beam_b = the K best candidates of the utterance
        children that arrived at the same frame with the same labels (by a move, or
            pinned at T_b) merged: log-add, the better alignment's statistics kept
        one prediction-network call (and one step of the fused LMs) for the labels
        a hypothesis arriving at T_b adds the end-of-sentence LM score
    utterance b finishes when none of beam_b is short of T_b; its n-best: beam_b

What differs from the frame-synchronous rule: hypotheses standing on different frames
(with different numbers of arcs behind them) compete for the K places of a step, and
equal label sequences merge only when they reach the same frame in the same step (or
at T_b); a label that stays is not held to the K-th best hypothesis of t + 1. With
K = 1 it is the greedy search (the same ``blank_decision``); with a beam that prunes
nothing every path survives and every label sequence gets its exact probability
(tested against exhaustive enumeration). The number of steps is about the arcs of the
longest path kept: frames / (frames per blank) + labels.
"""

import torch

from espnet_multiblank.decoding.beam_run import (
    NEG,
    BeamRun,
    extend_key,
    merge_equal,
    stats_increment,
)

#: columns of a hypothesis's (B, K, 5) long fields
FRAME, NUM_SYM, KEY, NODE_COL, STATS_COL = range(5)


class StepSyncRun(BeamRun):
    """One batch of the step-synchronous beam search (module docstring).

    The K hypotheses of utterance b are store rows ``b K .. b K + K - 1``; a step
    gathers the kept candidates' parents into those rows (one gather of the whole
    store). An utterance whose hypotheses have all reached T takes no joint call: its
    hypotheses are pinned and keep their places.
    """

    def __init__(self, search, enc_out: torch.Tensor, lens: torch.Tensor):
        B, K = enc_out.size(0), search.beam_size
        super().__init__(search, enc_out, lens, B * K)
        device = self.device
        self.rows = self.utts.unsqueeze(1) * K + torch.arange(K, device=device)
        self.score = torch.full((B, K), NEG, dtype=torch.float64, device=device)
        self.score[:, 0] = self.root_score()
        # frame, labels emitted at it, label-sequence key, last node, statistics
        self.fields = torch.zeros(B, K, 5, dtype=torch.long, device=device)
        self.fields[..., NODE_COL] = -1

    def step(self) -> bool:
        """One arc for every hypothesis short of its T; False when none is left."""
        B, K = self.B, self.K
        lens = self.lens.unsqueeze(1)
        frame = self.fields[..., FRAME]
        valid = self.score > NEG
        finished = valid & (frame >= lens)
        grow = valid & ~finished
        if not bool(grow.any()):
            return False
        ex = self.expand(
            self.score, frame, self.fields[..., NUM_SYM], self.rows, grow, finished
        )
        ok = torch.isfinite(ex.score)
        moved = ex.frames > 0
        is_label = ok & ex.is_label
        fields = self.fields.gather(1, ex.parent.unsqueeze(2).expand(B, K, 5))
        p_row = self.rows.gather(1, ex.parent)  # (B, K) the parents' store rows
        frame = fields[..., FRAME] + ex.frames
        key = fields[..., KEY]
        key = torch.where(is_label, extend_key(key, ex.symbol), key)
        num_sym = torch.where(
            moved | ex.pinned, 0, fields[..., NUM_SYM] + is_label.long()
        )
        stats = fields[..., STATS_COL] + stats_increment(ex.frames, ex.is_label)
        node = fields[..., NODE_COL]
        lab, new, ids = self.step_expanded(
            ex, is_label, p_row, self.score, node, fields[..., FRAME]
        )
        if new is not None:
            node = node.clone()
            node.view(-1)[lab] = ids
        score = torch.where(ok, ex.score, NEG)
        arrived = ok & (moved | ex.pinned)
        if self.lm is not None:  # a hypothesis that ends: the end of the sentence
            end = self.lm.end[p_row].double()
            if new is not None:
                end.view(-1)[lab] = new[2].end.double()
            score = score + torch.where(
                arrived & ~ex.pinned & (frame == lens), end, 0.0
            )
        self.score = self._merge(arrived, score, key, frame)
        self.fields = torch.stack([frame, num_sym, key, node, stats], 2)
        # the children's states: their parents' (blanks, pinned), new for labels
        self.gather_store(p_row.view(-1))
        if new is not None:
            self.write_state(
                self.rows.view(-1)[lab],
                torch.arange(lab.numel(), device=self.device),
                new,
            )
        return True

    @staticmethod
    def _merge(arrived, score, key, frame) -> torch.Tensor:
        """Children that arrived at the same frame with the same labels merge into
        the first (the best: the candidates are sorted); the others leave."""
        first, merged = merge_equal(arrived, score, key, frame)
        return torch.where(arrived & ~first, NEG, merged)

    def results(self):
        """The n-best of every utterance: its beam's complete hypotheses, ranked."""
        complete = (self.score > NEG) & (self.fields[..., FRAME] >= self.lens[:, None])
        self.lost = ~complete.any(1)
        fields = [
            torch.where(complete, self.score, NEG).tolist(),
            self.fields[..., NODE_COL].tolist(),
            self.fields[..., STATS_COL].tolist(),
            self.rows.tolist(),
        ]
        entries = [
            [(s, n, st, r) for s, n, st, r in zip(*per) if s != NEG]
            for per in zip(*fields)
        ]
        return self.ranked(entries)
