"""Label-synchronous batched beam search (``beam_sync: label``): exact prefix scores.

The frame- and step-synchronous rules rank *alignments*: a hypothesis is a path
through the lattice, and two paths of the same labels add up only when they meet on
one frame. On a multi-blank or TDT lattice the probability of a label sequence is
spread over very many alignments (a blank8, or two blank4, or blank4 + blank2 +
blank2, ... cover the same frames), so a ranking by paths scores a label sequence by
a fraction of its probability. Here a hypothesis is a *label sequence*, scored with
the sum over all of its alignments, exactly (the losses' forward recursion restricted
to one prefix, :mod:`.prefix_kernels`):

    beam_b = the K best prefixes of utterance b, all with u labels
    one step, for every utterance that has not finished:
        one joint-network call for every prefix of every utterance, at every frame
        alpha_y(t): the prefix's forward sums (entry on the frame its last label arc
            lands on, then blanks and big blanks / blank durations)
        end_y = the complete paths of y (last arc a blank landing on T_b):
            y, scored end_y + LM(y </s>), joins the utterance's ended list
        prefix score of y + l = log sum_t' entry_{y+l}(t')  (+ LM(y + l)), for
            every label l: an upper bound of the score of every hypothesis that
            starts with y + l
        beam_b = the K best y + l that can still beat the nbest-th ended hypothesis
        one prediction-network call (and one step of the fused LMs) for them
    utterance b finishes when no prefix of its beam can beat its nbest-th ended
        hypothesis (or after max_sym_per_frame x T_b labels); its n-best: the
        ended list

Every label sequence is kept at most once (the children of distinct prefixes are
distinct), so nothing is merged; the score of a returned hypothesis is log P(y | x)
as the loss computes it (plus the fused LMs' weighted log P(y </s>)). With a beam
that prunes nothing, the n-best is the exact n-best of the model (tested against
enumeration). Its steps are the labels of the longest hypothesis plus one, whatever
the frames; a step costs a joint-network call on K x T rows per utterance (the other
rules: K rows), so it suits the short utterances and small vocabularies of the
recipe; see docs/decoding.md for the costs. Timing and the path statistics of a
returned hypothesis are those of its most probable alignment
(:func:`~.prefix_kernels.best_alignments`).
"""

import math
from typing import List

import numpy as np
import torch

from espnet_multiblank.decoding.beam_run import NEG, BeamRun
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.prefix_kernels import (
    best_alignments,
    child_entries,
    level_forward,
)

#: frames evaluated past a prefix's last entry at first, and per extension
FIRST_WINDOW = 16
NEXT_WINDOW = 32


def _host(x: torch.Tensor):
    return x.detach().cpu().numpy()


class LabelSyncRun(BeamRun):
    """One batch of the label-synchronous beam search (module docstring).

    The K prefixes of utterance b are store rows ``b K .. b K + K - 1``.
    """

    def __init__(self, search, enc_out: torch.Tensor, lens: torch.Tensor):
        B, K = enc_out.size(0), search.beam_size
        super().__init__(search, enc_out, lens, B * K)
        device = self.device
        self.T = enc_out.size(1)
        self.M = search.nbest
        self.arcs = search.table(device)  # the arcs as columns of the joint
        self.rows = self.utts.unsqueeze(1) * K + torch.arange(K, device=device)
        self.row_lens = lens.repeat_interleave(K)  # (B K,)
        self.entry = torch.full((B * K, self.T), NEG, dtype=torch.float64)
        if self.T:
            self.entry[:, 0] = 0.0  # the root: before any frame
        self.lm_score = torch.zeros(B * K, dtype=torch.float64, device=device)
        self.node = torch.full((B * K,), -1, dtype=torch.long, device=device)
        self.live = torch.zeros(B, K, dtype=torch.bool, device=device)
        self.live[:, 0] = lens > 0
        # the ended hypotheses of each utterance, best first: score and last node
        self.ended = torch.full((B, self.M), NEG, dtype=torch.float64, device=device)
        self.ended_node = torch.full((B, self.M), -1, dtype=torch.long, device=device)
        self.ended[:, 0] = torch.where(self.done, self.root_score(), NEG)
        self.labels_left = lens * search.max_sym_per_frame  # (B,)
        if search.frame_prune is not None:
            self.floor = self._path_scores(enc_out, lens) - search.frame_prune  # (B,)
        # the lattice weights each prefix's step computed, for the alignments of
        # the returned hypotheses: blank arcs of the level after a node's label
        # (the root's level per utterance) and the arcs of the node's label
        NB, NL = self.arcs.blank_d.numel(), self.arcs.label_d.numel()
        self.root_blank_w = np.zeros((B, self.T, NB), np.float32)
        self.node_blank_w = np.zeros((0, self.T, NB), np.float32)
        self.node_label_w = np.zeros((0, self.T, NL), np.float32)

    def step(self) -> bool:
        """One label for every prefix that can still win; False when none is left."""
        B, K, arcs = self.B, self.K, self.arcs
        idx = self.live.view(-1).nonzero().squeeze(1)  # (A,) store rows
        if idx.numel() == 0:
            return False
        b_of = idx // K
        row_lens = self.row_lens[idx]
        tok, dur, blank_w, alpha, end = self._evaluate(idx, b_of, row_lens)
        self._keep_blank_weights(idx, b_of, blank_w)
        self._end(idx, b_of, end)
        fused = self._prefix_scores(alpha, tok, dur, row_lens) + self.lm_score[
            idx
        ].unsqueeze(1)
        if self.lm is not None:
            fused = fused + self.lm.labels[idx][:, arcs.labels].double()
        L = fused.size(1)
        grid = torch.full((B * K, L), NEG, dtype=torch.float64, device=self.device)
        grid[idx] = fused
        grid = grid.view(B, K * L)
        # a prefix that cannot beat the nbest-th ended hypothesis is dropped: every
        # hypothesis that starts with it scores at most its prefix score
        grid = torch.where(grid > self.ended[:, -1:], grid, NEG)
        grid = torch.where((self.labels_left > 0).unsqueeze(1), grid, NEG)
        top, ti = grid.topk(min(K, K * L), dim=1)  # (B, K)
        if top.size(1) < K:  # fewer candidates than K places
            pad = K - top.size(1)
            top = torch.cat([top, top.new_full((B, pad), NEG)], 1)
            ti = torch.cat([ti, ti.new_zeros(B, pad)], 1)
        keep = (top > NEG).view(-1)
        parent = (self.rows.gather(1, ti // L)).view(-1)  # (B K,) store rows
        symbol = arcs.labels[(ti % L).view(-1)]
        kept = keep.nonzero().squeeze(1)  # (C,) new rows
        self._children(kept, parent, symbol, idx, alpha, tok, dur)
        self.live = keep.view(B, K)
        self.labels_left = self.labels_left - 1
        return True

    # --------------------------------------------------------------- one step
    def _evaluate(self, idx, b_of, row_lens):
        """The joint network on the frames where the prefixes of rows ``idx`` can
        stand, and their forward sums.

        Without ``frame_prune`` every frame (the padded ones are never read). With
        it, a prefix's frames start at its first entry whose forward sum (plus the
        prefix's LM score) is above the floor, ``frame_prune`` nats below the score
        of the utterance's greedy path, and are evaluated in windows, extended
        while the forward sum flowing past the last evaluated frame is above it:
        the paths through a frame left out add less than e**-frame_prune times the
        probability of any hypothesis that scores at least the greedy path's
        (docs/decoding.md).

        Returns:
            token log-probs (A, T, V), duration log-probs (A, T, D) or None, blank
            arc weights (A, T, NB) (-inf on the frames not evaluated), forward sums
            (A, T) float64 and complete scores (A,) float64.
        """
        arcs, T, device = self.arcs, self.T, self.device
        A = idx.numel()
        prune = self.search.frame_prune
        entry = self.entry[idx.cpu()]
        if prune is None:  # every frame: one call on the padded frames
            logits = self.stepper.joint_many(
                self.enc_proj[b_of], self.dec_proj[idx].unsqueeze(1)
            )  # (A, T, V')
            tok, dur = arcs.arc_log_probs(logits)
            blank_w = arcs.blank_weights(tok, dur)
            return (tok, dur, blank_w) + self._forward(entry, blank_w, row_lens)
        # the paths through frame t of prefix y add at most alpha_y(t) + LM(y) to
        # the fused score of any hypothesis that starts with y: none of them matters
        # to a hypothesis that beats the greedy path (self.floor + frame_prune) where
        # that is frame_prune below it; the best complete hypothesis found so far
        # raises the floor. (The best prefix's score is no floor: a prefix on an
        # early frame has the frames to its end still to pay.)
        best = torch.maximum(self.floor, self.ended[:, 0] - prune)
        floor = (best[b_of] - self.lm_score[idx]).unsqueeze(1)  # (A, 1)
        entry = entry.to(device)
        near = entry > floor
        any_near = near.any(1)
        lo = torch.where(any_near, near.float().argmax(1), 0)
        hi = torch.where(any_near, T - near.flip(1).float().argmax(1), 0)
        hi = torch.minimum(hi + FIRST_WINDOW, row_lens) * any_near
        done = lo.clone()
        tok = torch.full((A, T, arcs.num_tokens), NEG, device=device)
        blank_w = torch.full((A, T, arcs.blank_d.numel()), NEG, device=device)
        dur = None  # (A, T, D) where the joint has duration outputs
        frames = torch.arange(T, device=device)
        while True:
            rows = (done < hi).nonzero().squeeze(1)
            if rows.numel():
                start, width = done[rows], (hi - done)[rows]
                t = start.unsqueeze(1) + frames[: int(width.max())]
                valid = t < hi[rows].unsqueeze(1)
                t = t.clamp(max=T - 1)
                logits = self.stepper.joint_many(
                    self.enc_proj[b_of[rows].unsqueeze(1), t],
                    self.dec_proj[idx[rows]].unsqueeze(1),
                )  # (R, W, V')
                tk, du = arcs.arc_log_probs(logits)
                r = rows.unsqueeze(1).expand_as(t)[valid]
                tv = t[valid]
                tok[r, tv] = tk[valid]
                blank_w[r, tv] = arcs.blank_weights(tk, du)[valid]
                if du is not None:
                    if dur is None:
                        dur = torch.full((A, T, du.size(-1)), NEG, device=device)
                    dur[r, tv] = du[valid]
                done[rows] = hi[rows]
            alpha, end = self._forward(entry, blank_w, row_lens)
            # the forward sum that flows past the evaluated frames
            past = torch.where(frames.unsqueeze(0) >= done.unsqueeze(1), alpha, NEG)
            more = (done < row_lens) & (past > floor).any(1)
            if not bool(more.any()):
                return tok, dur, blank_w, alpha, end
            hi = torch.where(more, torch.minimum(done + NEXT_WINDOW, row_lens), hi)

    def _path_scores(self, enc_out, lens) -> torch.Tensor:
        """(B,) float64: the score of one complete path of each utterance (the
        greedy search's, fused with the LMs; -inf where it finds none): a lower
        bound of the best hypothesis's score. A hypothesis that scores at least as
        much has log P(y | x) at least as high when the LMs' weights are >= 0 (their
        weighted log-probabilities are <= 0); with a negative weight there is no
        such bound, and no frame is pruned."""
        fusion = self.search.fusion
        if fusion is not None and min(fusion.weights) < 0:
            return torch.full((self.B,), NEG, dtype=torch.float64, device=self.device)
        hyps = self.search.path_search().search_batch(enc_out, lens)
        # a non-finite score (no path, NaN outputs) bounds nothing: no pruning
        scores = [
            float(h.score) if h is not None and math.isfinite(h.score) else NEG
            for h in hyps
        ]
        return torch.tensor(scores, dtype=torch.float64, device=self.device)

    def _forward(self, entry, blank_w, row_lens):
        """The prefixes' forward sums (A, T) and complete scores (A,), float64."""
        A = entry.size(0)
        alpha = torch.empty(A, self.T, dtype=torch.float64)
        end = torch.empty(A, dtype=torch.float64)
        level_forward(
            _host(entry),
            _host(blank_w),
            self.arcs.blank_d.numpy(),
            _host(row_lens),
            alpha.numpy(),
            end.numpy(),
        )
        return alpha.to(self.device), end.to(self.device)

    def _keep_blank_weights(self, idx, b_of, blank_w) -> None:
        node = self.node[idx]
        w = _host(blank_w)
        root = (node < 0).cpu().numpy()
        self.root_blank_w[_host(b_of)[root]] = w[root]
        self._grow_weights(self.n_nodes)
        self.node_blank_w[_host(node)[~root]] = w[~root]

    def _grow_weights(self, n: int) -> None:
        """Room for ``n`` nodes' weights (doubling)."""
        size = self.node_blank_w.shape[0]
        if n <= size:
            return
        size = max(n, 2 * size, 64)
        for name in ("node_blank_w", "node_label_w"):
            old = getattr(self, name)
            new = np.zeros((size,) + old.shape[1:], np.float32)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def _end(self, idx, b_of, end):
        """The complete hypotheses y of rows ``idx`` join their utterances' ended
        lists (score: log P(y | x) + the LMs' weighted log P(y </s>))."""
        B, K, M = self.B, self.K, self.M
        score = end + self.lm_score[idx]
        if self.lm is not None:
            score = score + self.lm.end[idx].double()
        new = torch.full((B * K,), NEG, dtype=torch.float64, device=self.device)
        new[idx] = score
        both = torch.cat([self.ended, new.view(B, K)], 1)
        nodes = torch.cat([self.ended_node, self.node.view(B, K)], 1)
        self.ended, pick = both.topk(M, dim=1)
        self.ended_node = nodes.gather(1, pick)

    def _prefix_scores(self, alpha, tok, dur, row_lens) -> torch.Tensor:
        """(A, L) float64: log sum_t' entry_{y+l}(t') for every label l."""
        arcs = self.arcs
        top = alpha.max(1, keepdim=True).values
        weight = torch.exp(alpha - torch.where(top > NEG, top, 0.0))  # (A, T)
        if arcs.labels_move:
            # a label arc must land before T_b: the label moves that do, summed
            t = torch.arange(self.T, device=self.device)
            lands = (t.view(1, -1, 1) + arcs.label_d.to(self.device)) < row_lens.view(
                -1, 1, 1
            )
            moves = arcs.label_weights(torch.zeros_like(alpha, dtype=tok.dtype), dur)
            # (probabilities <= 1: their float32 sum needs no shift)
            fits = torch.where(lands, moves.exp(), 0.0).sum(-1)  # (A, T)
            weight = weight * fits.double()
        probs = torch.exp(tok[..., arcs.label_cols])  # (A, T, L)
        mass = torch.bmm(weight.float().unsqueeze(1), probs).squeeze(1)  # (A, L)
        return top + torch.log(mass.double())

    def _children(self, kept, parent, symbol, idx, alpha, tok, dur) -> None:
        """The kept prefixes become the store's rows: entries, states, LMs, nodes."""
        K, T, arcs, device = self.K, self.T, self.arcs, self.device
        # every row takes its parent's state (rows that keep nothing are not live:
        # theirs is never read)
        src = parent
        pos = torch.full((self.B * K,), -1, dtype=torch.long, device=device)
        pos[idx] = torch.arange(idx.numel(), device=device)
        entry = torch.full((self.B * K, T), NEG, dtype=torch.float64)
        lm_score = self.lm_score[src].clone()
        node = self.node[src].clone()
        if kept.numel():
            pa = pos[parent[kept]]  # (C,) rows of alpha
            sym = symbol[kept]
            tok_l = tok[pa].gather(2, sym.view(-1, 1, 1).expand(-1, T, 1)).squeeze(2)
            label_w = arcs.label_weights(tok_l, None if dur is None else dur[pa])
            child = torch.empty(kept.numel(), T, dtype=torch.float64)
            child_entries(
                alpha.cpu().numpy(),
                _host(pa),
                _host(label_w),
                arcs.label_d.numpy(),
                _host(self.row_lens[kept]),
                child.numpy(),
            )
            entry[kept.cpu()] = child
            if self.lm is not None:
                lm_score[kept] = (
                    self.lm_score[parent[kept]]
                    + self.lm.labels[parent[kept], sym].double()
                )
            new, ids = self.step_labels(
                parent[kept],
                sym,
                self.node[parent[kept]],
                torch.full_like(sym, -1),
                torch.zeros_like(sym),
                torch.zeros(sym.numel(), dtype=torch.float64, device=device),
            )
            node[kept] = ids
            self._grow_weights(self.n_nodes)
            self.node_label_w[_host(ids)] = _host(label_w)
        self.gather_store(src)
        if kept.numel():
            self.write_state(kept, torch.arange(kept.numel(), device=device), new)
        self.entry, self.lm_score, self.node = entry, lm_score, node

    # ---------------------------------------------------------------- results
    def results(self) -> List[List[Hypothesis]]:
        """The n-best of every utterance: its ended hypotheses, ranked, each with
        the timing and statistics of its most probable alignment."""
        self.lost = ~(self.ended > NEG).any(1)
        nodes = self.nodes[: self.n_nodes].tolist()
        found = []  # (utterance, score, labels)
        for b, (scores, ends) in enumerate(
            zip(self.ended.tolist(), self.ended_node.tolist())
        ):
            for score, node in zip(scores, ends):
                if score == NEG:
                    continue
                labels, chain = [], []
                while node >= 0:
                    chain.append(node)
                    node, label = nodes[node][0], nodes[node][1]
                    labels.append(label)
                found.append((b, score, labels[::-1], chain[::-1]))
        aligned = self._align(found)
        out = [[] for _ in range(self.B)]
        T = self.lens.tolist()
        for (b, score, labels, _), (arcs, big, skipped) in zip(found, aligned):
            out[b].append(
                Hypothesis(
                    score=score,
                    yseq=[self.search.blank_id] + labels,
                    frame=T[b],
                    big_blank_emissions=big,
                    frames_skipped=skipped,
                    timing=arcs,
                )
            )
        return [self.search.rank(hyps) for hyps in out]

    def _align(self, found):
        """The most probable alignment of each found hypothesis, from the lattice
        weights its prefixes' steps computed: (per label (frame, frames covered,
        arc log-probability), big blanks, frames skipped)."""
        if not found:
            return []
        H, T = len(found), self.T
        U = max(len(f[3]) for f in found)
        NB, NL = self.node_blank_w.shape[2], self.node_label_w.shape[2]
        blank_w = np.full((H, T, U + 1, NB), -np.inf, np.float32)
        label_w = np.full((H, T, max(U, 1), NL), -np.inf, np.float32)
        for h, (b, _, _, chain) in enumerate(found):
            blank_w[h, :, 0] = self.root_blank_w[b]
            if chain:
                blank_w[h, :, 1 : len(chain) + 1] = self.node_blank_w[chain].transpose(
                    1, 0, 2
                )
                label_w[h, :, : len(chain)] = self.node_label_w[chain].transpose(
                    1, 0, 2
                )
        arcs = np.zeros((H, max(U, 1), 3), np.float64)
        stats = np.zeros((H, 3), np.float64)
        lens = self.lens.cpu().numpy()[[f[0] for f in found]]
        best_alignments(
            blank_w,
            self.arcs.blank_d.numpy(),
            label_w,
            self.arcs.label_d.numpy(),
            lens.astype(np.int64),
            np.array([len(f[3]) for f in found], np.int64),
            arcs,
            stats,
        )
        out = []
        for h, (_, _, _, chain) in enumerate(found):
            timing = [(int(f), int(c), float(lp)) for f, c, lp in arcs[h, : len(chain)]]
            out.append((timing, int(stats[h, 1]), int(stats[h, 2])))
        return out
