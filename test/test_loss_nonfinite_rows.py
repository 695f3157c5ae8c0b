"""Both loss backends refuse the same non-finite logits (README: NaN or +inf logits
raise ValueError; -inf masks a symbol, and a valid row that is -inf throughout has no
distribution), and both accept -inf anywhere in padding rows."""

import pytest
import torch

from espnet_multiblank import multiblank_rnnt_loss

BACKENDS = ["numba", "torch"]


def inputs():
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(2, 5, 3, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([[4, 5], [5, 0]])
    return acts, labels, torch.tensor([5, 4]), torch.tensor([2, 1])


def loss(acts, labels, act_lens, label_lens, backend):
    return multiblank_rnnt_loss(
        acts,
        labels,
        act_lens,
        label_lens,
        blank=3,
        big_blank_durations=[2],
        reduction="none",
        backend=backend,
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "value, row",
    [
        (float("-inf"), (1, 2, 1)),  # a whole valid row of -inf
        (float("nan"), (0, 4, 2)),  # last frame, last label row
        (float("inf"), (1, 0, 0)),
    ],
)
def test_invalid_valid_row_raises(backend, value, row):
    acts, labels, act_lens, label_lens = inputs()
    if value == float("-inf"):
        acts[row] = value
    else:
        acts[row + (3,)] = value
    with pytest.raises(ValueError, match=r"acts must be finite logits.*utterance"):
        loss(acts, labels, act_lens, label_lens, backend)


def test_padding_and_masks_accepted_alike():
    """-inf everywhere in padding (t >= T_b or u > L_b) and single -inf symbols in
    valid rows: both backends give the same finite costs."""
    acts, labels, act_lens, label_lens = inputs()
    acts[1, 4] = float("-inf")  # t = 4 >= T_1 = 4
    acts[1, :, 2] = float("nan")  # u = 2 > L_1 = 1
    acts[0, 1, 1, 5] = float("-inf")  # a masked label in a valid row
    got = {b: loss(acts, labels, act_lens, label_lens, b) for b in BACKENDS}
    assert torch.isfinite(got["torch"]).all()
    torch.testing.assert_close(got["numba"], got["torch"])
