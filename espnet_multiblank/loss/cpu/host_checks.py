"""The value checks of the loss inputs for CPU tensors, compiled (Numba).

The same checks in numpy are a dozen small array operations, each with a fixed cost
that is a noticeable part of a small loss; compiled, they are one pass over the
lengths and the labels. The returned codes are those of
``espnet_multiblank.loss.label_rules``, which turns them into the error messages.
"""

import numpy as np
from numba import njit

from espnet_multiblank.loss.label_rules import (
    ACT_LEN_ABOVE_T,
    ACT_LEN_NEGATIVE,
    LABEL_IS_BLANK,
    LABEL_LEN_NEGATIVE,
    LABEL_LEN_TOO_LARGE,
    LABEL_OUT_OF_RANGE,
    OK,
)


@njit(cache=True)
def _check_lengths(lens, top, negative, too_large):
    """(code, b) of the first failed check of the lengths ``lens`` (B,): ``negative``
    for any length < 0 first, then ``too_large`` for one > ``top``; (OK, 0) when
    all pass."""
    for b in range(lens.shape[0]):
        if lens[b] < 0:
            return negative, b
    for b in range(lens.shape[0]):
        if lens[b] > top:
            return too_large, b
    return OK, 0


@njit(cache=True)
def scan_lengths_and_labels(T, max_label, act_lens, label_lens, labels, V, blank_ids):
    """Check, in this order, act_lens >= 0, act_lens <= T, label_lens >= 0, label_lens
    <= max_label, then the valid labels (j < label_lens[b]) in row-major order: in
    [0, V), then not in ``blank_ids``; when all pass, zero the padding of ``labels``.

    Args:
        T, max_label, V: ints.
        act_lens, label_lens: (B,) int64.
        labels: (B, max_label) int64, C-contiguous; its padding is zeroed in place.
        blank_ids: (N,) int64.
    Returns:
        (code, b, j): the first failed check (a code of
        ``espnet_multiblank.loss.label_rules``; OK when none) and, for the label
        checks, the offending position.
    """
    B = act_lens.shape[0]
    code, b = _check_lengths(act_lens, T, ACT_LEN_NEGATIVE, ACT_LEN_ABOVE_T)
    if code == OK:
        code, b = _check_lengths(
            label_lens, max_label, LABEL_LEN_NEGATIVE, LABEL_LEN_TOO_LARGE
        )
    if code != OK:
        return code, b, 0
    for b in range(B):
        for j in range(label_lens[b]):
            if labels[b, j] < 0 or labels[b, j] >= V:
                return LABEL_OUT_OF_RANGE, b, j
    for b in range(B):
        for j in range(label_lens[b]):
            for k in range(blank_ids.shape[0]):
                if labels[b, j] == blank_ids[k]:
                    return LABEL_IS_BLANK, b, j
    for b in range(B):
        for j in range(label_lens[b], max_label):
            labels[b, j] = 0
    return OK, 0, 0


def blank_id_array(blank_ids) -> np.ndarray:
    """``blank_ids`` as the int64 array :func:`scan_lengths_and_labels` takes."""
    return np.asarray(list(blank_ids), dtype=np.int64).reshape(-1)
