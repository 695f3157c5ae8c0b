"""The reductions of the losses: names, weights, and the one-time mean_volume notice.

A reduced loss is ``sum_b w_b cost_b`` with per-utterance weights ``w_b`` (B
utterances, L_b labels each); the gradient of utterance b is weighted the same way
(the kernels fold ``w_b`` times the incoming gradient into their last pass):

=========================  ===================================  =====================
reduction                  loss                                 w_b
=========================  ===================================  =====================
``none``                   the (B,) costs                       1 (per element)
``sum``                    ``sum_b cost_b``                     1
``mean``                   ``sum_b cost_b / B`` (ESPnet's)      1 / B
``mean_batch``             ``sum_b cost_b / B`` (NeMo's)        1 / B
``mean_volume``            ``sum_b cost_b / sum_b L_b``         1 / sum_b L_b
                           (NeMo's)
``mean_label_normalized``  ``mean_b cost_b / max(L_b, 1)``      1 / (B max(L_b, 1))
                           (NeMo's ``mean``)
=========================  ===================================  =====================

ESPnet's names keep ESPnet's meaning (its ``RNNTLossNumba`` and
``MultiblankRNNTLossNumba`` define ``none``, ``sum`` and ``mean``), NeMo's names
NeMo's (``nemo/collections/asr/losses/rnnt.py``, ``RNNTLoss.reduce``), and NeMo's
``mean``, which would collide with ESPnet's, has a name of its own. Where NeMo would
divide by zero we do not: B = 0 divides by 1 (an empty batch costs 0), and
``mean_volume`` of a batch without any label divides by 1 (NeMo returns inf or NaN);
``mean_label_normalized`` counts an utterance without labels as one label.

Earlier versions of this package used ``mean_volume`` for what is now
``mean_label_normalized``; the first use of ``mean_volume`` in a process logs a
warning saying so.
"""

import logging
from typing import Optional

import numpy as np
import torch

REDUCTIONS = (
    "none",
    "sum",
    "mean",
    "mean_volume",
    "mean_batch",
    "mean_label_normalized",
)

_log = logging.getLogger(__name__)
_notice = {"mean_volume_shown": False}

MEAN_VOLUME_NOTICE = (
    'reduction "mean_volume" is NeMo\'s: sum of the costs / sum of the label '
    "counts (longer transcripts weigh more). Earlier versions of espnet-multiblank "
    "used it for the mean over utterances of cost / max(label count, 1) (NeMo's "
    '"mean"), which is now reduction "mean_label_normalized".'
)


def check_reduction(reduction) -> str:
    """``reduction`` if it is one of :data:`REDUCTIONS` (ValueError naming it
    otherwise); the first "mean_volume" of the process logs
    :data:`MEAN_VOLUME_NOTICE`."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if reduction == "mean_volume" and not _notice["mean_volume_shown"]:
        _notice["mean_volume_shown"] = True
        _log.warning(MEAN_VOLUME_NOTICE)
    return reduction


def weights_np(reduction: str, label_lens: np.ndarray) -> np.ndarray:
    """(B,) float64 weights ``w_b`` of the table above (``label_lens`` (B,) ints)."""
    B = label_lens.shape[0]
    if reduction in ("mean", "mean_batch"):
        return np.full(B, 1.0 / max(B, 1))
    if reduction == "mean_volume":
        return np.full(B, 1.0 / max(int(label_lens.sum()), 1))
    if reduction == "mean_label_normalized":
        return 1.0 / (np.maximum(label_lens, 1).astype(np.float64) * max(B, 1))
    return np.ones(B)


def weights(
    reduction: str,
    label_lens: torch.Tensor,
    dtype: torch.dtype,
    keep: Optional[torch.Tensor] = None,
):
    """:func:`weights_np` as a (B,) tensor on ``label_lens``' device (no host
    synchronisation).

    ``keep`` ((B,) bool): the weights of the reduction over the utterances where it is
    True, as if the batch held only those K (at least 1): 1 / K for "mean" and
    "mean_batch", 1 / (sum of their L_b) for "mean_volume", 1 / (K max(L_b, 1)) for
    "mean_label_normalized". The others get the weight their formula gives them (the
    caller leaves their costs out).
    """
    if keep is not None:
        return _weights_over(reduction, label_lens, dtype, keep)
    B = label_lens.shape[0]
    dev = label_lens.device
    if reduction in ("mean", "mean_batch"):
        return torch.full((B,), 1.0 / max(B, 1), dtype=dtype, device=dev)
    if reduction == "mean_volume":
        total = label_lens.sum().clamp(min=1).to(dtype)
        return (1.0 / total).expand(B).contiguous()
    if reduction == "mean_label_normalized":
        return 1.0 / (label_lens.clamp(min=1).to(dtype) * max(B, 1))
    return torch.ones((B,), dtype=dtype, device=dev)


def _weights_over(reduction, label_lens, dtype, keep):
    B = label_lens.shape[0]
    ones = torch.ones((B,), dtype=dtype, device=label_lens.device)
    if reduction == "sum":
        return ones
    if reduction == "mean_volume":
        total = (label_lens * keep).sum().clamp(min=1).to(dtype)
        return ones / total
    count = keep.sum().clamp(min=1).to(dtype)
    if reduction in ("mean", "mean_batch"):
        return ones / count
    if reduction == "mean_label_normalized":
        return 1.0 / (label_lens.clamp(min=1).to(dtype) * count)
    raise ValueError(f"reduction {reduction!r} has no weights (use reduce_costs)")


def reduce_costs(costs: torch.Tensor, reduction: str, label_lens: torch.Tensor):
    """The reduced loss of (B,) ``costs`` (plain torch ops, differentiable)."""
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    B = max(costs.shape[0], 1)
    if reduction in ("mean", "mean_batch"):
        return costs.sum() / B
    lens = label_lens.to(costs.dtype)
    if reduction == "mean_volume":
        return costs.sum() / lens.sum().clamp(min=1)
    return (costs / lens.clamp(min=1)).sum() / B
