"""The rules of the value checks of a loss's inputs: the error codes, which label ids
a lattice allows, and how the messages name the arguments.

A leaf module (no torch, no Numba): the checks (``validation.py``), the family records
that make the rules (``families.py``) and the compiled CPU checks
(``cpu/host_checks.py``, which return the codes) all import it, and nothing here
imports them.
"""

from dataclasses import dataclass
from typing import Optional, Sequence

# the value checks, in the order they run (``cpu/host_checks.py`` returns them)
OK = 0
ACT_LEN_NEGATIVE = 1
ACT_LEN_ABOVE_T = 2
LABEL_LEN_NEGATIVE = 3
LABEL_LEN_TOO_LARGE = 4
LABEL_OUT_OF_RANGE = 5
LABEL_IS_BLANK = 6


@dataclass(frozen=True)
class ArgNames:
    """How the messages name the arguments that give a batch its lattice's shape.

    The dense losses take one logits tensor ``acts`` (B, T, U, V'); the fused joint +
    loss takes ``enc`` (B, T, J), ``pred`` (B, U, J) and ``weight`` (V', J) instead.

    Attributes:
        tensor: the tensor whose batch size and device the others must share.
        batch, frames, positions, width: where B, T, U and V' are read.
        durations: how the number D of TDT durations is named.
    """

    tensor: str = "acts"
    batch: str = "acts.shape[0]"
    frames: str = "acts.shape[1]"
    positions: str = "acts.shape[2]"
    width: str = "acts.shape[3]"
    durations: str = "len(durations)"


#: the dense losses' names
DENSE_NAMES = ArgNames()


class LabelRule:
    """Which label ids are valid: ``[0, num_labels)`` minus ``blank_ids``, and how the
    messages name the bound (``vocab_text``) and the blanks (``blank_text``)."""

    __slots__ = ("num_labels", "blank_ids", "vocab_text", "blank_text")

    def __init__(self, num_labels: int, blank_ids, vocab_text: str, blank_text: str):
        self.num_labels = num_labels
        self.blank_ids = tuple(blank_ids)
        self.vocab_text = vocab_text
        self.blank_text = blank_text


def input_error(
    code: int,
    T: int,
    U: int,
    labels_width: int,
    act_lens: Optional[Sequence[int]],
    label_lens: Optional[Sequence[int]],
    rule: LabelRule,
    names: ArgNames,
    where=(0, 0, 0),
) -> ValueError:
    """The ValueError of a failed value check.

    Args:
        code: one of the codes of this module (not OK).
        T, U: the frames and label positions of the batch; labels_width:
            labels.shape[1].
        act_lens, label_lens: the lengths as lists (for the length checks).
        rule: the lattice's label rule; names: how to name the arguments.
        where: ``(b, j, id)`` of the offending label (for the label checks).
    """
    b, j, v = where
    if code == ACT_LEN_NEGATIVE:
        return ValueError(f"act_lens must be >= 0, got {act_lens}")
    if code == ACT_LEN_ABOVE_T:
        return ValueError(
            f"act_lens must be <= {names.frames} (T = {T}), got {act_lens}"
        )
    if code == LABEL_LEN_NEGATIVE:
        return ValueError(f"label_lens must be >= 0, got {label_lens}")
    if code == LABEL_LEN_TOO_LARGE:
        return ValueError(
            f"label_lens must be <= {names.positions} - 1 (U - 1 = {U - 1}) and <= "
            f"labels.shape[1] = {labels_width}, got {label_lens}"
        )
    if code == LABEL_OUT_OF_RANGE:
        return ValueError(
            f"labels must be ids in [0, {rule.vocab_text}) within label_lens; "
            f"labels[{b}, {j}] = {v}"
        )
    if code == LABEL_IS_BLANK:
        return ValueError(
            f"labels must not contain a blank id ({rule.blank_text}); "
            f"labels[{b}, {j}] = {v}"
        )
    raise AssertionError(f"not an error code: {code}")
