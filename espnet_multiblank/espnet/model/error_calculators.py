"""Validation CER/WER of ``model: multiblank_espnet`` with every blank treated as
blank: the transducer branch decodes with the plug-in's batched greedy search of the
model's lattice, the CTC branch maps big blanks to the blank before ESPnet scores it.
"""

from typing import List, Optional, Sequence, Tuple

import torch
from espnet2.asr.decoder.abs_decoder import AbsDecoder
from espnet2.asr.transducer.error_calculator import ErrorCalculatorTransducer

from espnet_multiblank.decoding import GreedySearch, JointStepper
from espnet_multiblank.espnet.compat import ErrorCalculator
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice


class MultiblankErrorCalculatorTransducer(ErrorCalculatorTransducer):
    """ESPnet's transducer CER/WER calculator with the right (multi-)blank handling.

    ESPnet's calculator decodes with ``BeamSearchTransducer`` (which treats
    ``decoder.blank_id`` as the only blank, so big blanks would be emitted as labels)
    and strips blanks by string replacement. This one decodes the whole batch with the
    plug-in's batched greedy search of the model's lattice (multi-blank: big blanks
    skip their frames; TDT, ``tdt_durations`` set: TDT greedy search over the joint
    network's V + D outputs) over the valid frames only, and drops every blank id
    (standard and big) from hypotheses and references before scoring.
    """

    def __init__(
        self,
        decoder: AbsDecoder,
        joint_network: torch.nn.Module,
        token_list: List[str],
        sym_space: str,
        sym_blank: str,
        blank_id: int,
        big_blank_durations: Sequence[int] = (),
        report_cer: bool = False,
        report_wer: bool = False,
        tdt_durations: Sequence[int] = (),
    ):
        super().__init__(
            decoder,
            joint_network,
            token_list,
            sym_space,
            sym_blank,
            report_cer=report_cer,
            report_wer=report_wer,
        )
        if tdt_durations:
            lattice = TDTLattice.create(blank_id, tdt_durations)
        else:
            lattice = MultiblankLattice.create(blank_id, big_blank_durations)
        # the joint network's outputs: V tokens, and a TDT's D durations after them
        joint_size = len(token_list) + lattice.num_duration_outputs
        self.beam_search = GreedySearch(
            JointStepper(decoder, joint_network, joint_size),
            lattice,
            max_sym_per_frame=5,
        )
        self.blank_ids = frozenset(lattice.blank_ids)

    def convert_to_char(self, pred, target) -> Tuple[List[str], List[str]]:
        """Token ids to strings, dropping all blanks (and padding) by id."""

        def to_str(ids) -> str:
            tokens = [
                self.token_list[int(i)]
                for i in ids
                if int(i) >= 0 and int(i) not in self.blank_ids
            ]
            return "".join(tokens).replace(self.space, " ")

        return [to_str(p) for p in pred], [to_str(r) for r in target]

    def __call__(
        self,
        encoder_out: torch.Tensor,
        target: torch.Tensor,
        encoder_out_lens: torch.Tensor,
    ) -> Tuple[Optional[float], Optional[float]]:
        """Sentence-level CER and WER of greedy hypotheses.

        Args:
            encoder_out: Encoder output sequences. (B, T, D_enc)
            target: Target label ID sequences. (B, L)
            encoder_out_lens: Valid frames per utterance. (B,)
        """
        device = next(self.decoder.parameters()).device
        encoder_out = encoder_out.to(device)
        hyps = self.beam_search.search_batch(encoder_out, encoder_out_lens)
        pred = [h.yseq[1:] for h in hyps]
        char_pred, char_target = self.convert_to_char(pred, target)
        cer = self.calculate_cer(char_pred, char_target) if self.report_cer else None
        wer = self.calculate_wer(char_pred, char_target) if self.report_wer else None
        return cer, wer


class MultiblankCTCErrorCalculator(ErrorCalculator):
    """ESPnet's CTC CER calculator that also treats big blanks as blank."""

    def __init__(self, *args, big_blank_ids: Sequence[int] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.big_blank_ids = tuple(big_blank_ids)

    def __call__(self, ys_hat, ys_pad, is_ctc=False):
        if is_ctc and self.big_blank_ids and self.idx_blank is not None:
            ys_hat = ys_hat.clone()
            for i in self.big_blank_ids:
                ys_hat[ys_hat == i] = self.idx_blank
        return super().__call__(ys_hat, ys_pad, is_ctc=is_ctc)
