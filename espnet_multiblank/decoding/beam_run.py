"""What the batched beam searches' runs share: the store, the expansion, the nodes.

A run decodes one batch: B utterances, at most K hypotheses each live at a time,
their prediction-network states, projected outputs and LM states in a *store* of S
rows (``select_state`` / ``scatter_state`` of the stepper and the fusion), their
labels in a *node pool* (parent node, label, frame, frames covered, acoustic
log-probability: ``yseq`` and
:attr:`~espnet_multiblank.decoding.hypothesis.Hypothesis.timing` are read back at the
end). :meth:`BeamRun.expand` is one expansion of every live hypothesis of every
utterance: one joint-network call for all of them, each at its own frame, the
candidates of its lattice (``beam_candidates``), the K best of each utterance;
:meth:`BeamRun.step_labels` one prediction-network (and LM) call for the kept labels.
The subclasses (:mod:`.frame_sync_beam`, :mod:`.step_sync_beam`) decide which
hypotheses expand and where the children go.

Keys: a polynomial hash of the label sequence modulo 2^64 (int64 arithmetic wraps);
two different label sequences share a key with probability about 2^-64 per pair.
Statistics: big-blank emissions << 32 | frames skipped.

Notation: B utterances, K beam, S store rows, A hypotheses expanded, N candidates per
hypothesis, W = min(K, N), L labels kept.
"""

from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.tables import RowNodes

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


class Expansion(NamedTuple):
    """The K best candidates of each utterance, sorted (best first).

    Attributes:
        score: (B, K) float64, the parent's score plus the arc's (fused) score; -inf
            where there is none.
        parent: (B, K) long, the parent's column in the (B, K) hypotheses.
        symbol: (B, K) long, the arc's symbol.
        frames: (B, K) long, frames the arc moves on.
        is_label: (B, K) bool.
        pinned: (B, K) bool, candidates that are a pinned parent itself (no arc).
        lm_label: (B, K) float32, the LMs' part of a label arc's score (0 without).
    """

    score: torch.Tensor
    parent: torch.Tensor
    symbol: torch.Tensor
    frames: torch.Tensor
    is_label: torch.Tensor
    pinned: torch.Tensor
    lm_label: torch.Tensor


class BeamRun:
    """The store, the expansion and the node pool of one batch (module docstring).

    Args:
        search: The beam search (a
            :class:`~espnet_multiblank.decoding.beam.BeamSearch`).
        enc_out: (B, T_max, D_enc) encoder output.
        lens: (B,) long, T_b.
        rows: S, the store's rows.
    """

    def __init__(self, search: Any, enc_out: torch.Tensor, lens: torch.Tensor, rows):
        device = enc_out.device
        self.search = search
        self.stepper = search.stepper
        self.fusion = search.fusion
        self.table = search.table(device)
        self.B, self.K = enc_out.size(0), search.beam_size
        self.device = device
        self.enc_proj = self.stepper.project_enc(enc_out)  # (B, T_max, J)
        self.lens = lens
        self.utts = torch.arange(self.B, device=device)
        # every store row starts as the root (the start symbol's state)
        root = torch.zeros(rows, dtype=torch.long, device=device)
        dec_proj, state = search.start(1, device)
        self.dec_proj = dec_proj[root]  # (S, J)
        self.state = self.stepper.select_state(state, root)
        lm = search.start_lm(1, device)
        self.lm = None if lm is None else self.fusion.select(lm, root)
        self.n_nodes = 0
        size = search.initial_nodes
        self.nodes = torch.zeros(size, 4, dtype=torch.long, device=device)
        self.node_logp = torch.zeros(size, dtype=torch.float64, device=device)
        self.done = lens == 0
        self.lost = torch.zeros(self.B, dtype=torch.bool, device=device)

    def root_score(self) -> torch.Tensor:
        """(B,) float64, the root's score: 0, and the end of the sentence where the
        utterance has no frame (the root is complete)."""
        score = torch.zeros(self.B, dtype=torch.float64, device=self.device)
        if self.lm is not None:
            score += torch.where(self.done, self.lm.end[0].double(), 0.0)
        return score

    # ------------------------------------------------------------- expansion
    def expand(
        self,
        score: torch.Tensor,
        frame: torch.Tensor,
        num_sym: torch.Tensor,
        rows: torch.Tensor,
        grow: torch.Tensor,
        pinned: Optional[torch.Tensor] = None,
    ) -> Expansion:
        """One expansion of the hypotheses ``grow`` of every utterance.

        Args:
            score: (B, K) float64, the hypotheses' scores.
            frame: (B, K) long, their frames (< T_b where ``grow``).
            num_sym: (B, K) long, labels they emitted at their frame.
            rows: (B, K) long, their store rows.
            grow: (B, K) bool, the hypotheses expanded.
            pinned: (B, K) bool, hypotheses that compete as they are (no arc), or
                None.
        """
        B, K = score.shape
        flat = grow.view(-1).nonzero().squeeze(1)  # (A,)
        b_of = flat // K
        t_of = frame.reshape(-1)[flat]
        store = rows.view(-1)[flat]
        lm_labels = None if self.lm is None else self.lm.labels[store]
        nodes = RowNodes(
            self.enc_proj[b_of, t_of],
            self.dec_proj[store],
            t_of,
            self.lens[b_of],
            num_sym.view(-1)[flat],
            lm_labels,
        )
        cand = self.search.beam_candidates(self.table, nodes)
        # the W best of each hypothesis, then the K best of each utterance
        row_top, row_col = cand.score.topk(min(K, cand.score.size(1)), dim=1)
        W = row_top.size(1)
        grid = torch.full((B * K, W), NEG, dtype=torch.float64, device=self.device)
        grid[flat] = score.view(-1)[flat].unsqueeze(1) + row_top.double()
        if pinned is not None:
            grid[:, 0] = torch.where(pinned.view(-1), score.view(-1), grid[:, 0])
        top, idx = grid.view(B, K * W).topk(K, dim=1)  # (B, K)
        parent = idx // W
        row_of = torch.zeros(B * K, dtype=torch.long, device=self.device)
        row_of[flat] = torch.arange(flat.numel(), device=self.device)
        a = row_of[self.utts.unsqueeze(1) * K + parent]  # (B, K) expanded row
        col = row_col[a, idx % W] if flat.numel() else torch.zeros_like(a)
        if flat.numel():
            symbol, frames = cand.symbol[a, col], cand.frames[a, col]
            is_label = cand.is_label[a, col]
        else:
            symbol, frames = torch.zeros_like(a), torch.zeros_like(a)
            is_label = torch.zeros_like(a, dtype=torch.bool)
        lm_label = torch.zeros_like(top, dtype=torch.float32)
        if lm_labels is not None and flat.numel():
            lm_label = torch.where(is_label, lm_labels[a, symbol], 0.0)
        if pinned is None:
            is_pinned = torch.zeros_like(is_label)
        else:
            is_pinned = pinned.gather(1, parent) & (idx % W == 0)
            symbol = torch.where(is_pinned, 0, symbol)
            frames = torch.where(is_pinned, 0, frames)
            is_label = is_label & ~is_pinned
        return Expansion(top, parent, symbol, frames, is_label, is_pinned, lm_label)

    def step_expanded(
        self,
        ex: Expansion,
        kept: torch.Tensor,
        p_row: torch.Tensor,
        score: torch.Tensor,
        node: torch.Tensor,
        frame: torch.Tensor,
    ):
        """:meth:`step_labels` for the label arcs ``kept`` of an expansion (the
        frame- and step-synchronous runs').

        Args:
            ex: The expansion.
            kept: (B, K) bool, the label arcs kept.
            p_row: (B, K) long, the store rows of ``ex``'s parents.
            score: The hypotheses' scores, indexed by store row (flat).
            node, frame: (B, K) long, each candidate's parent's last node and the
                frame its arc leaves.

        Returns:
            (L,) the flat indices of ``kept``, and :meth:`step_labels` for them
            (None, None when there is none).
        """
        lab = kept.view(-1).nonzero().squeeze(1)  # (L,)
        if not lab.numel():
            return lab, None, None
        src = p_row.view(-1)[lab]
        acoustic = ex.score.view(-1)[lab] - score.view(-1)[src]
        new, ids = self.step_labels(
            src,
            ex.symbol.view(-1)[lab],
            node.reshape(-1)[lab],
            frame.reshape(-1)[lab],
            ex.frames.view(-1)[lab],
            acoustic - ex.lm_label.view(-1)[lab],
        )
        return lab, new, ids

    def step_labels(
        self,
        src: torch.Tensor,
        labels: torch.Tensor,
        node: torch.Tensor,
        frame: torch.Tensor,
        covered: torch.Tensor,
        acoustic: torch.Tensor,
    ):
        """One prediction-network (and LM) step for the L kept labels.

        Args:
            src: (L,) long, their parents' store rows.
            labels: (L,) long.
            node: (L,) long, their parents' last node.
            frame: (L,) long, the frame each label is emitted at.
            covered: (L,) long, frames its arc covers.
            acoustic: (L,) float64, its acoustic log-probability.

        Returns:
            (new states, projected outputs, LM states) of the L labels (row i: label
            i), and their (L,) node ids.
        """
        new_proj, new_state = self.stepper.step(
            labels, self.stepper.select_state(self.state, src)
        )
        new_lm = None
        if self.lm is not None:
            new_lm = self.fusion.step(labels, self.fusion.select(self.lm, src))
        ids = self._new_nodes(node, labels, frame, covered, acoustic)
        return (new_state, new_proj, new_lm), ids

    # --------------------------------------------------------------- the store
    def write_state(self, dest, idx, new) -> None:
        """Rows ``idx`` of ``new`` = (states, projected outputs, LM states) -> store
        rows ``dest``."""
        state, proj, lm = new
        stepper = self.stepper
        stepper.scatter_state(self.state, dest, stepper.select_state(state, idx))
        self.dec_proj[dest] = proj[idx]
        if self.lm is not None:
            self.fusion.scatter(self.lm, dest, self.fusion.select(lm, idx))

    def gather_store(self, rows: torch.Tensor) -> None:
        """The store becomes its rows ``rows`` ((S,) long: row i <- row rows[i])."""
        self.state = self.stepper.select_state(self.state, rows)
        self.dec_proj = self.dec_proj[rows]
        if self.lm is not None:
            self.lm = self.fusion.select(self.lm, rows)

    def stored(self):
        """The store as a ``new`` of :meth:`write_state` (to copy rows within it)."""
        return self.state, self.dec_proj, self.lm

    def _new_nodes(self, parent, label, frame, covered, logp) -> torch.Tensor:
        """Append L label nodes; returns their (L,) ids."""
        n0, L = self.n_nodes, parent.numel()
        if n0 + L > self.nodes.size(0):
            size = 2 * self.nodes.size(0)
            while size < n0 + L:
                size *= 2
            nodes = self.nodes.new_zeros(size, 4)
            nodes[:n0] = self.nodes[:n0]
            logps = self.node_logp.new_zeros(size)
            logps[:n0] = self.node_logp[:n0]
            self.nodes, self.node_logp = nodes, logps
        self.nodes[n0 : n0 + L] = torch.stack([parent, label, frame, covered], 1)
        self.node_logp[n0 : n0 + L] = logp.double()
        self.n_nodes = n0 + L
        return torch.arange(n0, n0 + L, device=self.device)

    # ---------------------------------------------------------------- results
    def ranked(
        self, entries: List[List[Tuple[float, int, int, int]]]
    ) -> List[List[Hypothesis]]:
        """The n-best of every utterance from its complete hypotheses ``(score,
        node, packed statistics, store row or -1)``."""
        search = self.search
        nodes = self.nodes[: self.n_nodes].tolist()
        logps = self.node_logp[: self.n_nodes].tolist()
        out = []
        for b, (T, lost) in enumerate(zip(self.lens.tolist(), self.lost.tolist())):
            hyps = (
                []
                if lost
                else [self._hypothesis(e, T, nodes, logps) for e in entries[b]]
            )
            out.append(search.rank(hyps)[: search.nbest])
        return out

    def _hypothesis(self, entry, T: int, nodes, logps) -> Hypothesis:
        score, node, stats, row = entry
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
        big, skipped = unpack_stats(stats)
        return Hypothesis(
            score=score,
            yseq=[self.search.blank_id] + labels,
            dec_state=state,
            dec_proj=proj,
            frame=T,
            big_blank_emissions=big,
            frames_skipped=skipped,
            lm_state=lm,
            timing=timing,
        )
