"""Token-and-duration transducer (TDT) greedy search, one utterance and batched.

Algorithm (``docs/decoding.md``, "TDT searches"): a hypothesis sits at frame t with
label history y. The joint network gives token log-probabilities ``tok`` (V) and
duration log-probabilities ``dur`` (D) for ``(enc[t], pred(y))``; the search emits the
most probable allowed arc (token k, duration e_j), scored ``tok[k] + dur[j]``:

* the best label arc: the best label token with the best duration (any; a duration
  >= 1 once ``max_sym_per_frame`` labels stayed at this frame);
* the best blank arc: the blank with the best duration >= 1 (a blank never stays);
* the more probable of the two (a tie goes to the blank). Token and duration are
  independent, so this is the most probable arc of the lattice at that node.

A label extends y (the prediction network advances); every arc moves t to
``min(t + e_j, T)``; the hypothesis ends when it reaches T (an arc that would overshoot
is clipped at T). The batched search takes the same step for every active utterance
at once (one joint call; one prediction-network call for the rows that emitted a
label), each utterance advancing by its own duration.

Differences from NeMo's TDT greedy search (token arg-max first, then duration
arg-max, a blank with duration 0 moved by 1 frame): only when the blank is the most
probable token and 0 the most probable duration, which no path of the lattice can
take; there NeMo moves the blank by one frame, and this search compares the best blank
arc (its best duration >= 1) with the best label arc (duration 0).
"""

from typing import List

import torch

from espnet_multiblank.decoding.base import TransducerSearch
from espnet_multiblank.decoding.hypothesis import BatchedHyps, Hypothesis
from espnet_multiblank.decoding.tdt_table import TDTSymbolTable
from espnet_multiblank.lattice import TDTLattice


class TDTSearchMixin:
    """What the TDT searches share: the lattice type and the symbol table."""

    lattice_types = (TDTLattice,)

    def make_table(self, device: torch.device) -> TDTSymbolTable:
        return TDTSymbolTable(self.lattice, self.stepper.vocab_size, device)


class TDTGreedySearch(TDTSearchMixin, TransducerSearch):
    """TDT greedy search (see the module docstring).

    Args: those of :class:`~espnet_multiblank.decoding.base.TransducerSearch` with a
    :class:`~espnet_multiblank.lattice.TDTLattice` (``stepper.vocab_size`` = V + D;
    ``nbest`` is 1). ``max_sym_per_frame``: labels that may stay (duration 0) at one
    frame; after that every emission moves on.
    """

    batched = True

    def __init__(self, stepper, lattice: TDTLattice, max_sym_per_frame: int = 10):
        super().__init__(stepper, lattice, max_sym_per_frame=max_sym_per_frame)
        self.beam_size = 1

    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        return [self.search_one(enc_out)]

    @torch.no_grad()
    def search_one(self, enc_out: torch.Tensor) -> Hypothesis:
        """Greedy search for one utterance (a plain Python loop: no batch overhead).

        Args:
            enc_out: (T, D_enc) encoder output.
        """
        device = enc_out.device
        table = self.table(device)
        stepper = self.stepper
        V, blank = table.num_tokens, table.blank
        durations = table.durations_list
        move_slots = [j for j, e in enumerate(durations) if e >= 1]
        T = enc_out.size(0)
        enc_proj = stepper.project_enc(enc_out)  # (T, J)
        dec_proj, state = self.start(1, device)
        hyp = Hypothesis(score=0.0, yseq=[blank])
        while hyp.frame < T:
            t = hyp.frame
            tok, dur = table.log_probs(stepper.joint(enc_proj[t : t + 1], dec_proj))
            d = dur[0].tolist()  # D floats
            j_move = max(move_slots, key=d.__getitem__)
            if table.has_zero and hyp.num_sym_frame < self.max_sym_per_frame:
                j_label = max(range(len(d)), key=d.__getitem__)
            else:
                j_label = j_move
            # the best label and, when it matters, the blank: among the two best tokens
            if V > 1:
                top_v, top_k = tok[0].topk(2)
                (v0, v1), (k0, k1) = top_v.tolist(), top_k.tolist()
                if k0 == blank:
                    label_k, label_tok, blank_tok = k1, v1, v0
                else:  # a blank below the two best tokens cannot beat the best label,
                    # whose best duration is at least as probable as the blank's
                    label_k, label_tok = k0, v0
                    blank_tok = v1 if k1 == blank else float("-inf")
            else:
                label_k, label_tok, blank_tok = -1, float("-inf"), float(tok[0, 0])
            label_score = label_tok + d[j_label]
            blank_score = blank_tok + d[j_move]
            if label_score > blank_score:
                hyp.score += label_score
                hyp.yseq.append(label_k)
                label = torch.full((1,), label_k, dtype=torch.long, device=device)
                dec_proj, state = stepper.step(label, state)
                frames = min(durations[j_label], T - t)
                if frames == 0:
                    hyp.num_sym_frame += 1
                else:
                    hyp.advance(frames, is_label=True)
            else:
                hyp.score += blank_score
                hyp.advance(min(durations[j_move], T - t))
        hyp.dec_state = state
        hyp.dec_proj = dec_proj[0]
        return hyp

    @torch.no_grad()
    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """Greedy search for B utterances at once (see the module docstring).

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b.

        Returns:
            B hypotheses, in input order.
        """
        device = enc_out.device
        table = self.table(device)
        stepper = self.stepper
        B = enc_out.size(0)
        lens = enc_lens.to(device=device, dtype=torch.long)
        enc_proj = stepper.project_enc(enc_out)  # (B, T_max, J)
        dec_proj, state = self.start(B, device)  # (B, J)
        hyps = BatchedHyps(B, device)

        active = (hyps.frame < lens).nonzero().squeeze(1)
        while active.numel() > 0:
            t = hyps.frame[active]  # (A,)
            tok, dur = table.log_probs(
                stepper.joint(enc_proj[active, t], dec_proj[active])
            )
            guard = hyps.num_sym[active] >= self.max_sym_per_frame
            k, j, logp, is_label = table.best_arcs(tok, dur, guard)
            # clipped at T: an arc that would overshoot ends the hypothesis
            frames = torch.minimum(table.durations[j], lens[active] - t)
            hyps.record(active, k, frames, logp, is_label)
            if bool(is_label.any()):
                rows = active[is_label]
                new_proj, new_state = stepper.step(
                    k[is_label], stepper.select_state(state, rows)
                )
                dec_proj[rows] = new_proj
                stepper.scatter_state(state, rows, new_state)
            active = (hyps.frame < lens).nonzero().squeeze(1)

        return [
            hyps.hypothesis(
                b,
                self.blank_id,
                stepper.select_state(state, torch.tensor([b], device=device)),
                dec_proj[b],
            )
            for b in range(B)
        ]
