"""The training loss over the utterances that have a path, and what is said about the
others.

An utterance whose lengths leave no complete path through the lattice (no encoder
frames but labels; a TDT whose durations cannot add up to its number of frames; a TDT
without duration 0 whose labels need more frames than it has) costs ``+inf`` with an
exactly zero gradient (``docs/lattice.md``). Reduced as it is, one such utterance
makes the batch's loss infinite, ESPnet's reporter then leaves the whole batch out of
the epoch's average, and an epoch made of such batches reports NaN. The model instead
takes the per-utterance costs (the loss's reduction "none") and reduces them here:

* the utterances without a path are left out of the value, their share of the batch
  is reported (``transducer_no_path_fraction`` in the stats ESPnet logs), and
  :class:`NoPathWarnings` logs how many there were;
* the configured reduction runs over the K utterances that have a path, as if the
  batch held only those: "sum" is their sum, "mean" and "mean_batch" their sum / K
  (not / B), "mean_volume" their sum / the sum of their label counts,
  "mean_label_normalized" the mean over those K of cost_b / max(L_b, 1);
* a batch without any such utterance gives a loss of 0 whose gradient is 0 (still
  connected to the graph, so that DDP sees every parameter's gradient).
"""

import logging
from typing import Tuple

import torch

from espnet_multiblank.lattice import max_labels, reachable_lengths
from espnet_multiblank.loss.reductions import REDUCTIONS, weights

logger = logging.getLogger(__name__)


#: the reductions the model can apply: the loss's, but for "none" (the trainer needs
#: a scalar); the weights are the loss's own (``loss.reductions.weights``) over the
#: utterances that have a path
MODEL_REDUCTIONS = tuple(r for r in REDUCTIONS if r != "none")


class _CostsWithPath(torch.autograd.Function):
    """``costs`` with the utterances that have no path set to 0; the incoming
    gradient passes through unchanged (the loss's gradient of those utterances is
    exactly zero whatever multiplies it)."""

    @staticmethod
    def forward(ctx, costs: torch.Tensor, no_path: torch.Tensor) -> torch.Tensor:
        return costs.masked_fill(no_path, 0.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def reduce_over_paths(
    costs: torch.Tensor, label_lens: torch.Tensor, reduction: str
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The training loss of a batch: ``reduction`` over the utterances with a path.

    Args:
        costs: (B,) float per-utterance costs from the loss (reduction "none"),
            ``+inf`` for an utterance without a path.
        label_lens: (B,) int label counts L_b.
        reduction: a :data:`MODEL_REDUCTIONS` name.

    Returns:
        ``(loss, no_path)``: the scalar loss (``costs.dtype``) and the (B,) bool mask
        of the utterances left out.
    """
    no_path = torch.isposinf(costs.detach())
    # utterances without a path get a positive weight too: their cost is replaced by
    # 0 and their gradient is exactly zero, so the weight changes nothing, and a
    # non-zero incoming gradient lets the loss finish its gradient in place (a zero
    # one would cost a second logits-sized buffer)
    w = weights(reduction, label_lens.to(costs.device), costs.dtype, keep=~no_path)
    loss = (_CostsWithPath.apply(costs, no_path) * w).sum()
    return loss, no_path


def _why(lattice, num_frames: int, num_labels: int) -> str:
    if num_frames == 0:
        return "no encoder frames"
    if num_frames not in reachable_lengths(lattice):
        return f"no path covers exactly {num_frames} frames"
    most = max_labels(lattice, num_frames)
    return f"L > {most}, the most labels {num_frames} frames fit"


class NoPathWarnings:
    """Logs a warning for the batches with utterances that have no path: at the 1st,
    2nd, 4th, 8th, ... such batch of this process, with that batch's count, up to
    three examples and the totals so far (the stats give the share of every epoch).
    It reads the batch's count on the host: one device synchronisation per batch."""

    def __init__(self) -> None:
        self.batches = 0
        self.utterances = 0

    def __call__(
        self,
        lattice,
        no_path: torch.Tensor,
        num_frames: torch.Tensor,
        num_labels: torch.Tensor,
    ) -> None:
        """Count and maybe warn.

        Args:
            lattice: the model's lattice (for the reason of each example).
            no_path: (B,) bool, the utterances left out.
            num_frames: (B,) int encoder lengths T_b.
            num_labels: (B,) int label counts L_b.
        """
        count = int(no_path.sum())
        if not count:
            return
        self.batches += 1
        self.utterances += count
        if self.batches & (self.batches - 1):  # not a power of two
            return
        rows = torch.nonzero(no_path).flatten()[:3].tolist()
        examples = "; ".join(
            f"T={int(num_frames[b])}, L={int(num_labels[b])} "
            f"({_why(lattice, int(num_frames[b]), int(num_labels[b]))})"
            for b in rows
        )
        logger.warning(
            "transducer loss: %d of %d utterances in this batch have no path through "
            "the lattice and are left out of the loss (zero gradient), e.g. %s; so "
            "far in this process: %d such utterances in %d batches (said again at "
            "the 2nd, 4th, 8th, ... batch with some; the share of each epoch is the "
            "transducer_no_path_fraction stat)",
            count,
            len(no_path),
            examples,
            self.utterances,
            self.batches,
        )
