"""Checks of the loss's tensor inputs, with messages that name the argument.

One set of checks for every lattice family and for both callers (the dense losses,
the fused joint + loss): what differs (which ids are labels, how the messages name
the blanks and the arguments) comes in as a
:class:`~espnet_multiblank.loss.label_rules.LabelRule` (from the family record,
``espnet_multiblank.loss.families``) and an
:class:`~espnet_multiblank.loss.label_rules.ArgNames`. Every message is written once,
here and in ``label_rules.py``.

All checks on values (lengths, label ids) run on the tensors' own device: on CUDA as
reductions (nothing logits-sized is copied to the host; the few booleans that decide
whether to raise are the only host synchronisations), on the CPU as one compiled pass
(``loss/cpu/host_checks.py``: a dozen small numpy operations would cost a noticeable
part of a small loss).
"""

from typing import Sequence, Tuple

import numpy as np
import torch

from espnet_multiblank.loss.label_rules import (
    ACT_LEN_ABOVE_T,
    ACT_LEN_NEGATIVE,
    DENSE_NAMES,
    LABEL_IS_BLANK,
    LABEL_LEN_NEGATIVE,
    LABEL_LEN_TOO_LARGE,
    LABEL_OUT_OF_RANGE,
    OK,
    ArgNames,
    LabelRule,
    input_error,
)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def nonfinite_logits_message(b: int) -> str:
    """The error of a valid row with NaN / +inf logits or a distribution of only
    -inf (every backend and the kernels' NaN costs raise it)."""
    return (
        "acts must be finite logits (-inf allowed for masked symbols); "
        f"utterance {b} contains NaN, +inf or a row that is -inf throughout"
    )


def check_tensor(name: str, x, ndim: int, dtypes, what: str) -> None:
    """TypeError / ValueError unless ``x`` is a ``ndim``-D tensor of one of
    ``dtypes`` (``what``: what it should be, for the message)."""
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
    opts,
    family,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes, dtypes, devices and values of a batch for the loss of ``opts``
    (either family); return int64 labels and lengths.

    Args:
        acts, labels, act_lens, label_lens: as the losses take them.
        opts: validated options; family: their
            :class:`~espnet_multiblank.loss.families.LatticeFamily`.
    Returns:
        labels: (B, L) int64 on acts.device, with padding (positions >= label_lens[b])
            replaced by 0 so that every backend may gather with it safely.
        act_lens: (B,) int64.  label_lens: (B,) int64.
    """
    check_tensor("acts", acts, 4, FLOAT_DTYPES, family.acts_what)
    B, T, U, width = acts.shape
    check_label_tensors(labels, act_lens, label_lens, B, acts.device, DENSE_NAMES)
    if U < 1:
        raise ValueError(f"acts.shape[2] (U = max labels + 1) must be >= 1, got {U}")
    rule = family.label_rule(opts, width, DENSE_NAMES)
    return check_lengths_and_labels(T, U, labels, act_lens, label_lens, rule)


def check_label_tensors(
    labels, act_lens, label_lens, B: int, device, names: ArgNames
) -> None:
    """Types, ranks, dtypes, batch sizes (B) and devices (``device``) of the labels
    and lengths; ``names`` says how the messages name the tensor they follow."""
    check_tensor("labels", labels, 2, INT_DTYPES, "label ids of shape (B, U - 1)")
    check_tensor("act_lens", act_lens, 1, INT_DTYPES, "frames per utterance, (B,)")
    check_tensor("label_lens", label_lens, 1, INT_DTYPES, "labels per utterance, (B,)")
    for name, x in (
        ("labels", labels),
        ("act_lens", act_lens),
        ("label_lens", label_lens),
    ):
        if x.shape[0] != B:
            raise ValueError(
                f"{name}.shape[0] must equal the batch size {names.batch} = {B}, "
                f"got {x.shape[0]}"
            )
        if x.device != device:
            raise ValueError(
                f"{name} must be on the same device as {names.tensor} ({device}), "
                f"got {x.device}"
            )


def check_lengths_and_labels(
    T: int,
    U: int,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    rule: LabelRule,
    names: ArgNames = DENSE_NAMES,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lengths within (T, U - 1) and label ids in [0, rule.num_labels) and not a
    blank.

    Args:
        T, U: the batch's frames and label positions (U = max labels + 1).
        labels, act_lens, label_lens: checked by :func:`check_label_tensors`.
        rule: the family's :class:`LabelRule`; names: how to name the arguments.
    Returns:
        As :func:`validate_inputs`.
    """
    B = act_lens.shape[0]
    if B > 0 and labels.device.type == "cpu":
        # the same checks compiled: a torch op costs microseconds, and a small
        # problem's whole loss well under a millisecond
        return _check_on_host(T, U, labels, act_lens, label_lens, rule, names)
    act_lens = act_lens.long()
    label_lens = label_lens.long()
    labels = labels.long()
    if B == 0:
        return labels, act_lens, label_lens

    max_label = min(U - 1, labels.shape[1])
    # One host synchronisation for all the cheap (B,) checks, in the order of
    # host_checks.scan_lengths_and_labels.
    bad = torch.stack(
        [
            (act_lens < 0).any(),
            (act_lens > T).any(),
            (label_lens < 0).any(),
            (label_lens > max_label).any(),
        ]
    ).tolist()
    length_codes = (
        ACT_LEN_NEGATIVE,
        ACT_LEN_ABOVE_T,
        LABEL_LEN_NEGATIVE,
        LABEL_LEN_TOO_LARGE,
    )
    for failed, code in zip(bad, length_codes):
        if failed:
            raise _value_error(code, T, U, labels, act_lens, label_lens, rule, names)

    labels = labels[:, :max_label]
    valid = torch.arange(max_label, device=labels.device)[None, :] < label_lens[:, None]
    if max_label > 0:
        out_of_range = valid & ((labels < 0) | (labels >= rule.num_labels))
        is_blank = torch.zeros_like(valid)
        for k in rule.blank_ids:
            is_blank |= labels == k
        is_blank &= valid
        flags = torch.stack([out_of_range.any(), is_blank.any()]).tolist()
        for failed, where, code in zip(
            flags,
            (out_of_range, is_blank),
            (LABEL_OUT_OF_RANGE, LABEL_IS_BLANK),
        ):
            if failed:
                b, j = where.nonzero()[0].tolist()
                v = labels[b, j].item()
                raise _value_error(
                    code, T, U, labels, act_lens, label_lens, rule, names, (b, j, v)
                )
    labels = torch.where(
        valid, labels, torch.zeros((), dtype=labels.dtype, device=labels.device)
    )
    return labels.contiguous(), act_lens.contiguous(), label_lens.contiguous()


def _value_error(
    code, T, U, labels, act_lens, label_lens, rule, names, where=(0, 0, 0)
) -> ValueError:
    """``label_rules.input_error`` of a failed check of :func:`check_lengths_and_labels`
    (``act_lens``, ``label_lens``: tensors or numpy arrays; the lengths are read only
    for the messages of the length checks)."""
    return input_error(
        code,
        T,
        U,
        labels.shape[1],
        act_lens.tolist(),
        label_lens.tolist(),
        rule,
        names,
        where,
    )


def _check_on_host(
    T, U, labels, act_lens, label_lens, rule: LabelRule, names: ArgNames
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`check_lengths_and_labels` for CPU tensors (B > 0), the checks compiled
    (``espnet_multiblank.loss.cpu.host_checks``)."""
    from espnet_multiblank.loss.cpu import host_checks

    act_lens = act_lens.numpy().astype(np.int64)
    label_lens = label_lens.numpy().astype(np.int64)
    max_label = min(U - 1, labels.shape[1])
    # a copy: its padding is zeroed, the caller's labels stay as they are
    lab = np.array(labels.numpy()[:, :max_label], dtype=np.int64, order="C")
    code, b, j = host_checks.scan_lengths_and_labels(
        T,
        max_label,
        act_lens,
        label_lens,
        lab,
        rule.num_labels,
        host_checks.blank_id_array(rule.blank_ids),
    )
    if code != OK:
        v = int(lab[b, j]) if lab.size else 0
        raise _value_error(
            code, T, U, labels, act_lens, label_lens, rule, names, (b, j, v)
        )
    return (
        torch.from_numpy(lab),
        torch.from_numpy(act_lens),
        torch.from_numpy(label_lens),
    )


def valid_nodes(acts, act_lens, label_lens) -> torch.Tensor:
    """(B, T, U) bool: the lattice nodes (t < T_b, u <= L_b) whose logits row is read;
    the other rows of ``acts`` (B, T, U, V') are padding."""
    B, T, U = acts.shape[:3]
    t = torch.arange(T, device=acts.device)
    u = torch.arange(U, device=acts.device)
    return (t.view(1, T, 1) < act_lens.view(B, 1, 1).to(acts.device)) & (
        u.view(1, 1, U) <= label_lens.view(B, 1, 1).to(acts.device)
    )


def check_valid_rows(
    acts, act_lens, label_lens, parts: Sequence[Tuple[int, int]] = ()
) -> None:
    """Raise ValueError (:func:`nonfinite_logits_message`) when a valid row of
    ``acts`` (B, T, U, V') holds NaN or +inf, or when one of its ``parts`` (ranges
    ``[lo, hi)`` of the row, each its own softmax) is -inf throughout; padding rows
    are not looked at. The kernels detect the same rows themselves; the PyTorch
    backends call this first."""
    if acts.numel() == 0:
        return
    with torch.no_grad():
        x = acts.detach()
        bad = (torch.isnan(x) | (x == float("inf"))).any(-1)
        for lo, hi in parts:
            bad |= (x[..., lo:hi] == float("-inf")).all(-1)
        bad &= valid_nodes(x, act_lens, label_lens)
        rows = bad.flatten(1).any(1).nonzero()
    if rows.numel():
        raise ValueError(nonfinite_logits_message(int(rows[0])))
