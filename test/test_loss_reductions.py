"""The reductions (``espnet_multiblank.loss.reductions``) against hand-computed
values: the reduced loss and the per-utterance weights of its gradient, for every
name, family, backend and the half-precision path; the one-time notice of
"mean_volume"'s new meaning; ESPnet's 1-element shape for the drop-in class.

The values are written out by hand: all-equal logits give the standard RNN-T cost
in closed form (every step has probability 1/V, and C(T - 1 + L, L) paths), so
with V = 5 and (T_b, L_b) = (4, 2), (3, 0), (5, 3):

    cost_0 = 6 log 5 - log 10,   cost_1 = 3 log 5,   cost_2 = 8 log 5 - log 35
"""

import logging
import math

import pytest
import torch

from espnet_multiblank import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    TDTLoss,
    multiblank_rnnt_loss,
    tdt_loss,
)
from espnet_multiblank.loss import reductions
from espnet_multiblank.loss.options import REDUCTIONS

LOG5 = math.log(5.0)
COSTS = [6 * LOG5 - math.log(10.0), 3 * LOG5, 8 * LOG5 - math.log(35.0)]
ACT_LENS, LABEL_LENS = [4, 3, 5], [2, 0, 3]

#: reduction -> (B,) weights of the costs, by hand for L = (2, 0, 3), B = 3
HAND_WEIGHTS = {
    "none": [1.0, 1.0, 1.0],
    "sum": [1.0, 1.0, 1.0],
    "mean": [1 / 3, 1 / 3, 1 / 3],  # ESPnet: sum / B
    "mean_batch": [1 / 3, 1 / 3, 1 / 3],  # NeMo: sum / B
    "mean_volume": [1 / 5, 1 / 5, 1 / 5],  # NeMo: sum / (2 + 0 + 3)
    "mean_label_normalized": [1 / 6, 1 / 3, 1 / 9],  # NeMo's mean: cost / L / B
}


def test_every_reduction_has_hand_weights():
    assert set(HAND_WEIGHTS) == set(REDUCTIONS)


def _equal_logits_batch(dtype=torch.float64):
    acts = torch.zeros(3, 5, 4, 5, dtype=dtype)
    labels = torch.tensor([[1, 2, 3], [1, 1, 1], [4, 2, 3]])
    return acts, labels, torch.tensor(ACT_LENS), torch.tensor(LABEL_LENS)


def _loss_and_grad(fn, acts, *args, grad_out=None, **kw):
    x = acts.clone().requires_grad_(True)
    loss = fn(x, *args, **kw)
    if grad_out is None:
        grad_out = torch.ones_like(loss)
    (g,) = torch.autograd.grad(loss, x, grad_outputs=grad_out.to(loss.dtype))
    return loss.detach(), g


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_standard_loss_equals_the_hand_computed_value(reduction, backend, dtype):
    """The reduced loss is sum_b w_b cost_b with the hand-written weights, and its
    gradient is the per-utterance gradients weighted by the same w_b."""
    acts, labels, al, ll = _equal_logits_batch(dtype)
    kw = dict(blank=0, reduction=reduction, backend=backend)
    loss, g = _loss_and_grad(multiblank_rnnt_loss, acts, labels, al, ll, **kw)
    w = HAND_WEIGHTS[reduction]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    if reduction == "none":
        want = torch.tensor(COSTS, dtype=torch.float64)
    else:
        want = torch.tensor(sum(wb * c for wb, c in zip(w, COSTS)), dtype=torch.float64)
    torch.testing.assert_close(loss.double(), want, rtol=tol, atol=tol)
    # the gradient: the "none" gradient with the hand weights flowing in
    kw["reduction"] = "none"
    _, g_w = _loss_and_grad(
        multiblank_rnnt_loss,
        acts,
        labels,
        al,
        ll,
        grad_out=torch.tensor(w, dtype=torch.float64),
        **kw,
    )
    gtol = 1e-12 if dtype == torch.float64 else 2e-3
    torch.testing.assert_close(g.double(), g_w.double(), rtol=gtol, atol=gtol)


def _random_batch(width, seed):
    g = torch.Generator().manual_seed(seed)
    acts = torch.randn(3, 5, 4, width, generator=g, dtype=torch.float64)
    labels = torch.tensor([[1, 2, 3], [1, 1, 1], [4, 2, 3]])
    return acts, labels, torch.tensor(ACT_LENS), torch.tensor(LABEL_LENS)


FAMILIES = {
    "multiblank": (
        multiblank_rnnt_loss,
        dict(blank=7, big_blank_durations=(2, 3), sigma=0.05),
        8,
    ),
    "tdt": (tdt_loss, dict(blank=0, durations=(0, 1, 2), sigma=0.05), 8),
}


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_big_blank_and_tdt_reductions_use_the_hand_weights(family, reduction, backend):
    """Multi-blank and TDT: the reduction of the "none" costs with the hand weights,
    and the gradient weighted by them."""
    fn, kw, width = FAMILIES[family]
    acts, labels, al, ll = _random_batch(width, seed=3)
    costs, _ = _loss_and_grad(fn, acts, labels, al, ll, reduction="none", **kw)
    loss, g = _loss_and_grad(
        fn, acts, labels, al, ll, reduction=reduction, backend=backend, **kw
    )
    w = torch.tensor(HAND_WEIGHTS[reduction], dtype=torch.float64)
    want = costs if reduction == "none" else (costs * w).sum()
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    _, g_w = _loss_and_grad(
        fn, acts, labels, al, ll, reduction="none", backend=backend, grad_out=w, **kw
    )
    torch.testing.assert_close(g, g_w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_mean_volume_without_any_label_divides_by_one(backend):
    """NeMo would divide by sum L_b = 0 (inf or NaN); here the loss is the sum."""
    acts = torch.zeros(2, 3, 1, 5, dtype=torch.float64)
    labels = torch.zeros(2, 0, dtype=torch.long)
    al, ll = torch.tensor([3, 2]), torch.tensor([0, 0])
    loss = multiblank_rnnt_loss(
        acts, labels, al, ll, 0, (), "mean_volume", backend=backend
    )
    assert abs(float(loss) - 5 * LOG5) < 1e-12  # (3 + 2) blanks of probability 1/5


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("reduction", [r for r in REDUCTIONS if r != "none"])
def test_empty_batch_reduces_to_zero(backend, reduction):
    acts = torch.zeros(0, 3, 2, 5, requires_grad=True)
    labels = torch.zeros(0, 1, dtype=torch.long)
    lens = torch.zeros(0, dtype=torch.long)
    loss = multiblank_rnnt_loss(
        acts, labels, lens, lens, 0, (), reduction, backend=backend
    )
    assert float(loss.detach()) == 0.0


def test_mean_volume_logs_its_new_meaning_once(caplog, monkeypatch):
    """The first "mean_volume" of a process says what it means now and which name
    has the old meaning; later ones (any family) say nothing."""
    monkeypatch.setitem(reductions._notice, "mean_volume_shown", False)
    with caplog.at_level(logging.WARNING, logger=reductions.__name__):
        # unusual sigmas: options the cache of make_options has not seen
        MultiblankRNNTLoss(3, (2, 4, 8), "mean_volume", sigma=0.01234)
        TDTLoss(0, (0, 1), reduction="mean_volume", sigma=0.01234)
        MultiblankRNNTLoss(3, (2, 4, 8), "mean", sigma=0.01235)
    notices = [r for r in caplog.records if "mean_volume" in r.getMessage()]
    assert len(notices) == 1, [r.getMessage() for r in caplog.records]
    text = notices[0].getMessage()
    assert "sum of the label counts" in text and "mean_label_normalized" in text


def test_unknown_reduction_names_the_argument():
    with pytest.raises(ValueError, match="reduction"):
        MultiblankRNNTLoss(0, (), "mean_utterance")


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_drop_in_class_has_espnets_shapes_and_values(reduction):
    """MultiblankRNNTLossNumba without big blanks against ESPnet's own CPU
    RNNTLossNumba (the same reduction code as ESPnet's multi-blank class): a
    1-element vector for "sum" and "mean", (B,) for "none"; same values and
    gradient."""
    import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (nltk first)

    # isort: split
    from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import RNNTLossNumba

    acts, labels, al, ll = _random_batch(6, seed=5)
    acts = acts.float()
    x1 = acts.clone().requires_grad_(True)
    theirs = RNNTLossNumba(blank=0, reduction=reduction)(
        x1, labels.int(), al.int(), ll.int()
    )
    theirs.sum().backward()
    x2 = acts.clone().requires_grad_(True)
    ours = MultiblankRNNTLossNumba(0, [], reduction)(x2, labels, al, ll)
    ours.sum().backward()
    assert ours.shape == theirs.shape == ((3,) if reduction == "none" else (1,))
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-5)
