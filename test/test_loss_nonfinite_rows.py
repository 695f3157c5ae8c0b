"""Both loss backends refuse the same non-finite logits, for every lattice (README:
NaN or +inf logits raise ValueError; -inf masks a symbol, and a valid row, or for a
TDT a part of a row, that is -inf throughout has no distribution), and both accept
-inf and NaN anywhere in padding rows."""

import pytest
import torch

from espnet_multiblank import multiblank_rnnt_loss, tdt_loss

BACKENDS = ["numba", "torch"]
LATTICES = ["standard", "multiblank", "tdt"]
V = 6  # softmax symbols (a TDT's tokens; its 3 duration logits follow)


def inputs(lattice):
    g = torch.Generator().manual_seed(0)
    width = V + (3 if lattice == "tdt" else 0)
    acts = torch.randn(2, 5, 3, width, generator=g, dtype=torch.float64)
    labels = torch.tensor([[4, 5], [5, 0]])
    return acts, labels, torch.tensor([5, 4]), torch.tensor([2, 1])


def loss(lattice, acts, labels, act_lens, label_lens, backend):
    kw = dict(reduction="none", backend=backend)
    if lattice == "tdt":
        return tdt_loss(acts, labels, act_lens, label_lens, 3, [0, 1, 2], **kw)
    durations = [2] if lattice == "multiblank" else []
    return multiblank_rnnt_loss(acts, labels, act_lens, label_lens, 3, durations, **kw)


def _parts(lattice):
    """The ranges of a row with a softmax of their own."""
    return [slice(0, V), slice(V, V + 3)] if lattice == "tdt" else [slice(0, V)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lattice", LATTICES)
@pytest.mark.parametrize(
    "value, row",
    [
        (float("-inf"), (1, 2, 1)),  # a whole valid row (part) of -inf
        (float("nan"), (0, 4, 2)),  # last frame, last label row
        (float("inf"), (1, 0, 0)),
    ],
)
def test_invalid_valid_row_raises(backend, lattice, value, row):
    for part in _parts(lattice):
        acts, labels, act_lens, label_lens = inputs(lattice)
        if value == float("-inf"):
            acts[row + (part,)] = value
        else:
            col = 3 if part.start == 0 else part.start + 2  # the blank; a duration
            acts[row + (col,)] = value
        with pytest.raises(ValueError, match=r"acts must be finite logits.*utterance"):
            loss(lattice, acts, labels, act_lens, label_lens, backend)


@pytest.mark.parametrize("lattice", LATTICES)
def test_padding_and_masks_accepted_alike(lattice):
    """-inf everywhere in padding (t >= T_b or u > L_b), NaN too, and single -inf
    symbols in valid rows: both backends give the same finite costs."""
    acts, labels, act_lens, label_lens = inputs(lattice)
    acts[1, 4] = float("-inf")  # t = 4 >= T_1 = 4
    acts[1, :, 2] = float("nan")  # u = 2 > L_1 = 1
    acts[0, 1, 1, 5] = float("-inf")  # a masked label in a valid row
    got = {b: loss(lattice, acts, labels, act_lens, label_lens, b) for b in BACKENDS}
    assert torch.isfinite(got["torch"]).all()
    torch.testing.assert_close(got["numba"], got["torch"])
