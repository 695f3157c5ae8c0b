"""Every input check of the loss: the right exception type, and a message that names the
offending argument."""

import math

import pytest
import torch

from espnet_multiblank import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    multiblank_rnnt_loss,
)
from espnet_multiblank.loss.options import make_options

backends = pytest.mark.parametrize("backend", ["torch", "numba"])

B, T, U, V = 2, 5, 4, 8
BLANK = 7  # big blanks (durations [2, 4]) are 6 and 5; labels in [0, 5)
DURATIONS = (2, 4)


def inputs():
    """Valid inputs: (acts, labels, act_lens, label_lens)."""
    acts = torch.randn(B, T, U, V)
    labels = torch.tensor([[1, 2, 3], [4, 0, 0]])
    return acts, labels, torch.tensor([5, 3]), torch.tensor([3, 1])


def call(acts, labels, act_lens, label_lens, backend="torch", **kw):
    kw.setdefault("blank", BLANK)
    kw.setdefault("big_blank_durations", DURATIONS)
    return multiblank_rnnt_loss(
        acts, labels, act_lens, label_lens, backend=backend, **kw
    )


def test_valid_inputs_pass():
    """The baseline used by every other test is accepted."""
    loss = call(*inputs())
    assert math.isfinite(float(loss))


def _replace(i, value):
    args = list(inputs())
    args[i] = value(args[i]) if callable(value) else value
    return args


# ----------------------------------------------------------------------- tensors: ranks
@backends
@pytest.mark.parametrize(
    "index,value,exc,name",
    [
        (0, lambda a: a[0], ValueError, "acts"),  # 3-D
        (0, lambda a: a[None], ValueError, "acts"),  # 5-D
        (1, lambda y: y[0], ValueError, "labels"),  # 1-D
        (1, lambda y: y[:, :, None], ValueError, "labels"),  # 3-D
        (2, lambda t: t[:, None], ValueError, "act_lens"),  # 2-D
        (3, lambda t: t[None], ValueError, "label_lens"),  # 2-D
        (2, lambda t: t[0], ValueError, "act_lens"),  # 0-D
        (0, lambda a: a.tolist(), TypeError, "acts"),  # not a tensor
        (1, lambda y: y.tolist(), TypeError, "labels"),
        (2, [5, 3], TypeError, "act_lens"),
        (3, (3, 1), TypeError, "label_lens"),
    ],
)
def test_ranks_and_types(backend, index, value, exc, name):
    with pytest.raises(exc, match=name):
        call(*_replace(index, value), backend=backend)


@backends
@pytest.mark.parametrize(
    "index,dtype,name",
    [
        (0, torch.int64, "acts"),
        (0, torch.complex64, "acts"),
        (1, torch.float32, "labels"),
        (2, torch.float32, "act_lens"),
        (3, torch.float64, "label_lens"),
        (3, torch.bool, "label_lens"),
    ],
)
def test_dtypes(backend, index, dtype, name):
    with pytest.raises(TypeError, match=name):
        call(*_replace(index, lambda x: x.to(dtype)), backend=backend)


@backends
@pytest.mark.parametrize(
    "index,name", [(1, "labels"), (2, "act_lens"), (3, "label_lens")]
)
def test_batch_mismatch(backend, index, name):
    with pytest.raises(ValueError, match=name):
        call(*_replace(index, lambda x: torch.cat([x, x[:1]])), backend=backend)


@backends
@pytest.mark.parametrize(
    "index,name", [(1, "labels"), (2, "act_lens"), (3, "label_lens")]
)
def test_device_mismatch(backend, index, name):
    """A second device is not needed: 'meta' tensors are enough to exercise the check,
    which must fire before anything reads the values."""
    with pytest.raises(ValueError, match=name):
        call(*_replace(index, lambda x: x.to("meta")), backend=backend)


# ----------------------------------------------------------------------- lengths
@backends
@pytest.mark.parametrize(
    "act_lens,label_lens,name",
    [
        ([-1, 3], [3, 1], "act_lens"),
        ([6, 3], [3, 1], "act_lens"),  # > T
        ([5, 3], [-1, 1], "label_lens"),
        ([5, 3], [4, 1], "label_lens"),  # > U - 1
    ],
)
def test_bad_lengths(backend, act_lens, label_lens, name):
    acts, labels, _, _ = inputs()
    with pytest.raises(ValueError, match=name):
        call(acts, labels, torch.tensor(act_lens), torch.tensor(label_lens), backend)


@backends
def test_label_lens_longer_than_labels(backend):
    """labels narrower than U - 1: label_lens may not exceed labels.shape[1]."""
    acts, labels, act_lens, _ = inputs()
    with pytest.raises(ValueError, match="label_lens"):
        call(acts, labels[:, :2], act_lens, torch.tensor([3, 1]), backend)
    # ... but a narrower labels tensor is fine when the lengths fit
    call(acts, labels[:, :2], act_lens, torch.tensor([2, 1]), backend="torch")


# ----------------------------------------------------------------------- label values
@backends
@pytest.mark.parametrize(
    "bad", [-1, V, 100, BLANK, BLANK - 1, BLANK - 2], ids=lambda v: f"label{v}"
)
def test_bad_label_ids(backend, bad):
    """Out of [0, V), or equal to the standard blank or any big blank, within the valid
    length."""
    acts, labels, act_lens, label_lens = inputs()
    labels = labels.clone()
    labels[0, 2] = bad
    with pytest.raises(ValueError, match="labels"):
        call(acts, labels, act_lens, label_lens, backend)


@pytest.mark.parametrize("bad", [-1, V, 10**6, BLANK, BLANK - 1])
def test_padding_may_hold_anything(bad):
    """Positions >= label_lens[b] are padding and are not checked."""
    acts, labels, act_lens, label_lens = inputs()
    labels = labels.clone()
    labels[1, 1:] = bad
    ref = call(acts, inputs()[1], act_lens, label_lens)
    assert torch.equal(call(acts, labels, act_lens, label_lens), ref)


@backends
def test_callers_labels_are_not_modified(backend):
    """The checks zero the padding of their own copy of the labels."""
    acts, labels, act_lens, label_lens = inputs()
    labels[1, 1:] = -3
    kept = labels.clone()
    call(acts, labels, act_lens, label_lens, backend)
    assert torch.equal(labels, kept)


def test_labels_id_5_is_valid_without_a_third_big_blank():
    """Sanity check of the fixture: with 2 big blanks, id BLANK - 3 is an ordinary
    label."""
    acts, labels, act_lens, label_lens = inputs()
    labels = labels.clone()
    labels[0, 2] = BLANK - 3
    assert math.isfinite(float(call(acts, labels, act_lens, label_lens)))


# ----------------------------------------------------------------------- scalar options
@pytest.mark.parametrize(
    "kw,exc,name",
    [
        (dict(blank=V), ValueError, "blank"),
        (dict(blank=-1, big_blank_durations=()), ValueError, "blank"),
        (dict(blank=1, big_blank_durations=(2, 4)), ValueError, "blank"),  # 1-1-1 < 0
        (dict(blank=0, big_blank_durations=(2,)), ValueError, "blank"),
        (dict(blank=True), TypeError, "blank"),
        (dict(blank=7.0), TypeError, "blank"),
        (dict(blank="7"), TypeError, "blank"),
        (dict(blank=torch.tensor(7.5)), TypeError, "blank"),
        (dict(big_blank_durations=(1,)), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=(0, 2)), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=(-2,)), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=(2, 2)), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=(2, 2.5)), TypeError, "big_blank_durations"),
        (dict(big_blank_durations=(2.0,)), TypeError, "big_blank_durations"),
        (dict(big_blank_durations=(True, 2)), TypeError, "big_blank_durations"),
        (dict(big_blank_durations=2), TypeError, "big_blank_durations"),
        (dict(big_blank_durations="24"), TypeError, "big_blank_durations"),
        (dict(clamp=-0.5), ValueError, "clamp"),
        (dict(clamp=float("nan")), ValueError, "clamp"),
        (dict(clamp="1"), TypeError, "clamp"),
        (dict(sigma=-0.05), ValueError, "sigma"),
        (dict(sigma=float("inf")), ValueError, "sigma"),
        (dict(fastemit_lambda=-0.1), ValueError, "fastemit_lambda"),
        (dict(fastemit_lambda=float("nan")), ValueError, "fastemit_lambda"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(reduction=None), ValueError, "reduction"),
        (dict(reduction="MEAN"), ValueError, "reduction"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_bad_options(kw, exc, name):
    with pytest.raises(exc, match=name):
        call(*inputs(), **kw)


def test_options_cache_is_neither_stale_nor_lenient():
    """make_options caches validated options by the exact arguments: a mutated list
    gives new options, and 7.0 / True are refused after 7 / 1 were accepted."""
    durations = [2, 4]
    first = make_options(BLANK, durations)
    assert make_options(BLANK, [2, 4]) is first
    durations.append(6)
    assert make_options(BLANK, durations).big_blank_durations == (2, 4, 6)
    with pytest.raises(TypeError, match="blank"):
        make_options(float(BLANK), [2, 4])
    make_options(BLANK, [2, 4], "mean", 1)
    with pytest.raises(TypeError, match="big_blank_durations"):
        make_options(BLANK, [2, True])
    with pytest.raises(ValueError, match="reduction"):
        make_options(BLANK, [2, 4], "MEAN")


@pytest.mark.parametrize("backend", ["cuda-numba", "", "Torch", None])
def test_unknown_backend(backend):
    with pytest.raises(ValueError, match="backend"):
        call(*inputs(), backend=backend)


def test_durations_accept_lists_and_numpy_ints():
    np = pytest.importorskip("numpy")
    acts, labels, act_lens, label_lens = inputs()
    a = call(acts, labels, act_lens, label_lens, big_blank_durations=[2, 4])
    b = call(acts, labels, act_lens, label_lens, big_blank_durations=np.array([2, 4]))
    assert torch.equal(a, b)


# ----------------------------------------------------------------------- module forms
@pytest.mark.parametrize(
    "kw,exc,name",
    [
        (dict(blank=True), TypeError, "blank"),
        (dict(blank=7.0), TypeError, "blank"),
        (dict(blank=1, big_blank_durations=(2, 4)), ValueError, "blank"),
        (dict(big_blank_durations=(2, 2)), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=(2.5,)), TypeError, "big_blank_durations"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(sigma=-1.0), ValueError, "sigma"),
        (dict(fastemit_lambda=-1.0), ValueError, "fastemit_lambda"),
        (dict(backend="gpu"), ValueError, "backend"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_module_constructor(kw, exc, name):
    """MultiblankRNNTLoss validates its options at construction."""
    kw = {"blank": BLANK, "big_blank_durations": DURATIONS, **kw}
    with pytest.raises(exc, match=name):
        MultiblankRNNTLoss(**kw)


def test_module_negative_clamp():
    """clamp < 0 is an error for MultiblankRNNTLoss but means "off" for the ESPnet-style
    MultiblankRNNTLossNumba."""
    with pytest.raises(ValueError, match="clamp"):
        MultiblankRNNTLoss(BLANK, DURATIONS, clamp=-1.0)
    assert MultiblankRNNTLossNumba(BLANK, DURATIONS, clamp=-1).opts.clamp == 0.0


def test_module_checks_tensors():
    loss = MultiblankRNNTLoss(BLANK, DURATIONS, backend="torch")
    acts, labels, act_lens, label_lens = inputs()
    with pytest.raises(ValueError, match="label_lens"):
        loss(acts, labels, act_lens, torch.tensor([9, 1]))


# -------------------------------------------------------------------- non-finite logits
@pytest.mark.parametrize("backend", ["numba", "auto"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_logits(backend, value):
    """NaN / +inf logits inside the valid region raise ValueError naming acts (fused
    path)."""
    acts, labels, act_lens, label_lens = inputs()
    acts = acts.clone()
    acts[1, 2, 1, 3] = value
    with pytest.raises(ValueError, match="acts"):
        call(acts.requires_grad_(True), labels, act_lens, label_lens, backend=backend)
