"""Multi-blank greedy search (frame-looping), one utterance and batched.

Algorithm (Xu et al. 2023, "multi-blank greedy"; ``docs/decoding.md``): a hypothesis
sits at frame t with label history y and emits one allowed symbol k of
``log_softmax(joint(enc[t], pred(y)))``, decided by ``blank_decision``
(:mod:`~espnet_multiblank.decoding.multiblank_table`; default ``"total"``: a blank
when the allowed blanks together are at least as probable as the best label, then the
most probable blank; ``"symbol"``: the arg-max symbol):

* a label: y <- y + [k], the prediction network advances, t stays (at most
  ``max_sym_per_frame`` labels per frame; after that only blanks are allowed);
* the standard blank: t <- t + 1;
* big blank i: t <- t + d_i (d_i - 1 frames are never evaluated); big blanks that would
  jump past the last frame (t + d_i > T) are not allowed, so the path is a path of the
  loss's lattice and its score is that path's log-probability.

It stops when t == T. The batched version takes the same step for every active
utterance at once (one joint call; one prediction-network call for the rows that
emitted a label); each utterance has its own t and leaves when it reaches its T. Both
choose the same symbols (tested).
"""

from typing import List

import torch

from espnet_multiblank.decoding.base import FrameLoopingGreedySearch
from espnet_multiblank.decoding.multiblank_table import log_sum_exp
from espnet_multiblank.decoding.one_run import OneRun
from espnet_multiblank.decoding.row_step import MultiblankRowStep


class MultiblankGreedySearch(MultiblankRowStep, FrameLoopingGreedySearch):
    """Multi-blank greedy search (standard greedy search without big blanks).

    Args: those of :class:`~espnet_multiblank.decoding.base.FrameLoopingGreedySearch`
    (``blank_decision``: ``"total"`` (default) or ``"symbol"``).
    """

    @torch.no_grad()
    def run_one(
        self, run: OneRun, enc_proj: torch.Tensor, length: int, final: bool = True
    ):
        """The one-utterance loop (see :meth:`FrameLoopingGreedySearch.run_one`)."""
        device = enc_proj.device
        table = self.table(device)
        stepper = self.stepper
        R = table.max_frames
        run.fold(length, final, R)
        hyp, dec_proj, state, lm = run.hyp, run.dec_proj, run.state, run.lm
        max_sym = self.max_sym_per_frame
        # up to this frame every big blank fits: no mask needed while labels are allowed
        free_until = length - R
        masks = None  # (2 (R + 1), V) additive masks, by guard and frames left
        total = self.blank_decision == "total"
        lo, hi = table.blank_range
        frames_list = table.frames_list
        cache = run.cache
        while hyp.frame < length:
            t = hyp.frame
            tail = t > free_until  # near the last frame: other runs may take it
            info = key = None  # [log-probs, what _early_step derived] (a stream's)
            if cache is not None and t >= cache.low:
                key = cache.key(hyp)
                info = cache.steps.get(key)
            if info is not None:
                logp = info[0]
            else:
                logp = stepper.log_probs(enc_proj[t : t + 1], dec_proj)  # (1, V)
                if lm is not None:  # fused scores of the labels (the blanks' are 0)
                    logp = logp + lm.labels
                if cache is not None and tail:
                    info = [logp, None]
                    cache.put_step(cache.key(hyp) if key is None else key, info)
            guarded = hyp.num_sym_frame >= max_sym
            if not final and tail:  # T decides which big blanks fit
                if guarded and masks is None:
                    masks = table.mask_rows(max_sym).to(logp.dtype)
                step = self._early_step(table, logp, masks, guarded, length - t, info)
                if step is None:
                    break  # this step waits for more frames
                k, frames, term = step
                if isinstance(term, dict):
                    run.terms.append((t, term, None))
                else:
                    run.add(term)
            else:
                if t <= free_until and not guarded:
                    masked = logp
                else:
                    if masks is None:
                        masks = table.mask_rows(max_sym).to(logp.dtype)
                    masked = logp + masks[guarded * (R + 1) + min(length - t, R)]
                k = int(masked[0].argmax())
                frames = frames_list[k]
                if total:
                    blanks = masked[0, lo:hi].tolist()
                    blank_lp = log_sum_exp(blanks)
                    if frames == 0 and float(logp[0, k]) <= blank_lp:
                        k = lo + blanks.index(max(blanks))
                        frames = frames_list[k]
                    run.add(blank_lp if frames else float(logp[0, k]))
                else:
                    run.add(float(logp[0, k]))
            if frames == 0:
                lm_k = 0.0 if lm is None else float(lm.labels[0, k])
                hyp.timing.append((t, 0, float(logp[0, k]) - lm_k))
                hyp.yseq.append(k)
                hyp.num_sym_frame += 1
                dec_proj, state, lm = self.emit_one(
                    run, k, dec_proj, state, lm, device, tail
                )
            else:
                hyp.advance(frames)
        run.dec_proj, run.state, run.lm = dec_proj, state, lm

    def _early_step(self, table, logp, masks, guarded: bool, room: int, info=None):
        """The step at a frame t with ``room`` = N - t < R frames received after it,
        when every T >= N takes it, else None: ``(symbol, frames, score)``, the
        score a float, or ``{min(T - t, R): score}`` when T decides it.

        The arcs T allows at t grow with T (the big blanks that fit). ``symbol``:
        the best arc over all of them is chosen for every T when it fits in
        ``room``. ``total``: a label is chosen for every T when it beats the total
        of all blanks, a blank when the best label does not beat the total of the
        blanks that fit in ``room`` and the best blank fits (the most probable of a
        set is the most probable of any subset it belongs to).

        ``info``: the step's cache entry; what is derived from ``logp`` is kept in
        ``info[1]`` for when the step is evaluated again with more frames."""
        R = table.max_frames
        lo, hi = table.blank_range
        frames_list = table.frames_list
        derived = None if info is None else info[1]
        if derived is None:
            masked = logp if not guarded else logp + masks[R + 1 + R]  # every blank
            k = int(masked[0].argmax())
            frames = frames_list[k]
            blank = None  # (most probable blank, the blanks' log-probs, totals by room)
            if self.blank_decision == "total":
                blanks = masked[0, lo:hi].tolist()
                if not (frames == 0 and float(logp[0, k]) > log_sum_exp(blanks)):
                    totals = _BlankTotals(blanks, frames_list[lo:hi])
                    blank = (lo + blanks.index(max(blanks)), blanks, totals)
            derived = (k, frames, float(logp[0, k]), blank)
            if info is not None:
                info[1] = derived
        k, frames, score, blank = derived
        if self.blank_decision != "total":
            return (k, frames, score) if frames <= room else None
        if blank is None:  # a label beats every blank
            return k, 0, score
        b, blanks, totals = blank
        if frames_list[b] > room:
            return None
        # the best label: k when k is a label; when the best symbol k is a blank
        # (then k = b, which fits), no label beats it nor the total it belongs to
        best_label = score if frames == 0 else float("-inf")
        if not best_label <= totals[room]:
            return None
        return b, frames_list[b], totals


class _BlankTotals(dict):
    """{min(T - t, R): log of the summed probabilities of the blanks that fit},
    each computed when first read, as the offline step computes it (the blanks that
    do not fit at -inf)."""

    def __init__(self, blanks: List[float], frames: List[int]):
        super().__init__()
        self.blanks, self.frames = blanks, frames

    def __missing__(self, room: int) -> float:
        neg = float("-inf")
        value = log_sum_exp(
            [x if d <= room else neg for x, d in zip(self.blanks, self.frames)]
        )
        self[room] = value
        return value
