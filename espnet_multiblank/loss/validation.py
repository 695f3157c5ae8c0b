"""Checks of the loss's tensor inputs, with messages that name the argument.

All checks on values (lengths, label ids) run on the tensors' own device: on CUDA as
reductions (nothing logits-sized is copied to the host; the few booleans that decide
whether to raise are the only host synchronisations), on the CPU as one compiled pass
(``loss/cpu/host_checks.py``: a dozen small numpy operations cost a tenth of a small
loss).
"""

from typing import Tuple

import numpy as np
import torch

from espnet_multiblank.loss.options import LossOptions

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _check_tensor(name: str, x, ndim: int, dtypes, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor ({what}), got {type(x).__name__}"
        )
    if x.dim() != ndim:
        raise ValueError(
            f"{name} must be a {ndim}-D tensor ({what}), got shape {tuple(x.shape)}"
        )
    if x.dtype not in dtypes:
        raise TypeError(
            f"{name} must have dtype in {[str(d) for d in dtypes]} ({what}), "
            f"got {x.dtype}"
        )


def validate_inputs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: LossOptions,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes, dtypes, devices and values; return int64 labels and lengths.

    Returns:
        labels: (B, L) int64 on acts.device, with padding (positions >= label_lens[b])
            replaced by 0 so that every backend may gather with it safely.
        act_lens: (B,) int64.  label_lens: (B,) int64.
    """
    check_tensors(acts, labels, act_lens, label_lens)
    V = acts.shape[3]
    if V < 1:
        raise ValueError(f"acts.shape[3] (vocabulary size V) must be >= 1, got {V}")
    if opts.blank >= V:
        raise ValueError(
            f"blank must be < the vocabulary size acts.shape[3] = {V}, got {opts.blank}"
        )
    return check_lengths_and_labels(
        acts,
        labels,
        act_lens,
        label_lens,
        num_labels=V,
        blank_ids=opts.all_blank_ids,
        vocab_text=f"V = {V}",
        blank_text=(
            f"standard blank {opts.blank}, big blanks {list(opts.big_blank_ids)}"
        ),
    )


def check_tensors(acts, labels, act_lens, label_lens, acts_what=None) -> None:
    """Types, ranks, dtypes, batch sizes and devices of the four tensor inputs."""
    what = acts_what or "raw logits of shape (B, T, U, V)"
    _check_tensor("acts", acts, 4, FLOAT_DTYPES, what)
    _check_tensor("labels", labels, 2, INT_DTYPES, "label ids of shape (B, U - 1)")
    _check_tensor("act_lens", act_lens, 1, INT_DTYPES, "frames per utterance, (B,)")
    _check_tensor("label_lens", label_lens, 1, INT_DTYPES, "labels per utterance, (B,)")
    B = acts.shape[0]
    for name, x in (
        ("labels", labels),
        ("act_lens", act_lens),
        ("label_lens", label_lens),
    ):
        if x.shape[0] != B:
            raise ValueError(
                f"{name}.shape[0] must equal the batch size acts.shape[0] = {B}, "
                f"got {x.shape[0]}"
            )
        if x.device != acts.device:
            raise ValueError(
                f"{name} must be on the same device as acts ({acts.device}), "
                f"got {x.device}"
            )
    if acts.shape[2] < 1:
        raise ValueError(
            f"acts.shape[2] (U = max labels + 1) must be >= 1, got {acts.shape[2]}"
        )


def check_lengths_and_labels(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    num_labels: int,
    blank_ids,
    vocab_text: str,
    blank_text: str,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lengths within (T, U - 1) and label ids in [0, num_labels) and not a blank.

    Args:
        acts: (B, T, U, *) logits (only the shape is used).
        num_labels: label ids must be < this (V of the token softmax).
        blank_ids: ids a label must not take.
        vocab_text, blank_text: how the messages name the bound and the blanks.
    Returns:
        As :func:`validate_inputs`.
    """
    B, T, U = acts.shape[:3]
    V = num_labels
    if B > 0 and labels.device.type == "cpu":
        # the same checks in numpy: a torch op costs microseconds, and a small
        # problem's whole loss well under a millisecond
        return _check_on_host(
            T, U, labels, act_lens, label_lens, V, blank_ids, vocab_text, blank_text
        )
    act_lens = act_lens.long()
    label_lens = label_lens.long()
    labels = labels.long()
    if B == 0:
        return labels, act_lens, label_lens

    max_label = min(U - 1, labels.shape[1])
    # One host synchronisation for all the cheap (B,) checks.
    bad = torch.stack(
        [
            (act_lens < 0).any(),
            (act_lens > T).any(),
            (label_lens < 0).any(),
            (label_lens > max_label).any(),
        ]
    ).tolist()
    if bad[0]:
        raise ValueError(f"act_lens must be >= 0, got {act_lens.tolist()}")
    if bad[1]:
        raise ValueError(
            f"act_lens must be <= acts.shape[1] (T = {T}), got {act_lens.tolist()}"
        )
    if bad[2]:
        raise ValueError(f"label_lens must be >= 0, got {label_lens.tolist()}")
    if bad[3]:
        raise ValueError(
            f"label_lens must be <= acts.shape[2] - 1 (U - 1 = {U - 1}) and <= "
            f"labels.shape[1] = {labels.shape[1]}, got {label_lens.tolist()}"
        )

    labels = labels[:, :max_label]
    valid = torch.arange(max_label, device=labels.device)[None, :] < label_lens[:, None]
    if max_label > 0:
        out_of_range = valid & ((labels < 0) | (labels >= V))
        is_blank = torch.zeros_like(valid)
        for k in blank_ids:
            is_blank |= labels == k
        is_blank &= valid
        flags = torch.stack([out_of_range.any(), is_blank.any()]).tolist()
        if flags[0]:
            b, j = out_of_range.nonzero()[0].tolist()
            raise ValueError(
                f"labels must be ids in [0, {vocab_text}) within label_lens; "
                f"labels[{b}, {j}] = {labels[b, j].item()}"
            )
        if flags[1]:
            b, j = is_blank.nonzero()[0].tolist()
            raise ValueError(
                f"labels must not contain a blank id ({blank_text}); "
                f"labels[{b}, {j}] = {labels[b, j].item()}"
            )
    labels = torch.where(
        valid, labels, torch.zeros((), dtype=labels.dtype, device=labels.device)
    )
    return labels.contiguous(), act_lens.contiguous(), label_lens.contiguous()


def _check_on_host(
    T, U, labels, act_lens, label_lens, V, blank_ids, vocab_text, blank_text
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`check_lengths_and_labels` for CPU tensors (B > 0), same messages, the
    checks compiled (``espnet_multiblank.loss.cpu.host_checks``)."""
    from espnet_multiblank.loss.cpu import host_checks as hc

    act_lens = act_lens.numpy().astype(np.int64)
    label_lens = label_lens.numpy().astype(np.int64)
    max_label = min(U - 1, labels.shape[1])
    # a copy: its padding is zeroed, the caller's labels stay as they are
    lab = np.array(labels.numpy()[:, :max_label], dtype=np.int64, order="C")
    code, b, j = hc.scan_lengths_and_labels(
        T, max_label, act_lens, label_lens, lab, V, hc.blank_id_array(blank_ids)
    )
    if code == hc.ACT_LEN_NEGATIVE:
        raise ValueError(f"act_lens must be >= 0, got {act_lens.tolist()}")
    if code == hc.ACT_LEN_ABOVE_T:
        raise ValueError(
            f"act_lens must be <= acts.shape[1] (T = {T}), got {act_lens.tolist()}"
        )
    if code == hc.LABEL_LEN_NEGATIVE:
        raise ValueError(f"label_lens must be >= 0, got {label_lens.tolist()}")
    if code == hc.LABEL_LEN_TOO_LARGE:
        raise ValueError(
            f"label_lens must be <= acts.shape[2] - 1 (U - 1 = {U - 1}) and <= "
            f"labels.shape[1] = {labels.shape[1]}, got {label_lens.tolist()}"
        )
    if code == hc.LABEL_OUT_OF_RANGE:
        raise ValueError(
            f"labels must be ids in [0, {vocab_text}) within label_lens; "
            f"labels[{b}, {j}] = {int(lab[b, j])}"
        )
    if code == hc.LABEL_IS_BLANK:
        raise ValueError(
            f"labels must not contain a blank id ({blank_text}); "
            f"labels[{b}, {j}] = {int(lab[b, j])}"
        )
    return (
        torch.from_numpy(lab),
        torch.from_numpy(act_lens),
        torch.from_numpy(label_lens),
    )
