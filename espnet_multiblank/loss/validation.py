"""Checks of the losses' tensor inputs, with messages that name the argument.

One set of checks for every lattice family: what differs (the width of a row of
logits, which ids are blanks, how the messages name them) comes from the family
record (``espnet_multiblank.loss.families``). Every message is written once, here.

All checks on values (lengths, label ids) run on the tensors' own device: on CUDA as
reductions (nothing logits-sized is copied to the host; the few booleans that decide
whether to raise are the only host synchronisations), on the CPU as one compiled pass
(``loss/cpu/host_checks.py``: a dozen small numpy operations would cost a noticeable
part of a small loss).
"""

from typing import Sequence, Tuple

import numpy as np
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)

# the value checks, in the order they run (``loss/cpu/host_checks.py`` returns them)
OK = 0
ACT_LEN_NEGATIVE = 1
ACT_LEN_ABOVE_T = 2
LABEL_LEN_NEGATIVE = 3
LABEL_LEN_TOO_LARGE = 4
LABEL_OUT_OF_RANGE = 5
LABEL_IS_BLANK = 6


def nonfinite_logits_message(b: int) -> str:
    """The error of a valid row with NaN / +inf logits or a distribution of only
    -inf (every backend and the kernels' NaN costs raise it)."""
    return (
        "acts must be finite logits (-inf allowed for masked symbols); "
        f"utterance {b} contains NaN, +inf or a row that is -inf throughout"
    )


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
    opts,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes, dtypes, devices and values of a batch for the loss of ``opts``
    (either family); return int64 labels and lengths.

    Returns:
        labels: (B, L) int64 on acts.device, with padding (positions >= label_lens[b])
            replaced by 0 so that every backend may gather with it safely.
        act_lens: (B,) int64.  label_lens: (B,) int64.
    """
    from espnet_multiblank.loss.families import family_of

    family = family_of(opts)
    check_tensors(acts, labels, act_lens, label_lens, family.acts_what)
    rule = family.label_rule(opts, acts.shape[3])
    return check_lengths_and_labels(acts, labels, act_lens, label_lens, rule)


def check_tensors(acts, labels, act_lens, label_lens, acts_what: str) -> None:
    """Types, ranks, dtypes, batch sizes and devices of the four tensor inputs."""
    _check_tensor("acts", acts, 4, FLOAT_DTYPES, acts_what)
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


class LabelRule:
    """Which label ids are valid: ``[0, num_labels)`` minus ``blank_ids``, and how the
    messages name the bound (``vocab_text``) and the blanks (``blank_text``)."""

    __slots__ = ("num_labels", "blank_ids", "vocab_text", "blank_text")

    def __init__(self, num_labels: int, blank_ids, vocab_text: str, blank_text: str):
        self.num_labels = num_labels
        self.blank_ids = tuple(blank_ids)
        self.vocab_text = vocab_text
        self.blank_text = blank_text


def _raise_input_error(code, T, U, labels_width, act_lens, label_lens, rule, b, j, v):
    """Raise the ValueError of a failed value check (a code of this module; the
    lengths as Python lists, ``v`` the offending label id)."""
    if code == ACT_LEN_NEGATIVE:
        raise ValueError(f"act_lens must be >= 0, got {act_lens}")
    if code == ACT_LEN_ABOVE_T:
        raise ValueError(f"act_lens must be <= acts.shape[1] (T = {T}), got {act_lens}")
    if code == LABEL_LEN_NEGATIVE:
        raise ValueError(f"label_lens must be >= 0, got {label_lens}")
    if code == LABEL_LEN_TOO_LARGE:
        raise ValueError(
            f"label_lens must be <= acts.shape[2] - 1 (U - 1 = {U - 1}) and <= "
            f"labels.shape[1] = {labels_width}, got {label_lens}"
        )
    if code == LABEL_OUT_OF_RANGE:
        raise ValueError(
            f"labels must be ids in [0, {rule.vocab_text}) within label_lens; "
            f"labels[{b}, {j}] = {v}"
        )
    if code == LABEL_IS_BLANK:
        raise ValueError(
            f"labels must not contain a blank id ({rule.blank_text}); "
            f"labels[{b}, {j}] = {v}"
        )


def check_lengths_and_labels(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    rule: LabelRule,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lengths within (T, U - 1) and label ids in [0, rule.num_labels) and not a
    blank.

    Args:
        acts: (B, T, U, *) logits (only the shape is used).
        rule: the family's :class:`LabelRule`.
    Returns:
        As :func:`validate_inputs`.
    """
    B, T, U = acts.shape[:3]
    if B > 0 and labels.device.type == "cpu":
        # the same checks compiled: a torch op costs microseconds, and a small
        # problem's whole loss well under a millisecond
        return _check_on_host(T, U, labels, act_lens, label_lens, rule)
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
            _raise_input_error(
                code,
                T,
                U,
                labels.shape[1],
                act_lens.tolist(),
                label_lens.tolist(),
                rule,
                0,
                0,
                0,
            )

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
                _raise_input_error(
                    code, T, U, 0, None, None, rule, b, j, labels[b, j].item()
                )
    labels = torch.where(
        valid, labels, torch.zeros((), dtype=labels.dtype, device=labels.device)
    )
    return labels.contiguous(), act_lens.contiguous(), label_lens.contiguous()


def _check_on_host(
    T, U, labels, act_lens, label_lens, rule: LabelRule
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
        _raise_input_error(
            code,
            T,
            U,
            labels.shape[1],
            act_lens.tolist(),
            label_lens.tolist(),
            rule,
            b,
            j,
            int(lab[b, j]) if lab.size else 0,
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
