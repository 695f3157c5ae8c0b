"""Checks of the TDT loss's tensor inputs (messages name the argument)."""

from typing import Tuple

import torch

from espnet_multiblank.loss.tdt_options import TDTOptions
from espnet_multiblank.loss.validation import check_lengths_and_labels, check_tensors


def validate_tdt_inputs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes, dtypes, devices and values of a TDT batch.

    ``acts.shape[3]`` must be ``V + D`` with ``D = len(durations)`` and ``V > blank``;
    label ids must be token ids in ``[0, V)`` other than the blank.

    Returns:
        labels: (B, L) int64 with padding replaced by 0; act_lens, label_lens: (B,)
        int64 (as :func:`espnet_multiblank.loss.validation.validate_inputs`).
    """
    check_tensors(
        acts,
        labels,
        act_lens,
        label_lens,
        acts_what="raw logits of shape (B, T, U, V + len(durations))",
    )
    opts.lattice.check_vocab_size(acts.shape[3], "acts.shape[3]")
    V = acts.shape[3] - opts.num_durations
    return check_lengths_and_labels(
        acts,
        labels,
        act_lens,
        label_lens,
        num_labels=V,
        blank_ids=(opts.blank,),
        vocab_text=f"V = acts.shape[3] - len(durations) = {V}",
        blank_text=f"blank {opts.blank}",
    )
