"""Batched beam search: B utterances at once, every lattice, two pruning rules.

:class:`BatchedBeamSearch` is what the beam searches (``MultiblankBeamSearch``,
``TDTBeamSearch``) share for batches: :meth:`~BatchedBeamSearch.search_batch_nbest`
decodes B utterances with one joint-network call per step for every live hypothesis
of every utterance (each at its own frame), one prediction-network call (and one call
of the fused LMs) for the labels kept, finished utterances out of the work, hypotheses
with the same labels at the same frame merged (log-add), n-best lists; the lattice
only gives the candidates (the symbol table's ``beam_candidates``). ``beam_sync``
chooses the rule:

* ``"frame"`` (:mod:`.frame_sync_beam`): the frame-synchronous rule of the
  one-utterance search :meth:`~espnet_multiblank.decoding.MultiblankBeamSearch.search`
  (per-frame queues); the same n-best lists as that search, utterance by utterance;
* ``"step"`` (:mod:`.step_sync_beam`): every hypothesis takes one arc per step and the
  K best of each utterance are kept (pruning per step, as NeMo's batched beam
  searches): far fewer steps where big blanks or durations skip frames, other
  hypotheses than the frame-synchronous rule in places.

See ``docs/decoding.md`` ("Batched beam search").
"""

import math
from typing import List, Optional

import torch

from espnet_multiblank.decoding.base import TransducerSearch, check_batch
from espnet_multiblank.decoding.frame_sync_beam import FrameSyncRun
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.label_sync_beam import LabelSyncRun
from espnet_multiblank.decoding.step_sync_beam import StepSyncRun

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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"frame_prune must be a number > 0 or None, got {value!r}")
    if not value > 0 or math.isnan(value):
        raise ValueError(f"frame_prune must be a number > 0 or None, got {value!r}")
    if beam_sync != "label":
        raise ValueError(
            f"frame_prune applies to beam_sync 'label' only, got beam_sync "
            f"{beam_sync!r}"
        )
    return float(value)


class BatchedBeamSearch(TransducerSearch):
    """What the beam searches share for B utterances at once (module docstring).

    A subclass has ``beam_candidates`` (:class:`TransducerSearch`'s), and has
    ``beam_size``, ``score_norm``, ``blank_decision`` and ``beam_sync``.
    """

    batched = True
    #: first capacity of a frame's overflow, per utterance (doubled when full)
    initial_overflow = 4
    #: first capacity of the node pool (doubled when full)
    initial_nodes = 1024

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
