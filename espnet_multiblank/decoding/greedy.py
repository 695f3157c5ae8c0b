"""Greedy search (frame-looping) of every lattice, one utterance and batched.

Algorithm (Xu et al. 2023, "multi-blank greedy"; ``docs/decoding.md``): a hypothesis
sits at frame t with label history y and emits one allowed symbol k of
``log_softmax(joint(enc[t], pred(y)))``, decided by ``blank_decision``
(:mod:`~espnet_multiblank.decoding.tables`; default ``"total"``: a blank
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

A token-and-duration transducer (TDT; ``docs/decoding.md``, "TDT searches") takes the
same loop with (token, duration) arcs: the joint network gives token log-probabilities
``tok`` (V) and duration log-probabilities ``dur`` (D), and the search emits one
allowed arc (token k, duration e_j) chosen by ``blank_decision``
(:mod:`~espnet_multiblank.decoding.tables`): ``"total"`` (default) the most
probable token, each counted with the total probability of the durations it may take,
then its most probable allowed duration; ``"symbol"`` the most probable allowed arc
``tok[k] + dur[j]``. Allowed: a blank takes durations >= 1 that do not pass T; a label
takes durations that land before T (>= 1 once ``max_sym_per_frame`` labels stayed at
this frame). A label extends y; every arc moves t to ``t + e_j``; the hypothesis ends
when it reaches T, always with a blank, as a path of the loss's lattice.

Differences from NeMo's TDT greedy search (token arg-max first, then duration
arg-max; a blank with duration 0 moved by one frame; durations that overshoot T end
the utterance): here a token counts with the durations it may take (a blank's
probability excludes duration 0), and a path ends with a blank landing on T.

The step of each lattice is its symbol table's (``one_outputs``, ``one_choice``);
the loop, the stream's early decisions and the bookkeeping are here, once.
"""

import torch

from espnet_multiblank.decoding.base import FrameLoopingGreedySearch
from espnet_multiblank.decoding.one_run import OneRun
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice, decide_early

#: the TDT searches' default ``blank_decision`` (chosen on the digits dev set; that
#: of every greedy search)
TDT_GREEDY_DECISION = "total"


class GreedySearch(FrameLoopingGreedySearch):
    """Greedy search of any lattice (see the module docstring).

    Args: those of :class:`~espnet_multiblank.decoding.base.FrameLoopingGreedySearch`
    (``blank_decision``: ``"total"`` (default) or ``"symbol"``; ``end_rule``: the
    lattice's ``"exact"``, or for a TDT ``"clip"``: every duration allowed, clipped at
    T, :class:`~espnet_multiblank.decoding.tables.TDTSymbolTable`). With a TDT
    (``stepper.vocab_size`` = V + D) ``max_sym_per_frame`` counts the labels that
    stay (duration 0) at one frame; after that every emission moves on.
    """

    lattice_types = (MultiblankLattice, TDTLattice)

    @torch.no_grad()
    def run_one(
        self, run: OneRun, enc_proj: torch.Tensor, length: int, final: bool = True
    ):
        """The one-utterance loop (see :meth:`FrameLoopingGreedySearch.run_one`;
        the same arcs as the table's ``best_arcs``)."""
        device = enc_proj.device
        table = self.table(device)
        stepper = self.stepper
        cap = self.lattice.room_cap  # the step depends on T via min(T - t, cap)
        max_sym = self.max_sym_per_frame
        decision = self.blank_decision
        run.fold(length, final, cap)
        hyp, dec_proj, state, lm = run.hyp, run.dec_proj, run.state, run.lm
        cache = run.cache
        one_outputs, one_choice = table.one_outputs, table.one_choice

        def choose(info, guarded: bool, room: int):
            """The table's choice with min(T - t, cap) = ``room``, kept in the
            step's ``info`` (a stream evaluates a step again with more frames)."""
            choices = info[1]
            out = choices.get(room)
            if out is None:
                out = one_choice(info[0], room, guarded, max_sym, decision)
                choices[room] = out
            return out

        while hyp.frame < length:
            t = hyp.frame
            tail = t > length - cap  # near the last frame: other runs may take it
            info = key = None  # a stream's [joint outputs, choices by room]
            if cache is not None and t >= cache.low:
                key = cache.key(hyp)
                info = cache.steps.get(key)
            if info is None:
                outputs = one_outputs(
                    stepper, enc_proj[t : t + 1], dec_proj, lm, decision
                )
                if cache is not None:
                    info = [outputs, {}]
                    if tail:
                        cache.put_step(cache.key(hyp) if key is None else key, info)
            else:
                outputs = info[0]
            guarded = hyp.num_sym_frame >= max_sym
            room = length - t
            if final or room >= cap:
                if info is None:  # offline: every step is taken once
                    choice = one_choice(
                        outputs, min(room, cap), guarded, max_sym, decision
                    )
                else:
                    choice = choose(info, guarded, min(room, cap))
                is_label, k, _, frames, score = choice
                pending = None
            else:  # T decides which arcs fit: taken if every T >= N agrees
                if info is None:
                    info = [outputs, {}]
                early = decide_early(lambda r: choose(info, guarded, r), room, cap)
                if early is None:
                    break  # this step waits for more frames
                (is_label, k, _, frames, score), pending = early
            if is_label:
                hyp.yseq.append(k)
                lm_k = 0.0 if lm is None else float(lm.labels[0, k])
                if pending is None:
                    run.add(score)
                else:
                    run.terms.append((t, pending, (len(hyp.timing), frames, lm_k)))
                hyp.timing.append((t, frames, score - lm_k))
                dec_proj, state, lm = self.emit_one(
                    run, k, dec_proj, state, lm, device, tail
                )
                if frames == 0:
                    hyp.num_sym_frame += 1
                else:
                    hyp.advance(frames, is_label=True)
            else:
                if pending is None:
                    run.add(score)
                else:
                    run.terms.append((t, pending, None))
                hyp.advance(frames)
        run.dec_proj, run.state, run.lm = dec_proj, state, lm


class MultiblankGreedySearch(GreedySearch):
    """:class:`GreedySearch` of a standard or multi-blank lattice (the former
    class: it accepts those lattices only)."""

    lattice_types = (MultiblankLattice,)


class TDTGreedySearch(GreedySearch):
    """:class:`GreedySearch` of a :class:`~espnet_multiblank.lattice.TDTLattice`
    (the former class: it accepts TDT lattices only)."""

    lattice_types = (TDTLattice,)
