"""TDT beam search: the multi-blank beam search with (token, duration) arcs.

The frame-synchronous beam search of :mod:`espnet_multiblank.decoding.beam` (one queue
``Q[t]`` per frame position, keyed by the label sequence, merging by log-add, per-frame
top-B cut) with the arcs of a token-and-duration transducer (``docs/decoding.md``,
"TDT searches"). An expansion of the hypotheses C at frame t scores every candidate of
every hypothesis h (:meth:`TDTSymbolTable.candidates`: with ``blank_decision:
"symbol"`` every allowed arc (token k, duration e_j), scored ``score(h) + tok[k] +
dur[j]``; with ``"total"`` one per token, scored with its total over the durations it
may take and placed at its most probable one) and keeps the B best of all of them;
then

* blank, duration e          -> insert (y, score) into Q[t + e];
* label k, duration e >= 1   -> y + [k] (one batched prediction-network step for all
                                kept labels), inserted into Q[t + e];
* label k, duration 0        -> y + [k] stays at frame t and forms the next C, unless
                                it scores below the B-th best hypothesis already in
                                Q[t + 1].

Allowed arcs are those of the greedy search (a blank takes durations >= 1 up to T, a
label lands before T, ``max_sym_per_frame`` labels at most stay at one frame). With
B = 1 each expansion keeps the greedy search's arc (same ``blank_decision``).
"""

from typing import List, Optional

import torch

from espnet_multiblank.decoding.beam import MultiblankBeamSearch, Queue
from espnet_multiblank.decoding.beam_step import TDTBeamStep
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.row_step import TDTRowStep
from espnet_multiblank.decoding.tdt_greedy import TDTGreedySearch
from espnet_multiblank.decoding.tdt_table import TDTSymbolTable

#: the TDT beam search's default ``blank_decision`` (chosen on the digits dev set)
TDT_BEAM_DECISION = "symbol"


class TDTBeamSearch(TDTBeamStep, TDTRowStep, MultiblankBeamSearch):
    """Frame-synchronous TDT beam search (see the module docstring).

    Args: those of :class:`~espnet_multiblank.decoding.MultiblankBeamSearch`, with a
    :class:`~espnet_multiblank.lattice.TDTLattice` (``stepper.vocab_size`` = V + D);
    ``blank_decision`` (default ``"symbol"``: a beam that prunes nothing returns the
    exact probability of every label sequence) and ``end_rule`` as for
    :class:`~espnet_multiblank.decoding.TDTGreedySearch`; ``beam_sync`` as for
    :class:`~espnet_multiblank.decoding.MultiblankBeamSearch`.
    """

    def __init__(
        self,
        stepper,
        lattice,
        beam_size: int = 4,
        nbest: int = 1,
        max_sym_per_frame: int = 10,
        score_norm: bool = False,
        blank_decision: str = TDT_BEAM_DECISION,
        end_rule: str = "exact",
        fusion=None,
        beam_sync: str = "frame",
        frame_prune: Optional[float] = None,
    ):
        super().__init__(
            stepper,
            lattice,
            beam_size=beam_size,
            nbest=nbest,
            max_sym_per_frame=max_sym_per_frame,
            score_norm=score_norm,
            blank_decision=blank_decision,
            fusion=fusion,
            beam_sync=beam_sync,
            frame_prune=frame_prune,
        )
        self._set_end_rule(end_rule)
        if self.end_rule != "exact" and beam_sync == "label":
            raise ValueError(
                "beam_sync 'label' scores the loss's lattice, whose paths end "
                f"exactly on T: end_rule must be 'exact', got {end_rule!r}"
            )

    greedy_class = TDTGreedySearch

    def greedy_options(self) -> dict:
        """The greedy path of ``frame_prune``'s floor ends as this search's paths do."""
        return {"end_rule": self.end_rule}

    def _expand(
        self,
        current: List[Hypothesis],
        t: int,
        enc_proj_t: torch.Tensor,
        length: torch.Tensor,
        table: TDTSymbolTable,
        queues: List[Optional[Queue]],
    ) -> List[Hypothesis]:
        """Expand the hypotheses of frame t once; queue the arcs that move, return the
        label children that stay at t.

        Args:
            current: A hypotheses at frame t.
            enc_proj_t: (J,) projected encoder frame t.
            length: (1,) long, T.
        """
        stepper = self.stepper
        B = self.beam_size
        A = len(current)
        T = len(queues) - 1
        device = enc_proj_t.device
        dec_proj = torch.stack([h.dec_proj for h in current])  # (A, J)
        tok, dur = table.log_probs(stepper.joint(enc_proj_t.expand(A, -1), dec_proj))
        if self.fusion is not None:  # the labels' fused scores (the blank's is 0)
            tok = tok + self._lm_labels(current)
        guard = torch.tensor(
            [h.num_sym_frame >= self.max_sym_per_frame for h in current], device=device
        )
        room = torch.full((A,), T - t, dtype=torch.long, device=device)
        scores, tokens, slots = table.candidates(
            tok, dur, room, guard, self.blank_decision
        )  # (A, N)
        base = torch.tensor([h.score for h in current], dtype=torch.float64)
        cand = base.to(device).unsqueeze(1) + scores.double()
        N = cand.size(1)
        top_scores, top_idx = cand.view(-1).topk(min(B, A * N))
        keep = torch.isfinite(top_scores)
        top_idx = top_idx[keep]
        top_scores = top_scores[keep].tolist()
        top_tokens = tokens.reshape(-1)[top_idx].tolist()
        top_slots = slots.reshape(-1)[top_idx].tolist()
        top_rows = (top_idx // N).tolist()

        floor = self._label_floor(queues, t)
        labels, label_frames = [], []  # (parent index, token, score), frames
        for score, a, k, j in zip(top_scores, top_rows, top_tokens, top_slots):
            frames = min(table.durations_list[j], T - t)
            if k != table.blank:
                if frames > 0 or score >= floor:
                    labels.append((a, k, score))
                    label_frames.append(frames)
            else:
                self._queue_blank(queues, current[a], score, t, frames)
        staying = []
        for child, frames in zip(
            self._label_children(current, labels, t), label_frames
        ):
            if frames == 0:
                staying.append(child)
            else:
                child.timing[-1] = (t, frames, child.timing[-1][2])
                child.advance(frames, is_label=True)
                self._enqueue(queues, child)
        return staying
