"""Multi-blank greedy search, one utterance at a time and batched over utterances.

Algorithm (Xu et al. 2023, Sec. 3.3, "multi-blank greedy"): a hypothesis sits at
frame t with label history y. At each step it emits the arg-max symbol k of
``log_softmax(joint(enc[t], pred(y)))`` among the *allowed* symbols:

* a label: y <- y + [k], the prediction network advances, t stays (at most
  ``max_sym_per_frame`` labels per frame; after that only blanks are allowed);
* the standard blank: t <- t + 1;
* big blank i (index ``blank_id - 1 - i``): t <- t + d_i, i.e. d_i - 1 frames are never
  evaluated; big blanks that would jump past the last frame (t + d_i > T) are not
  allowed, so the chosen path is a path of the loss's lattice and its score is that
  path's log-probability.

The search stops when t == T. The batched version runs the same step for every active
utterance at once (one joint call and one prediction-network call for the rows that
emitted a label); utterances advance independently and drop out when done. Both
versions choose the same symbols (tested).
"""

from typing import Any, List, Sequence

import torch
from typeguard import typechecked

from espnet_multiblank.decoding.common import (
    JointStepper,
    MultiblankHypothesis,
    SymbolTable,
    scatter_state,
    select_state,
)
from espnet_multiblank.decoding.layout import BlankLayout


class MultiblankGreedySearch:
    """Multi-blank greedy search (beam 1).

    Args:
        decoder: ESPnet ``TransducerDecoder``.
        joint_network: ESPnet ``JointNetwork``.
        blank_id: Index of the standard blank (also the prediction network's start
            symbol, as in training).
        big_blank_durations: ``(d_0, ..., d_{N-1})``; big blank i has index
            ``blank_id - 1 - i``. ``()`` gives standard transducer greedy search
            (with up to ``max_sym_per_frame`` labels per frame).
        max_sym_per_frame: Labels allowed at one frame before a blank is forced.
        vocab_size: V (defaults to ``decoder.odim``).
    """

    @typechecked
    def __init__(
        self,
        decoder: Any,
        joint_network: Any,
        blank_id: int,
        big_blank_durations: Sequence[int] = (),
        max_sym_per_frame: int = 10,
        vocab_size: int = 0,
    ):
        if max_sym_per_frame < 1:
            raise ValueError(f"max_sym_per_frame must be >= 1: {max_sym_per_frame}")
        self.decoder = decoder
        self.joint_network = joint_network
        self.layout = BlankLayout(
            blank_id=blank_id,
            durations=tuple(int(d) for d in big_blank_durations),
            vocab_size=vocab_size or int(decoder.odim),
        )
        self.blank_id = blank_id
        self.max_sym_per_frame = max_sym_per_frame
        self.beam_size = 1
        self.nbest = 1
        self.stepper = JointStepper(decoder, joint_network)
        self._tables = {}

    def _table(self, device: torch.device) -> SymbolTable:
        if device not in self._tables:
            self._tables[device] = SymbolTable(self.layout, device)
        return self._tables[device]

    def __call__(self, enc_out: torch.Tensor) -> List[MultiblankHypothesis]:
        """ESPnet ``BeamSearchTransducer`` interface: one utterance.

        Args:
            enc_out: (T, D_enc) encoder output.

        Returns:
            [1-best hypothesis]
        """
        return [self.search_one(enc_out)]

    @torch.no_grad()
    def search_one(self, enc_out: torch.Tensor) -> MultiblankHypothesis:
        """Greedy search for one utterance (plain loop).

        Args:
            enc_out: (T, D_enc) encoder output.
        """
        device = enc_out.device
        self.stepper.set_device(device)
        table = self._table(device)
        T = enc_out.size(0)
        enc_proj = self.stepper.project_enc(enc_out)  # (T, J)
        blank = torch.full((1,), self.blank_id, dtype=torch.long, device=device)
        dec_proj, state = self.stepper.step(blank, self.stepper.init_state(1))
        hyp = MultiblankHypothesis(score=0.0, yseq=[self.blank_id], dec_state=state)
        length = torch.tensor([T], device=device)
        # frames from which every big blank still fits: no mask needed there
        free_until = T - max(self.layout.durations, default=1)
        t, num_sym = 0, 0
        while t < T:
            logp = self.stepper.log_probs(enc_proj[t : t + 1], dec_proj)  # (1, V)
            if t <= free_until and num_sym < self.max_sym_per_frame:
                masked = logp  # nothing is disallowed: skip the masking ops
            else:
                masked = table.mask(
                    logp,
                    torch.tensor([t], device=device),
                    length,
                    torch.tensor([num_sym], device=device),
                    self.max_sym_per_frame,
                )
            k = int(masked[0].argmax())
            hyp.score += float(logp[0, k])
            adv = table.advance_list[k]
            if adv == 0:
                hyp.yseq.append(k)
                num_sym += 1
                label = torch.full((1,), k, dtype=torch.long, device=device)
                dec_proj, state = self.stepper.step(label, state)
            else:
                t += adv
                num_sym = 0
                if adv > 1:  # a big blank
                    hyp.big_blank_emissions += 1
                    hyp.frames_skipped += adv - 1
        hyp.dec_state = state
        hyp.dec_proj = dec_proj[0]
        hyp.frame = t
        return hyp

    @torch.no_grad()
    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[MultiblankHypothesis]:
        """Greedy search for B utterances at once.

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b.

        Returns:
            B hypotheses, in input order.
        """
        device = enc_out.device
        self.stepper.set_device(device)
        table = self._table(device)
        B = enc_out.size(0)
        lens = enc_lens.to(device=device, dtype=torch.long)
        enc_proj = self.stepper.project_enc(enc_out)  # (B, T_max, J)
        blank = torch.full((B,), self.blank_id, dtype=torch.long, device=device)
        dec_proj, state = self.stepper.step(blank, self.stepper.init_state(B))  # (B, J)
        dec_proj = dec_proj.clone()
        state = (state[0].clone(), None if state[1] is None else state[1].clone())

        frame = torch.zeros(B, dtype=torch.long, device=device)
        num_sym = torch.zeros(B, dtype=torch.long, device=device)
        scores = torch.zeros(B, dtype=torch.float64, device=device)
        n_big = torch.zeros(B, dtype=torch.long, device=device)
        skipped = torch.zeros(B, dtype=torch.long, device=device)
        yseqs = [[self.blank_id] for _ in range(B)]

        active = (frame < lens).nonzero().squeeze(1)
        while active.numel() > 0:
            t = frame[active]  # (A,)
            logp = self.stepper.log_probs(
                enc_proj[active, t], dec_proj[active]
            )  # (A, V)
            masked = table.mask(
                logp, t, lens[active], num_sym[active], self.max_sym_per_frame
            )
            k = masked.argmax(dim=-1)  # (A,)
            scores[active] += logp.gather(1, k.unsqueeze(1)).squeeze(1).double()
            adv = table.advance[k]  # (A,)

            is_label = adv == 0
            if bool(is_label.any()):
                rows = active[is_label]
                labels = k[is_label]
                for r, lab in zip(rows.tolist(), labels.tolist()):
                    yseqs[r].append(lab)
                new_proj, new_state = self.stepper.step(
                    labels, select_state(state, rows)
                )
                dec_proj[rows] = new_proj
                scatter_state(state, rows, new_state)
                num_sym[rows] += 1
            blanks = ~is_label
            if bool(blanks.any()):
                rows = active[blanks]
                a = adv[blanks]
                frame[rows] += a
                num_sym[rows] = 0
                big = a > 1  # big blanks
                n_big[rows] += big.long()
                skipped[rows] += torch.where(big, a - 1, torch.zeros_like(a))
            active = (frame < lens).nonzero().squeeze(1)

        hyps = []
        for b in range(B):
            hyps.append(
                MultiblankHypothesis(
                    score=float(scores[b]),
                    yseq=yseqs[b],
                    dec_state=select_state(state, torch.tensor([b], device=device)),
                    dec_proj=dec_proj[b],
                    frame=int(frame[b]),
                    big_blank_emissions=int(n_big[b]),
                    frames_skipped=int(skipped[b]),
                )
            )
        return hyps
