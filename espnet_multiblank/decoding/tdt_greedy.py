"""Token-and-duration transducer (TDT) greedy search, one utterance and batched.

Algorithm (``docs/decoding.md``, "TDT searches"): a hypothesis sits at frame t with
label history y. The joint network gives token log-probabilities ``tok`` (V) and
duration log-probabilities ``dur`` (D) for ``(enc[t], pred(y))``, and the search emits
one allowed arc (token k, duration e_j), chosen by ``blank_decision``
(:mod:`~espnet_multiblank.decoding.tdt_table`): ``"total"`` (default) the most probable
token, each counted with the total probability of the durations it may take, then its
most probable allowed duration; ``"symbol"`` the most probable allowed arc
``tok[k] + dur[j]``. Allowed: a blank takes durations >= 1 that do not pass T; a label
takes durations that land before T (>= 1 once ``max_sym_per_frame`` labels stayed at
this frame). A label extends y (the prediction network advances); every arc moves t
to ``t + e_j``; the hypothesis ends when it reaches T, always with a blank, as a path
of the loss's lattice.

The batched search takes the same step for every active utterance at once (one joint
call; one prediction-network call for the rows that emitted a label), each utterance
advancing by its own duration; both choose the same arcs (tested).

Differences from NeMo's TDT greedy search (token arg-max first, then duration
arg-max; a blank with duration 0 moved by one frame; durations that overshoot T end
the utterance): here a token counts with the durations it may take (a blank's
probability excludes duration 0), and a path ends with a blank landing on T.
"""

import math

import torch

from espnet_multiblank.decoding.base import FrameLoopingGreedySearch
from espnet_multiblank.decoding.multiblank_table import log_sum_exp
from espnet_multiblank.decoding.one_run import OneRun
from espnet_multiblank.decoding.row_step import TDTRowStep
from espnet_multiblank.decoding.tdt_table import TDTSymbolTable
from espnet_multiblank.lattice import TDTLattice

#: the TDT searches' default ``blank_decision`` (chosen on the digits dev set)
TDT_GREEDY_DECISION = "total"


class TDTGreedySearch(TDTRowStep, FrameLoopingGreedySearch):
    """TDT greedy search (see the module docstring).

    Args: those of :class:`~espnet_multiblank.decoding.base.TransducerSearch` with a
    :class:`~espnet_multiblank.lattice.TDTLattice` (``stepper.vocab_size`` = V + D;
    ``nbest`` is 1). ``max_sym_per_frame``: labels that may stay (duration 0) at one
    frame; after that every emission moves on. ``blank_decision``: ``"total"``
    (default) or ``"symbol"``. ``end_rule``: ``"exact"`` (default, the lattice's) or
    ``"clip"`` (every duration allowed, clipped at T;
    :class:`~espnet_multiblank.decoding.tdt_table.TDTSymbolTable`).
    """

    def __init__(
        self,
        stepper,
        lattice: TDTLattice,
        max_sym_per_frame: int = 10,
        blank_decision: str = TDT_GREEDY_DECISION,
        end_rule: str = "exact",
        fusion=None,
    ):
        super().__init__(
            stepper, lattice, max_sym_per_frame, blank_decision, fusion=fusion
        )
        self._set_end_rule(end_rule)

    def _slot_sets(self, table: TDTSymbolTable):
        """{(min(T - t, R + 1), guarded): (blank slots, label slots)}: the allowed
        duration slots as Python lists, from :meth:`TDTSymbolTable.allowed` (cached
        with the table)."""
        cached = getattr(table, "_greedy_slot_sets", None)
        if cached is not None and cached[0] == self.max_sym_per_frame:
            return cached[1]
        R = table.max_frames
        room = torch.arange(1, R + 2, device=table.durations.device).repeat(2)
        guard = torch.arange(room.numel(), device=room.device) >= R + 1
        blank_ok, label_ok = table.allowed(room, guard)
        out = {}
        for r, g, b, lab in zip(
            room.tolist(), guard.tolist(), blank_ok.tolist(), label_ok.tolist()
        ):
            out[r, g] = (
                [j for j, ok in enumerate(b) if ok],
                [j for j, ok in enumerate(lab) if ok],
            )
        table._greedy_slot_sets = (self.max_sym_per_frame, out)
        return out

    @torch.no_grad()
    def run_one(
        self, run: OneRun, enc_proj: torch.Tensor, length: int, final: bool = True
    ):
        """The one-utterance loop (see :meth:`FrameLoopingGreedySearch.run_one`;
        the same arcs as :meth:`TDTSymbolTable.best_arcs`)."""
        device = enc_proj.device
        table = self.table(device)
        V, blank = table.num_tokens, table.blank
        durations = table.durations_list
        slot_sets = self._slot_sets(table)
        R1 = table.max_frames + 1
        max_sym = self.max_sym_per_frame
        total = self.blank_decision == "total"
        neg = float("-inf")
        run.fold(length, final, R1)

        def best(raw, ex, slots):
            """(score, slot) of the allowed durations: their total (log of the sum of
            their exp(raw - max) ``ex``) or the best one's raw logit; the duration
            log-normaliser is subtracted by the caller."""
            if not slots:
                return neg, -1
            j = max(slots, key=raw.__getitem__)
            if not total:
                return raw[j], j
            mass = sum([ex[i] for i in slots])
            if mass > 0.0:
                return math.log(mass), j
            # every allowed duration underflowed next to the best one: exact, slower
            top = max(raw)
            return log_sum_exp([raw[i] - top for i in slots]), j

        hyp, dec_proj, state, lm = run.hyp, run.dec_proj, run.state, run.lm
        cache = run.cache
        while hyp.frame < length:
            t = hyp.frame
            # [joint outputs, the blank token's score once read, choose() by room]
            tail = t > length - R1  # near the last frame: other runs may take it
            info = key = None
            if cache is not None and t >= cache.low:
                key = cache.key(hyp)
                info = cache.steps.get(key)
            if info is None:
                outputs = self._step_outputs(enc_proj[t : t + 1], dec_proj, lm)
                info = [outputs, None, {}]
                if cache is not None and tail:
                    cache.put_step(cache.key(hyp) if key is None else key, info)
            raw, ex, norm, tok, best_tokens = info[0]
            guarded = hyp.num_sym_frame >= max_sym
            blank_tok_of = info  # info[1]: the blank token's score, read once

            def choose(room):
                """(is label, token, duration slot, frames, score) of the step with
                min(T - t, R + 1) = ``room``."""
                done = info[2].get(room)
                if done is not None:
                    return done
                info[2][room] = out = choose_new(room)
                return out

            def choose_new(room):
                blank_slots, label_slots = slot_sets[room, guarded]
                b_val, b_j = best(raw, ex, blank_slots)
                l_val, l_j = best(raw, ex, label_slots)
                b_val -= norm
                l_val -= norm
                # the best label token and the blank's, from the two best tokens
                if V > 1:
                    (v0, v1), (k0, k1) = best_tokens
                    if k0 == blank:
                        label_k, label_tok, blank_tok = k1, v1, v0
                    else:
                        label_k, label_tok = k0, v0
                        blank_tok = v1 if k1 == blank else None
                        if blank_tok is None and b_val > l_val:  # not decided by order
                            if blank_tok_of[1] is None:
                                blank_tok_of[1] = float(tok[0, blank])
                            blank_tok = blank_tok_of[1]
                else:
                    label_k, label_tok, blank_tok = -1, neg, float(tok[0, 0])
                label_score = label_tok + l_val
                if blank_tok is None or label_score > blank_tok + b_val:
                    return True, label_k, l_j, min(durations[l_j], room), label_score
                return False, blank, b_j, min(durations[b_j], room), blank_tok + b_val

            room = length - t
            if final or room >= R1:
                is_label, k, _, frames, score = choose(min(room, R1))
                pending = None
            else:  # T decides which durations fit: taken if every T >= N agrees
                options = [choose(r) for r in range(room, R1 + 1)]
                if any(o[:4] != options[0][:4] for o in options[1:]):
                    break  # this step waits for more frames
                is_label, k, _, frames, score = options[0]
                pending = {r: o[4] for r, o in zip(range(room, R1 + 1), options)}
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

    def _step_outputs(self, enc_proj, dec_proj, lm):
        """The joint network's outputs at one step, as :meth:`run_one` reads them:
        the duration logits ``raw`` (D floats), their exp(raw - max) ``ex``, the
        normaliser to subtract from a :meth:`run_one` duration value, the (1, V)
        token log-probabilities (LM-fused) and their two best ((values), (tokens))
        (None when V = 1)."""
        table = self.table(enc_proj.device)
        V = table.num_tokens
        # as few torch calls per step as possible: the durations' log-softmax is
        # taken in Python on D floats, the tokens' in torch (V may be large)
        z_tok, z_dur = self.stepper.joint(enc_proj, dec_proj).split_with_sizes(
            (V, table.num_durations), 1
        )
        raw = z_dur.tolist()[0]  # (D,) duration logits
        top = max(raw)
        ex = [math.exp(x - top) for x in raw]
        # log-prob of a duration = raw - top - log(sum(ex)); of a total = the
        # best() value (log of its ex sum) - log(sum(ex)); so subtract:
        norm = math.log(sum(ex)) + (0.0 if self.blank_decision == "total" else top)
        tok = z_tok.float().log_softmax(-1)  # (1, V)
        if lm is not None:  # fused scores of the labels (the blank's is 0)
            tok = tok + lm.labels
        best_tokens = tuple(x.tolist() for x in tok[0].topk(2)) if V > 1 else None
        return raw, ex, norm, tok, best_tokens
