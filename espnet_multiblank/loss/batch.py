"""The record of a validated loss batch, passed down from the input checks to the
backends (dispatch, autograd Function, kernel drivers) as one argument."""

from typing import NamedTuple

import torch


class LossBatch(NamedTuple):
    """A loss batch after :func:`~espnet_multiblank.loss.validation.validate_inputs`.

    Fields:
        acts: (B, T, U, V') float16 / bfloat16 / float32 / float64 raw joint logits
            (V': the family's row width; multi-blank: the tokens with the big
            blanks; TDT: V token logits then D duration logits).
        labels: (B, L) int64, L <= U - 1, on acts' device; padding (positions >=
            label_lens[b]) replaced by valid ids.
        act_lens: (B,) int64 frames T_b <= T.  label_lens: (B,) int64 labels
            L_b <= L.
    """

    acts: torch.Tensor
    labels: torch.Tensor
    act_lens: torch.Tensor
    label_lens: torch.Tensor
