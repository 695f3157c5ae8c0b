"""Batched beam search: the frame-synchronous beam search of B utterances at once.

:class:`BatchedBeamSearch` decodes B utterances with the rules of the one-utterance
beam searches (:mod:`~espnet_multiblank.decoding.beam`: one queue of hypotheses per
frame position, keyed by the label sequence, equal label sequences merged by log-add,
the K best of a frame's queue expanded, the K best candidates of each expansion kept,
labels that stay at the frame dropped below the K-th best hypothesis queued at t + 1)
and returns, utterance by utterance, the same n-best lists (tested). What changes is
that every step works on all utterances at once, each at its own frame:

    one step, for every utterance b that has not finished:
        C_b = its hypotheses at its frame t_b (at most K)
        one joint-network call for the rows of every C_b
        candidates of each row (its lattice kind's mixin, :mod:`.beam_step`);
            the K best of each utterance
        one prediction-network call (and one step of the fused LMs) for every
            label candidate kept
        blanks, big blanks and labels that move -> the queue Q_b[t_b + frames]
            (merged with an equal label sequence there, log-add)
        labels that stay at t_b -> the next C_b
        C_b empty: t_b <- the next frame whose queue holds a hypothesis; at T_b the
            utterance has finished (its n-best is Q_b[T_b]) and leaves the work

Tensors (K = beam, R = the most frames one arc covers, Q = R + 1): the queues of the
frames t_b .. t_b + R of utterance b are a ring of Q slots of K hypotheses each,
``(B, Q, K)`` tensors (score, label-sequence key, length, last node, statistics); a
store of ``B Q K`` rows holds their prediction-network states, projected outputs and
LM states (the current hypotheses C_b are the slot of t_b: no copy when a frame is
taken up). A frame's K slots always hold its K best hypotheses; those that fall out of
them keep their score and label sequence in an overflow (no state) so that a later
alignment of the same labels merges with them exactly as in the one-utterance search
(the merged hypothesis takes the newcomer's state: the state depends on the labels
only); an overflow is dropped when its frame is taken up. Label sequences are compared
by a 62-bit polynomial hash and their length (two different sequences of the same
length collide with probability about 2^-62). Labels go into a node pool (parent,
label, frame, frames covered, acoustic log-probability): the n-best's ``yseq`` and
:attr:`~espnet_multiblank.decoding.hypothesis.Hypothesis.timing` are read back at the
end.

Notation: B utterances, K beam, Q ring slots, S = B Q K store rows, A rows expanded in a
step, N candidates per row, J joint space, V tokens.
"""

from typing import Any, List

import torch

from espnet_multiblank.decoding.base import TransducerSearch
from espnet_multiblank.decoding.hypothesis import Hypothesis

NEG = float("-inf")

# label-sequence keys: two 31-bit polynomial hashes packed in one int64
_P1, _P2 = 2147483647, 2147483629
_A1, _A2 = 1000003, 999983  # (P - 1) * A + V stays far below 2^63
_LOW = (1 << 31) - 1


def extend_key(key: torch.Tensor, symbol: torch.Tensor) -> torch.Tensor:
    """The key of a label sequence extended by ``symbol`` (same shapes, long)."""
    hi = ((key >> 31) * _A1 + symbol + 1) % _P1
    lo = ((key & _LOW) * _A2 + symbol + 1) % _P2
    return (hi << 31) | lo


class BatchedBeamSearch(TransducerSearch):
    """What the beam searches share for B utterances at once (module docstring).

    A subclass provides ``beam_candidates`` (a :mod:`.beam_step` mixin), and has
    ``beam_size``, ``score_norm`` and ``blank_decision``.
    """

    batched = True
    #: first capacity of a frame's overflow, per utterance (doubled when full)
    initial_overflow = 4
    #: first capacity of the node pool (doubled when full)
    initial_nodes = 1024

    @torch.no_grad()
    def search_batch_nbest(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[List[Hypothesis]]:
        """Beam search for B utterances at once.

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b <= T_max.

        Returns:
            For each utterance, in input order, up to :attr:`nbest` complete
            hypotheses, best first (those of :meth:`search` on the utterance alone;
            an empty list when no path survived, e.g. non-finite network outputs).
        """
        if enc_out.dim() != 3 or enc_lens.shape != (enc_out.size(0),):
            raise ValueError(
                "enc_out must be (B, T_max, D_enc) and enc_lens (B,), got "
                f"{tuple(enc_out.shape)} and {tuple(enc_lens.shape)}"
            )
        B, T_max = enc_out.shape[:2]
        lens = enc_lens.to(device=enc_out.device, dtype=torch.long)
        if B and bool(((lens < 0) | (lens > T_max)).any()):
            raise ValueError(
                f"enc_lens must be in [0, T_max = {T_max}], got {enc_lens.tolist()}"
            )
        if B == 0:
            return []
        run = _BeamRun(self, enc_out, lens)
        while run.step():
            pass
        return run.results()

    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """The best hypothesis of each utterance (:meth:`search_batch_nbest`).

        Raises:
            ValueError: an utterance kept no hypothesis.
        """
        out = []
        for b, nbest in enumerate(self.search_batch_nbest(enc_out, enc_lens)):
            if not nbest:
                raise ValueError(f"utterance {b} of the batch kept no hypothesis")
            out.append(nbest[0])
        return out

    def _may_merge_in_step(self, table: Any) -> bool:
        """Whether two candidates of one expansion can reach the same frame with the
        same labels (only a TDT whose arcs are clipped at T: ``end_rule: "clip"``, or
        durations without 1); then they are merged before they are queued."""
        durations = getattr(table, "durations_list", None)
        if durations is None:
            return False
        return table.end_rule == "clip" or 1 not in durations


class _BeamRun:
    """The tensors of one :meth:`BatchedBeamSearch.search_batch_nbest` call and its
    steps (module docstring)."""

    def __init__(
        self, search: BatchedBeamSearch, enc_out: torch.Tensor, lens: torch.Tensor
    ):
        device = enc_out.device
        self.search = search
        self.stepper = search.stepper
        self.fusion = search.fusion
        self.table = search.table(device)
        self.merge_in_step = search._may_merge_in_step(self.table)
        B, K = enc_out.size(0), search.beam_size
        Q = self.table.max_frames + 1
        self.B, self.K, self.Q = B, K, Q
        self.device = device
        self.enc_proj = self.stepper.project_enc(enc_out)  # (B, T_max, J)
        self.lens = lens
        self.rows = torch.arange(B, device=device)
        self.arange_k = torch.arange(K, device=device)
        self.arange_q = torch.arange(Q, device=device)

        # the store: every row starts as the root (start symbol) state
        S = B * Q * K
        root = torch.zeros(S, dtype=torch.long, device=device)
        dec_proj, state = search.start(1, device)
        self.dec_proj = dec_proj[root]  # (S, J)
        self.state = self.stepper.select_state(state, root)
        lm = search.start_lm(1, device)
        self.lm = None if lm is None else self.fusion.select(lm, root)

        def full(shape, value, dtype=torch.long):
            return torch.full(shape, value, dtype=dtype, device=device)

        # the frame queues' K best: (B, Q, K), ring slot t % Q holds frame t
        self.score = full((B, Q, K), NEG, torch.float64)
        self.key = full((B, Q, K), 0)
        self.length = full((B, Q, K), 0)  # labels
        self.node = full((B, Q, K), -1)  # last label's node (-1: none)
        self.big = full((B, Q, K), 0)  # big-blank emissions
        self.skip = full((B, Q, K), 0)  # frames skipped
        self.num_sym = full((B, K), 0)  # labels emitted at t by the current ones
        # the overflow of each queue (no state): (B, Q, M)
        M = search.initial_overflow
        self.o_score = full((B, Q, M), NEG, torch.float64)
        self.o_key = full((B, Q, M), 0)
        self.o_length = full((B, Q, M), 0)
        self.o_node = full((B, Q, M), -1)
        self.o_big = full((B, Q, M), 0)
        self.o_skip = full((B, Q, M), 0)
        self.o_count = full((B, Q), 0)
        # the node pool: (parent, label, frame, frames covered) and acoustic logp
        self.n_nodes = 0
        self.nodes = full((search.initial_nodes, 4), 0)
        self.node_logp = full((search.initial_nodes,), 0.0, torch.float64)

        self.frame = full((B,), 0)
        self.done = lens == 0
        self.lost = torch.zeros(B, dtype=torch.bool, device=device)
        self.score[:, 0, 0] = 0.0  # the root, at frame 0 (and complete when T = 0)
        if self.lm is not None:  # a complete root: the end of the sentence
            end = float(self.lm.end[0])
            self.score[:, 0, 0] += torch.where(self.done, end, 0.0).double()

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """One expansion of every unfinished utterance; False when all finished."""
        active = ~self.done
        if not bool(active.any()):
            return False
        B, K, Q = self.B, self.K, self.Q
        rows = self.rows
        ring = self.frame % Q  # (B,) slot of the current hypotheses
        current = self.score[rows, ring]  # (B, K)
        valid = (current > NEG) & active.unsqueeze(1)
        flat = valid.view(-1).nonzero().squeeze(1)  # (A,) in B K
        b_of = flat // K
        store_rows = (b_of * Q + ring[b_of]) * K + flat % K  # (A,)
        t_of = self.frame[b_of]
        lm_labels = None if self.lm is None else self.lm.labels[store_rows]
        cand = self.search.beam_candidates(
            self.table,
            self.enc_proj[b_of, t_of],
            self.dec_proj[store_rows],
            t_of,
            self.lens[b_of],
            self.num_sym.view(-1)[flat],
            lm_labels,
        )
        # the K best of each row, then of each utterance
        N = cand.score.size(1)
        row_top, row_col = cand.score.topk(min(K, N), dim=1)  # (A, K')
        grid = torch.full(
            (B * K, row_top.size(1)), NEG, dtype=torch.float64, device=self.device
        )
        grid[flat] = current.view(-1)[flat].unsqueeze(1) + row_top.double()
        top, idx = grid.view(B, -1).topk(K, dim=1)  # (B, K)
        parent = idx // row_top.size(1)  # (B, K) slot of the parent in C_b
        row_of = torch.zeros(B * K, dtype=torch.long, device=self.device)
        row_of[flat] = torch.arange(flat.numel(), device=self.device)
        a = row_of[rows.unsqueeze(1) * K + parent]  # (B, K) expanded row
        col = row_col[a, idx % row_top.size(1)]
        symbol = cand.symbol[a, col]
        frames = cand.frames[a, col]
        is_label = cand.is_label[a, col]
        ok = torch.isfinite(top)

        # labels that stay must reach the K-th best hypothesis queued at t + 1
        ahead = self.score[rows, (self.frame + 1) % Q]  # (B, K)
        floor = torch.where((ahead > NEG).all(1), ahead.min(1).values, NEG)
        stay = ok & is_label & (frames == 0) & (top >= floor.unsqueeze(1))
        move = ok & (frames > 0)
        stepped = stay | (move & is_label)  # labels: one prediction step each

        p_row = (rows.unsqueeze(1) * Q + ring.unsqueeze(1)) * K + parent  # (B, K)
        children = self._children(p_row, top, symbol, frames, is_label, stepped)
        key, length, node, big, skip, end = children[:6]
        new_state, new_proj, new_lm, new_of = children[6:]

        # blanks and labels that move: queued at t + frames
        target = self.frame.unsqueeze(1) + frames
        score = top + torch.where(target == self.lens.unsqueeze(1), end, 0.0)
        admitted, dest = self._insert(
            move, target, score, key, length, node, big, skip
        )
        blank_in = admitted & ~is_label
        if bool(blank_in.any()):  # a blank keeps its parent's state
            self._copy(dest[blank_in], p_row[blank_in])
        # labels that stay: the next hypotheses of frame t
        self.score[rows[active], ring[active]] = NEG
        pos = stay.long().cumsum(1) - 1
        stay_row = (rows.unsqueeze(1) * Q + ring.unsqueeze(1)) * K + pos
        self._write_meta(stay_row[stay], top[stay], key, length, node, big, skip, stay)
        self.num_sym[rows.unsqueeze(1).expand(B, K)[stay], pos[stay]] = (
            self.num_sym.view(-1)[(rows.unsqueeze(1) * K + parent)[stay]] + 1
        )
        from_new = stay | (admitted & is_label)
        if bool(from_new.any()):
            dest_rows = torch.where(stay, stay_row, dest)[from_new]
            self._write_state(dest_rows, new_of[from_new], new_state, new_proj, new_lm)
        self._advance(active)
        return True

    def _children(self, p_row, top, symbol, frames, is_label, stepped):
        """Label sequence, statistics and end-of-sentence score of the K kept
        candidates of each utterance (``(B, K)`` each), and the prediction-network
        (and LM) step of the labels among them.

        Returns:
            key, length, node, big, skip, end (B, K); the new states, projected
            outputs and LM states of the L stepped labels, and ``new_of`` (B, K) long,
            each candidate's row among them (-1: none).
        """
        flat_row = p_row.view(-1)
        key = self.key.view(-1)[flat_row].view_as(p_row)
        length = self.length.view(-1)[flat_row].view_as(p_row)
        node = self.node.view(-1)[flat_row].view_as(p_row).clone()
        p_score = self.score.view(-1)[flat_row].view_as(p_row)
        moved = frames > 0
        big = self.big.view(-1)[flat_row].view_as(p_row)
        big = big + (moved & ~is_label & (frames > 1)).long()
        skip = self.skip.view(-1)[flat_row].view_as(p_row)
        skip = skip + (frames - 1).clamp(min=0)
        key = torch.where(stepped, extend_key(key, symbol), key)
        length = length + stepped.long()
        end = torch.zeros_like(top)
        if self.lm is not None:
            end = self.lm.end[flat_row].view_as(p_row).double()

        lab = stepped.view(-1).nonzero().squeeze(1)  # (L,)
        new_of = torch.full_like(p_row, -1)
        if lab.numel() == 0:
            return key, length, node, big, skip, end, None, None, None, new_of
        L = lab.numel()
        new_of.view(-1)[lab] = torch.arange(L, device=self.device)
        src = flat_row[lab]
        labels = symbol.view(-1)[lab]
        new_proj, new_state = self.stepper.step(
            labels, self.stepper.select_state(self.state, src)
        )
        new_lm = None
        acoustic = top.view(-1)[lab] - p_score.view(-1)[lab]
        if self.lm is not None:
            old = self.fusion.select(self.lm, src)
            acoustic = acoustic - old.labels.gather(1, labels.unsqueeze(1))[:, 0]
            new_lm = self.fusion.step(labels, old)
            end.view(-1)[lab] = new_lm.end.double()
        b = lab // self.K
        node.view(-1)[lab] = self._new_nodes(
            node.view(-1)[lab], labels, self.frame[b], frames.view(-1)[lab], acoustic
        )
        return key, length, node, big, skip, end, new_state, new_proj, new_lm, new_of

    # --------------------------------------------------------------- the queues
    def _insert(self, ins, target, score, key, length, node, big, skip):
        """Queue the candidates ``ins`` ((B, K) bool) at frame ``target`` (merging
        equal label sequences); a frame keeps its K best in its slots, the others in
        its overflow.

        Returns:
            (B, K) bool, the candidates that took a slot, and (B, K) long, their store
            rows (their states are to be written there).
        """
        B, K, Q = self.B, self.K, self.Q
        if not bool(ins.any()):
            return ins, torch.zeros_like(target)
        ring = target % Q
        score, node, big, skip = score.clone(), node.clone(), big.clone(), skip.clone()
        if self.merge_in_step:
            ins = self._merge_siblings(ins, ring, score, key, length, node, big, skip)
        base = (self.rows.unsqueeze(1) * Q + ring) * K  # (B, K) first slot row
        slot_rows = base.unsqueeze(2) + self.arange_k  # (B, K, K)
        q_score = self.score.view(-1)[slot_rows]
        hit = (
            ins.unsqueeze(2)
            & (q_score > NEG)
            & (self.key.view(-1)[slot_rows] == key.unsqueeze(2))
            & (self.length.view(-1)[slot_rows] == length.unsqueeze(2))
        )
        has = hit.any(2)
        if bool(has.any()):  # merged into a hypothesis in the slots
            rows = (base + hit.long().argmax(2))[has]
            old, new = self.score.view(-1)[rows], score[has]
            better = new > old
            self.score.view(-1)[rows] = torch.logaddexp(old, new)
            for mine, theirs in ((self.node, node), (self.big, big), (self.skip, skip)):
                flat = mine.view(-1)
                flat[rows] = torch.where(better, theirs[has], flat[rows])
        ins = ins & ~has
        if bool(self.o_count.any()):
            self._merge_overflow(ins, ring, score, key, length, node, big, skip)

        # the K best of slots + newcomers, per (utterance, frame)
        onehot = (ring.unsqueeze(1) == self.arange_q.view(1, Q, 1)) & ins.unsqueeze(1)
        new_score = torch.where(onehot, score.unsqueeze(1), NEG)  # (B, Q, K)
        both = torch.cat([self.score, new_score], 2)  # (B, Q, 2K)
        best, which = both.topk(K, dim=2)
        chosen = torch.zeros_like(both, dtype=torch.bool)
        chosen.scatter_(2, which, best > NEG)
        keep, admit = chosen[..., :K], chosen[..., K:]
        evicted = (self.score > NEG) & ~keep
        rejected = onehot & ~admit
        # the i-th admitted newcomer of a queue takes its i-th free slot
        rank = (admit.long().cumsum(2) - 1).clamp(min=0)
        free = keep.long().argsort(dim=2, stable=True)  # free slots first
        slot = free.gather(2, rank)
        admitted = admit.any(1)  # (B, K)
        dest = base + (slot * admit).sum(1)
        if bool((evicted.any() | rejected.any())):
            self._spill(evicted, rejected, onehot, score, key, length, node, big, skip)
        self.score.masked_fill_(evicted, NEG)
        rows = dest[admitted]
        self._write_meta(rows, score[admitted], key, length, node, big, skip, admitted)
        return admitted, dest

    def _merge_siblings(self, ins, ring, score, key, length, node, big, skip):
        """Merge candidates of one utterance bound for the same frame with the same
        labels (in place; the best one's statistics); returns the candidates left."""
        same = (
            ins.unsqueeze(2)
            & ins.unsqueeze(1)
            & (key.unsqueeze(2) == key.unsqueeze(1))
            & (length.unsqueeze(2) == length.unsqueeze(1))
            & (ring.unsqueeze(2) == ring.unsqueeze(1))
        )  # (B, K, K)
        first = same.long().argmax(2)
        leader = ins & (first == self.arange_k)
        group = torch.where(same, score.unsqueeze(1), NEG)
        best = group.argmax(2)
        merged = torch.logsumexp(group, 2)
        score.copy_(torch.where(leader, merged, score))
        for x in (node, big, skip):
            x.copy_(torch.where(leader, x.gather(1, best), x))
        return leader

    def _merge_overflow(self, ins, ring, score, key, length, node, big, skip):
        """Merge newcomers with an equal label sequence in their frame's overflow (in
        place): the newcomer takes the summed score and the better statistics, and
        the entry leaves the overflow."""
        M = self.o_score.size(2)
        base = (self.rows.unsqueeze(1) * self.Q + ring) * M
        o_rows = base.unsqueeze(2) + torch.arange(M, device=self.device)  # (B, K, M)
        hit = (
            ins.unsqueeze(2)
            & (self.o_score.view(-1)[o_rows] > NEG)
            & (self.o_key.view(-1)[o_rows] == key.unsqueeze(2))
            & (self.o_length.view(-1)[o_rows] == length.unsqueeze(2))
        )
        has = hit.any(2)
        if not bool(has.any()):
            return
        rows = (base + hit.long().argmax(2))[has]
        old, new = self.o_score.view(-1)[rows], score[has]
        keep_old = old >= new
        score[has] = torch.logaddexp(old, new)
        for mine, theirs in ((node, self.o_node), (big, self.o_big), (skip, self.o_skip)):
            mine[has] = torch.where(keep_old, theirs.view(-1)[rows], mine[has])
        self.o_score.view(-1)[rows] = NEG

    def _spill(self, evicted, rejected, onehot, score, key, length, node, big, skip):
        """Append the hypotheses that left (``evicted``, (B, Q, K)) or never took
        (``rejected``) a frame's slots to that frame's overflow."""
        B, Q, K = self.B, self.Q, self.K
        out = torch.cat([evicted, rejected], 2)  # (B, Q, 2K)
        count = out.long().sum(2)
        need = int((self.o_count + count).max())
        if need > self.o_score.size(2):
            self._grow_overflow(need)
        M = self.o_score.size(2)
        pos = self.o_count.unsqueeze(2) + out.long().cumsum(2) - 1
        base = (self.rows.view(B, 1, 1) * Q + self.arange_q.view(1, Q, 1)) * M
        rows = (base + pos)[out]

        def spread(x):  # (B, K) newcomer values at their (B, Q, K) places
            return torch.where(onehot, x.unsqueeze(1), 0)

        pairs = (
            (self.o_score, self.score, torch.where(onehot, score.unsqueeze(1), NEG)),
            (self.o_key, self.key, spread(key)),
            (self.o_length, self.length, spread(length)),
            (self.o_node, self.node, spread(node)),
            (self.o_big, self.big, spread(big)),
            (self.o_skip, self.skip, spread(skip)),
        )
        for o, slots, new in pairs:
            o.view(-1)[rows] = torch.cat([slots, new], 2)[out]
        self.o_count += count

    def _grow_overflow(self, need: int) -> None:
        M = self.o_score.size(2)
        while M < need:
            M *= 2
        for name in ("o_score", "o_key", "o_length", "o_node", "o_big", "o_skip"):
            old = getattr(self, name)
            fill = NEG if name == "o_score" else 0
            new = torch.full(
                (self.B, self.Q, M), fill, dtype=old.dtype, device=self.device
            )
            new[..., : old.size(2)] = old
            setattr(self, name, new)

    def _write_meta(self, rows, score, key, length, node, big, skip, mask):
        """Slot rows ``rows`` get ``score`` and the (B, K) values at ``mask``."""
        self.score.view(-1)[rows] = score
        for mine, theirs in (
            (self.key, key),
            (self.length, length),
            (self.node, node),
            (self.big, big),
            (self.skip, skip),
        ):
            mine.view(-1)[rows] = theirs[mask]

    # --------------------------------------------------------------- the store
    def _copy(self, dest: torch.Tensor, src: torch.Tensor) -> None:
        """Store rows ``src`` -> rows ``dest`` (states, outputs, LM states)."""
        stepper = self.stepper
        stepper.scatter_state(self.state, dest, stepper.select_state(self.state, src))
        self.dec_proj[dest] = self.dec_proj[src]
        if self.lm is not None:
            self.fusion.scatter(self.lm, dest, self.fusion.select(self.lm, src))

    def _write_state(self, dest, idx, new_state, new_proj, new_lm) -> None:
        """Rows ``idx`` of the new (stepped) states -> store rows ``dest``."""
        stepper = self.stepper
        stepper.scatter_state(self.state, dest, stepper.select_state(new_state, idx))
        self.dec_proj[dest] = new_proj[idx]
        if self.lm is not None:
            self.fusion.scatter(self.lm, dest, self.fusion.select(new_lm, idx))

    def _new_nodes(self, parent, label, frame, covered, logp) -> torch.Tensor:
        """Append L label nodes; returns their (L,) ids."""
        L = parent.numel()
        need = self.n_nodes + L
        if need > self.nodes.size(0):
            size = self.nodes.size(0)
            while size < need:
                size *= 2
            nodes = self.nodes.new_zeros(size, 4)
            nodes[: self.n_nodes] = self.nodes[: self.n_nodes]
            logps = self.node_logp.new_zeros(size)
            logps[: self.n_nodes] = self.node_logp[: self.n_nodes]
            self.nodes, self.node_logp = nodes, logps
        ids = torch.arange(self.n_nodes, need, device=self.device)
        self.nodes[ids] = torch.stack([parent, label, frame, covered], 1)
        self.node_logp[ids] = logp.double()
        self.n_nodes = need
        return ids

    # ------------------------------------------------------------ frames, results
    def _advance(self, active: torch.Tensor) -> None:
        """Utterances without current hypotheses take up the next frame whose queue
        holds one; at T_b (or with none left) they finish."""
        Q = self.Q
        ring = self.frame % Q
        empty = active & ~(self.score[self.rows, ring] > NEG).any(1)
        held = (self.score > NEG).any(2)  # (B, Q)
        ahead = self.frame.unsqueeze(1) + self.arange_q[1:]  # (B, R)
        there = held.gather(1, ahead % Q) & (ahead <= self.lens.unsqueeze(1))
        found = there.any(1)
        nxt = self.frame + there.long().argmax(1) + 1
        go = empty & found
        self.frame = torch.where(go, nxt, self.frame)
        self.lost |= empty & ~found
        self.done |= (empty & ~found) | (go & (nxt == self.lens))
        load = go & (nxt < self.lens)
        if bool(load.any()):  # the frame's overflow is dropped; nothing stays yet
            b = self.rows[load]
            r = self.frame[load] % Q
            self.o_score[b, r] = NEG
            self.o_count[b, r] = 0
            self.num_sym[load] = 0

    def results(self) -> List[List[Hypothesis]]:
        """The n-best of every utterance: its queue at T_b, ranked."""
        search = self.search
        Q, K = self.Q, self.K
        ring = self.lens % Q
        slot_rows = (self.rows * Q + ring).unsqueeze(1) * K + self.arange_k  # (B, K)
        M = self.o_score.size(2)
        o_rows = (self.rows * Q + ring).unsqueeze(1) * M + torch.arange(
            M, device=self.device
        )
        fields = [
            torch.cat([x.view(-1)[slot_rows], o.view(-1)[o_rows]], 1).tolist()
            for x, o in (
                (self.score, self.o_score),
                (self.length, self.o_length),
                (self.node, self.o_node),
                (self.big, self.o_big),
                (self.skip, self.o_skip),
            )
        ]
        store = torch.cat(
            [slot_rows, torch.full_like(o_rows, -1)], 1
        ).tolist()  # (B, K + M)
        nodes = self.nodes[: self.n_nodes].tolist()
        logps = self.node_logp[: self.n_nodes].tolist()
        lens, lost = self.lens.tolist(), self.lost.tolist()
        out = []
        for b in range(self.B):
            entries = [
                (s, n, node, big, skip, row)
                for s, n, node, big, skip, row in zip(
                    *(f[b] for f in fields), store[b]
                )
                if s != NEG
            ]
            if lost[b]:
                entries = []
            if search.score_norm:
                entries.sort(key=lambda e: e[0] / (e[1] + 1), reverse=True)
            else:
                entries.sort(key=lambda e: e[0], reverse=True)
            out.append(
                [
                    self._hypothesis(e, lens[b], nodes, logps)
                    for e in entries[: search.nbest]
                ]
            )
        return out

    def _hypothesis(self, entry, T: int, nodes, logps) -> Hypothesis:
        score, _, node, big, skip, row = entry
        labels, timing = [], []
        while node >= 0:
            parent, label, frame, covered = nodes[node]
            labels.append(label)
            timing.append((frame, covered, logps[node]))
            node = parent
        labels.reverse()
        timing.reverse()
        state = proj = lm = None
        if row >= 0:
            idx = torch.tensor([row], device=self.device)
            state = self.stepper.select_state(self.state, idx)
            proj = self.dec_proj[row]
            lm = None if self.lm is None else self.fusion.select(self.lm, idx)
        return Hypothesis(
            score=score,
            yseq=[self.search.blank_id] + labels,
            dec_state=state,
            dec_proj=proj,
            frame=T,
            big_blank_emissions=big,
            frames_skipped=skip,
            lm_state=lm,
            timing=timing,
        )
