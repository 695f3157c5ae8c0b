"""Beam search of every lattice: frame-synchronous; big blanks park hypotheses ahead.

ESPnet and NeMo ship only greedy decoding for multi-blank transducers. This search
generalises the frame-synchronous transducer beam search to symbols that advance a
hypothesis by more than one frame.

State. Every hypothesis carries its own frame position t (frames consumed), its label
sequence y (starting with the standard blank, the prediction network's start symbol),
its score (log-probability) and its prediction-network state. There is one queue
``Q[t]`` per frame position t = 0..T, a dict keyed by y.

Algorithm (B = beam size)::

    Q[0] = {root}                                   # y = [blank], t = 0, score 0
    for t = 0 .. T-1:
        C = the B best hypotheses of Q[t]           # per-frame pruning
        while C is not empty:                       # expansions within frame t
            one batched joint call: log p(k | enc[t], y) for every h in C, every k
            candidates = {(h, k)} for all allowed labels k, scored score(h) + log p(k),
                and the blanks of h (blank_decision "total": one, the most probable
                allowed blank, scored score(h) + log of the allowed blanks' total;
                "symbol": every allowed blank k, scored score(h) + log p(k))
                # labels: only while h emitted < max_sym_per_frame labels at t
                # big blank i: only if t + d_i <= T (paths end exactly at T)
            keep the B best candidates over all of them (labels and blanks alike)
            drop label candidates below the B-th best score already in Q[t+1]
            blank          -> insert (y, score) into Q[t+1]
            big blank i    -> insert (y, score) into Q[t+d_i]  (parked d_i ahead)
            label k        -> y + [k] stays at frame t: one batched prediction-network
                              step; these form the next C
    return the nbest of Q[T] (by score, or score / len(y) with score_norm)

Insertion into ``Q[t']`` merges: a hypothesis whose label sequence is already queued at
the same frame position t' is the same prefix reached along a different alignment, so
the scores are log-added (the statistics kept, big-blank emissions and frames skipped,
are those of the better-scoring alignment). Hypotheses that a big blank parked at
``t + d`` skip the joint evaluations of frames t+1 .. t+d-1, which is where the
speed-up of multi-blank models comes from in beam search too.

Properties. Pooling labels and blanks of the same expansion and keeping the B best
means a hypothesis is only compared with its siblings (same frame, same parent set)
before it is queued; queued hypotheses compete only with hypotheses at the same frame
position. With B = 1 each expansion keeps exactly the symbol the greedy search emits
(same ``blank_decision``), so the search is the multi-blank greedy search (tested).
Decoding uses the plain log-softmax (the training-time sigma is not applied). Beam
search is not guaranteed to find a
better-scoring path than greedy search, but in practice (and in the tests) its 1-best
scores at least as well.

Batches. :meth:`BeamSearch.search_batch_nbest` decodes B utterances with one
joint-network call per step for every live hypothesis of every utterance (each at
its own frame), one prediction-network call (and one call of the fused LMs) for the
labels kept, finished utterances out of the work, hypotheses with the same labels at
the same frame merged (log-add), n-best lists; the lattice only gives the candidates
(the symbol table's ``beam_candidates``). ``beam_sync`` chooses the rule:

* ``"frame"`` (:mod:`.frame_sync_beam`): the frame-synchronous rule above (per-frame
  queues); the same n-best lists as :meth:`BeamSearch.search`, utterance by
  utterance;
* ``"step"`` (:mod:`.step_sync_beam`): every hypothesis takes one arc per step and the
  K best of each utterance are kept (pruning per step, as NeMo's batched beam
  searches): far fewer steps where big blanks or durations skip frames, other
  hypotheses than the frame-synchronous rule in places;
* ``"label"`` (:mod:`.label_sync_beam`): every hypothesis is a label sequence scored
  with the sum over all its alignments.

See ``docs/decoding.md`` ("Batched beam search").
"""

import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from espnet_multiblank.decoding import prefix_kernels
from espnet_multiblank.decoding.base import (
    Table,
    TransducerSearch,
    check_batch,
    check_positive_int,
)
from espnet_multiblank.decoding.frame_sync_beam import FrameSyncRun
from espnet_multiblank.decoding.greedy import GreedySearch
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.label_sync_beam import LabelSyncRun
from espnet_multiblank.decoding.step_sync_beam import StepSyncRun
from espnet_multiblank.decoding.tables import RowNodes

Queue = Dict[Tuple[int, ...], Hypothesis]

#: ``beam_sync`` values and the run of each
RUNS = {"frame": FrameSyncRun, "step": StepSyncRun, "label": LabelSyncRun}
BEAM_SYNCS = tuple(RUNS)


def check_beam_sync(value) -> str:
    if value not in RUNS:
        raise ValueError(f"beam_sync must be one of {list(BEAM_SYNCS)}, got {value!r}")
    return value


def check_frame_prune(value, beam_sync: str) -> Optional[float]:
    """``frame_prune``: None (every frame of every prefix), or nats > 0, with
    ``beam_sync: label`` only."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"frame_prune must be a number > 0 or None, got {value!r}")
    if beam_sync != "label":
        raise ValueError(
            f"frame_prune applies to beam_sync 'label' only, got beam_sync "
            f"{beam_sync!r}"
        )
    return float(value)


class BeamSearch(TransducerSearch):
    """Beam search of every lattice, every rule (see the module docstring;
    ``MultiblankBeamSearch`` and ``TDTBeamSearch`` are its former names).

    A TDT (``stepper.vocab_size`` = V + D): a candidate is an arc (token k,
    duration e_j), scored ``tok[k] + dur[j]`` (``"symbol"``) or with the token's
    total over the durations it may take (``"total"``); a label with e_j >= 1
    moves its child to frame t + e_j; with ``end_rule: "clip"`` every duration is
    allowed, clipped at T
    (:class:`~espnet_multiblank.decoding.tables.TDTSymbolTable`).

    :meth:`search` decodes one utterance (the reference implementation, in Python
    over hypothesis objects); :meth:`search_batch_nbest` decodes B utterances at
    once with the same rules and results (the module docstring's "Batches").

    Args:
        stepper, lattice, max_sym_per_frame, end_rule: see
            :class:`~espnet_multiblank.decoding.base.TransducerSearch`.
        nbest: Hypotheses :meth:`search` returns.
        beam_size: B.
        score_norm: Rank the final hypotheses by ``score / len(yseq)`` instead of
            ``score``.
        blank_decision: ``"symbol"`` (default): one candidate per allowed blank,
            scored with its own log-probability (scores are log-probabilities of the
            lattice's paths, summed over the alignments merged; a beam that prunes
            nothing returns the exact probability of every label sequence);
            ``"total"``: each hypothesis has one blank candidate, scored with the
            total log-probability of its allowed blanks and parked where the most
            probable of them lands (beam 1 is then the greedy search's default
            rule). See :mod:`~espnet_multiblank.decoding.tables` and
            ``docs/decoding.md``.
        fusion: Language models (:class:`~espnet_multiblank.decoding.ShallowFusion`):
            candidates, merging and the final ranking use the fused score (a label's
            weighted LM score added where it is emitted, the end of the sentence
            where a hypothesis reaches T), or None.
        beam_sync: ``"frame"`` (default): the frame-synchronous rule above, batched
            by :meth:`search_batch_nbest` with the same results; ``"step"``: every
            hypothesis takes one arc per step, pruned per step
            (:mod:`~espnet_multiblank.decoding.step_sync_beam`); ``"label"``: every
            hypothesis is a label sequence scored with the sum over all its
            alignments (:mod:`~espnet_multiblank.decoding.label_sync_beam`); the last
            two on one utterance or a batch alike.
        frame_prune: ``beam_sync: "label"`` only: evaluate a prefix on the frames
            where its forward sum is within this many nats of the score of a
            complete path of the utterance (the greedy one, :meth:`path_search`);
            None (default): every frame.
    """

    batched = True
    #: first capacity of a frame's overflow, per utterance (doubled when full)
    initial_overflow = 4
    #: first capacity of the node pool (doubled when full)
    initial_nodes = 1024

    def __init__(
        self,
        stepper,
        lattice,
        beam_size: int = 4,
        nbest: int = 1,
        max_sym_per_frame: int = 10,
        score_norm: bool = False,
        blank_decision: str = "symbol",
        fusion=None,
        beam_sync: str = "frame",
        frame_prune: Optional[float] = None,
        end_rule: str = "exact",
    ):
        super().__init__(
            stepper, lattice, max_sym_per_frame, blank_decision, fusion, end_rule
        )
        self.nbest = check_positive_int("nbest", nbest)
        self.beam_sync = check_beam_sync(beam_sync)
        if isinstance(beam_size, bool) or not isinstance(beam_size, int):
            raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")
        if beam_size < 1:
            raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")
        if not isinstance(score_norm, bool):
            raise TypeError(f"score_norm must be a bool, got {score_norm!r}")
        self.beam_size = beam_size
        self.score_norm = score_norm
        self.frame_prune = check_frame_prune(frame_prune, self.beam_sync)
        if self.end_rule != "exact" and beam_sync == "label":
            raise ValueError(
                "beam_sync 'label' scores the loss's lattice, whose paths end "
                f"exactly on T: end_rule must be 'exact', got {end_rule!r}"
            )
        self._path_search = None  # built on first use (path_search)
        if self.beam_sync == "label":  # its Numba kernels compiled with the model
            prefix_kernels.prepare()

    def path_search(self):
        """The greedy search whose path scores bound ``frame_prune``'s floor: the
        arg-max arc at every step (``blank_decision: "symbol"``: its score is the
        log-probability of one path of the lattice, plus the fused LMs' weighted
        log P(y </s>))."""
        if self._path_search is None:
            # its paths end as this search's do (end_rule), one path's score each
            self._path_search = GreedySearch(**self.settings(blank_decision="symbol"))
        return self._path_search

    def rank(self, hyps: List[Hypothesis]) -> List[Hypothesis]:
        """Final ranking, best first: by score, or by score / len(yseq) (every
        rule's n-best lists)."""
        if self.score_norm:
            return sorted(hyps, key=lambda h: h.score / len(h.yseq), reverse=True)
        return sorted(hyps, key=lambda h: h.score, reverse=True)

    def _enqueue(self, queues: List[Optional[Queue]], hyp: Hypothesis) -> None:
        """Insert ``hyp`` into the queue of its frame; a hypothesis that completes the
        path (frame T) gets the fused end-of-sentence score first."""
        if hyp.lm_state is not None and hyp.frame == len(queues) - 1:
            hyp.score += float(hyp.lm_state.end[0])
        self._insert(queues[hyp.frame], hyp)

    @staticmethod
    def _insert(queue: Queue, hyp: Hypothesis) -> None:
        """Insert into a frame queue, log-adding the scores of equal label sequences
        (with an LM their LM scores are equal: the LM state depends on the labels
        only)."""
        key = tuple(hyp.yseq)
        old = queue.get(key)
        if old is None:
            queue[key] = hyp
            return
        total = float(np.logaddexp(old.score, hyp.score))
        if hyp.score > old.score:
            queue[key] = hyp
        queue[key].score = total

    @torch.no_grad()
    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        """Beam search for one utterance.

        Args:
            enc_out: (T, D_enc) encoder output.

        Returns:
            Up to ``nbest`` hypotheses, best first.
        """
        if self.beam_sync != "frame":  # one utterance as a batch of one
            length = torch.tensor([enc_out.size(0)], device=enc_out.device)
            return self.search_batch_nbest(enc_out.unsqueeze(0), length)[0]
        return self.nbest_projected(self.stepper.project_enc(enc_out))

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
            hypotheses, best first (``beam_sync: "frame"``: those of :meth:`search`
            on the utterance alone); an empty list when no path survived (e.g.
            non-finite network outputs).
        """
        lens = check_batch(enc_out, enc_lens)
        if enc_out.size(0) == 0:
            return []
        run = RUNS[self.beam_sync](self, enc_out, lens)
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

    @torch.no_grad()
    def nbest_projected(self, enc_proj: torch.Tensor) -> List[Hypothesis]:
        """:meth:`search` (one utterance, n-best) on encoder frames already
        projected by ``stepper.project_enc`` ((T, J)): what the streaming search
        runs chunk by chunk (:meth:`start_queues`, :meth:`run_frames`,
        :meth:`final_hypotheses`). (``search_projected`` of the greedy searches is
        a batch with lengths, 1-best each.)"""
        T = enc_proj.size(0)
        queues = self.start_queues(enc_proj.device, T)
        self.run_frames(queues, enc_proj, 0, T)
        return self.final_hypotheses(queues)

    def start_queues(self, device: torch.device, frames: int) -> List[Optional[Queue]]:
        """``Q[0] = {root}`` and empty queues up to frame ``frames`` (the utterance's
        T; a complete hypothesis lands in ``Q[len(queues) - 1]``)."""
        dec_proj, state = self.start(1, device)
        root = Hypothesis(
            score=0.0,
            yseq=[self.blank_id],
            dec_state=state,
            dec_proj=dec_proj[0],
            lm_state=self.start_lm(1, device),
        )
        queues: List[Optional[Queue]] = [dict() for _ in range(frames + 1)]
        queues[0][tuple(root.yseq)] = root
        return queues

    def run_frames(
        self,
        queues: List[Optional[Queue]],
        enc_proj: torch.Tensor,
        first: int,
        stop: int,
    ) -> None:
        """Expand the hypotheses of frames ``first .. stop - 1`` (in place).

        Args:
            queues: One queue per frame position (``len(queues) - 1`` = T, the T the
                end rule sees: a stream's frames received, ``docs/streaming.md``).
            enc_proj: (>= stop, J) projected encoder frames.
        """
        device = enc_proj.device
        table = self.table(device)
        B = self.beam_size
        length = torch.tensor([len(queues) - 1], device=device)
        for t in range(first, stop):
            queue = queues[t]
            queues[t] = None
            if not queue:
                continue
            # per-frame cut: only the B best hypotheses at this frame are expanded
            current = sorted(queue.values(), key=lambda h: h.score, reverse=True)[:B]
            while current:
                current = self._expand(current, t, enc_proj[t], length, table, queues)

    def final_hypotheses(self, queues: List[Optional[Queue]]) -> List[Hypothesis]:
        """The ``nbest`` complete hypotheses (those of ``Q[T]``), best first."""
        T = len(queues) - 1
        if T == 0:  # nothing was expanded: the root, with the end of the sentence
            (root,) = queues[0].values()
            if root.lm_state is not None:
                root.score += float(root.lm_state.end[0])
            return [root]
        return self.rank(list(queues[T].values()))[: self.nbest]

    def _expand(
        self,
        current: List[Hypothesis],
        t: int,
        enc_proj_t: torch.Tensor,
        length: torch.Tensor,
        table: Table,
        queues: List[Optional[Queue]],
    ) -> List[Hypothesis]:
        """Expand the hypotheses of frame t once: the B best candidates of all of
        them (:meth:`beam_candidates`, the batched searches' own); queue the arcs
        that move (blanks, and a TDT's labels with a duration >= 1), return the label
        children that stay at t.

        Args:
            current: A hypotheses at frame t.
            enc_proj_t: (J,) projected encoder frame t.
            length: (1,) long, T.
        """
        A = len(current)
        device = enc_proj_t.device
        nodes = RowNodes(
            enc_proj_t.expand(A, -1),
            torch.stack([h.dec_proj for h in current]),  # (A, J)
            torch.full((A,), t, dtype=torch.long, device=device),
            length.expand(A),
            torch.tensor([h.num_sym_frame for h in current], device=device),
            None if self.fusion is None else self._lm_labels(current),
        )
        cand = self.beam_candidates(table, nodes)  # (A, N)
        base = torch.tensor([h.score for h in current], dtype=torch.float64)
        scores = base.to(device).unsqueeze(1) + cand.score.double()
        N = scores.size(1)
        top_scores, top_idx = scores.view(-1).topk(min(self.beam_size, A * N))
        # the kept arcs' symbols and frames in one host transfer
        picked = torch.stack([cand.symbol, cand.frames]).view(2, -1)[:, top_idx]

        floor = self._label_floor(queues, t)
        is_blank = self.lattice.is_blank
        labels, label_frames = [], []  # (parent index, symbol, score), frames
        for score, flat, k, frames in zip(
            top_scores.tolist(), top_idx.tolist(), *picked.tolist()
        ):
            if not math.isfinite(score):  # not allowed
                continue
            a = flat // N
            if is_blank(k):
                self._queue_blank(queues, current[a], score, t, frames)
            elif frames > 0 or score >= floor:
                labels.append((a, k, score))
                label_frames.append(frames)
        staying = []
        for child, frames in zip(
            self._label_children(current, labels, t), label_frames
        ):
            if frames == 0:
                staying.append(child)
            else:  # a TDT label that moves on
                child.timing[-1] = (t, frames, child.timing[-1][2])
                child.advance(frames, is_label=True)
                self._enqueue(queues, child)
        return staying

    def _lm_labels(self, current: List[Hypothesis]) -> torch.Tensor:
        """(A, V) float32 weighted LM scores of the next label of each hypothesis."""
        return torch.cat([h.lm_state.labels for h in current])

    def _label_floor(self, queues: List[Optional[Queue]], t: int) -> float:
        """The score a label that stays at frame t must reach: that of the B-th best
        hypothesis already queued at frame t + 1 (-inf while fewer are queued)."""
        nxt = queues[t + 1] if t + 1 < len(queues) else None
        if nxt is None or len(nxt) < self.beam_size:
            return float("-inf")
        return sorted((h.score for h in nxt.values()), reverse=True)[self.beam_size - 1]

    def _queue_blank(
        self,
        queues: List[Optional[Queue]],
        parent: Hypothesis,
        score: float,
        t: int,
        frames: int,
    ) -> None:
        """Queue ``parent`` extended by a blank arc from frame t covering ``frames``
        frames (labels unchanged, the prediction network not run)."""
        child = Hypothesis(
            score=score,
            yseq=parent.yseq,
            dec_state=parent.dec_state,
            dec_proj=parent.dec_proj,
            frame=t,
            big_blank_emissions=parent.big_blank_emissions,
            frames_skipped=parent.frames_skipped,
            lm_state=parent.lm_state,  # a blank leaves the language models as they are
            timing=parent.timing,
        )
        child.advance(frames)
        self._enqueue(queues, child)

    def _label_children(
        self,
        current: List[Hypothesis],
        labels: List[Tuple[int, int, float]],
        t: int,
    ) -> List[Hypothesis]:
        """The children of the label arcs ``labels`` (parent index, symbol, score), at
        frame t, after one prediction-network step (and one step of the fused language
        models) for all of them."""
        if not labels:
            return []
        stepper = self.stepper
        device = current[0].dec_proj.device
        states = stepper.cat_states([current[a].dec_state for a, _, _ in labels])
        symbols = torch.tensor([k for _, k, _ in labels], device=device)
        new_proj, new_state = stepper.step(symbols, states)  # (L, J)
        fusion = self.fusion
        if fusion is not None:
            lm = fusion.step(
                symbols, fusion.cat([current[a].lm_state for a, _, _ in labels])
            )
        children = []
        rows = torch.arange(len(labels), device=device)
        for j, (a, k, score) in enumerate(labels):
            parent = current[a]
            row = rows[j : j + 1]  # a view: cheaper than a new tensor per child
            # the arc's acoustic log-probability (for timing): its LM part left out
            acoustic = score - parent.score
            if fusion is not None:
                acoustic -= float(parent.lm_state.labels[0, k])
            children.append(
                Hypothesis(
                    score=score,
                    yseq=parent.yseq + [k],
                    dec_state=stepper.select_state(new_state, row),
                    dec_proj=new_proj[j],
                    frame=t,
                    num_sym_frame=parent.num_sym_frame + 1,
                    big_blank_emissions=parent.big_blank_emissions,
                    frames_skipped=parent.frames_skipped,
                    lm_state=None if fusion is None else fusion.select(lm, row),
                    timing=parent.timing + [(t, 0, acoustic)],
                )
            )
        return children
