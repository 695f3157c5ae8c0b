"""Every input check of the TDT loss: the right exception type and a message that
names the offending argument."""

import math

import pytest
import torch

from espnet_multiblank import TDTLoss, tdt_loss

backends = pytest.mark.parametrize("backend", ["torch", "numba"])

B, T, U = 2, 5, 4
V, BLANK = 6, 2  # token logits 0..5, blank 2
DURATIONS = (0, 1, 2)
VD = V + len(DURATIONS)


def inputs():
    """Valid inputs: (acts, labels, act_lens, label_lens)."""
    acts = torch.randn(B, T, U, VD)
    labels = torch.tensor([[1, 3, 5], [4, 0, 0]])
    return acts, labels, torch.tensor([5, 3]), torch.tensor([3, 1])


def call(acts, labels, act_lens, label_lens, backend="torch", **kw):
    kw.setdefault("blank", BLANK)
    kw.setdefault("durations", DURATIONS)
    return tdt_loss(acts, labels, act_lens, label_lens, backend=backend, **kw)


def test_valid_inputs_pass():
    assert math.isfinite(float(call(*inputs())))


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "kw,exc,name",
    [
        (dict(durations=[]), ValueError, "durations"),
        (dict(durations=None), TypeError, "durations"),
        (dict(durations=[0]), ValueError, "durations"),  # nothing >= 1
        (dict(durations=[-1, 1]), ValueError, "durations"),
        (dict(durations=[1, 2, 1]), ValueError, "durations"),  # not distinct
        (dict(durations=[1, 2.5]), TypeError, "durations"),
        (dict(durations=[1, True]), TypeError, "durations"),
        (dict(durations="12"), TypeError, "durations"),
        (dict(durations=3), TypeError, "durations"),
        (dict(blank=-1), ValueError, "blank"),
        (dict(blank=1.0), TypeError, "blank"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(sigma=-0.1), ValueError, "sigma"),
        (dict(sigma=float("nan")), ValueError, "sigma"),
        (dict(sigma="0.05"), TypeError, "sigma"),
        (dict(omega=-0.1), ValueError, "omega"),
        (dict(omega=1.5), ValueError, "omega"),
        (dict(omega=float("nan")), ValueError, "omega"),
        (dict(omega="0.1"), TypeError, "omega"),
        (dict(fastemit_lambda=-1.0), ValueError, "fastemit_lambda"),
        (dict(clamp=-0.5), ValueError, "clamp"),
        (dict(clamp=float("inf")), ValueError, "clamp"),
        (dict(backend="cuda"), ValueError, "backend"),
    ],
)
def test_bad_options(kw, exc, name):
    with pytest.raises(exc, match=name):
        call(*inputs(), **kw)
    ctor = dict(blank=BLANK, durations=DURATIONS)
    ctor.update(kw)
    with pytest.raises(exc, match=name):
        TDTLoss(**ctor)


def test_durations_accept_tensors_and_any_order():
    loss = TDTLoss(BLANK, torch.tensor([2, 0, 1]))
    assert loss.durations == (2, 0, 1)


# ---------------------------------------------------------------------- tensors
@backends
@pytest.mark.parametrize(
    "index,value,exc,name",
    [
        (0, lambda a: a[0], ValueError, "acts"),
        (0, lambda a: a.tolist(), TypeError, "acts"),
        (0, lambda a: a.long(), TypeError, "acts"),
        (1, lambda y: y[0], ValueError, "labels"),
        (1, lambda y: y.float(), TypeError, "labels"),
        (2, lambda t: t[:, None], ValueError, "act_lens"),
        (3, [3, 1], TypeError, "label_lens"),
        (2, lambda t: t[:1], ValueError, "act_lens"),  # batch size
        (2, lambda t: torch.tensor([6, 3]), ValueError, "act_lens"),  # > T
        (2, lambda t: torch.tensor([-1, 3]), ValueError, "act_lens"),
        (3, lambda t: torch.tensor([4, 1]), ValueError, "label_lens"),  # > U - 1
        (3, lambda t: torch.tensor([3, -1]), ValueError, "label_lens"),
    ],
)
def test_bad_tensors(backend, index, value, exc, name):
    args = list(inputs())
    args[index] = value(args[index]) if callable(value) else value
    with pytest.raises(exc, match=name):
        call(*args, backend=backend)


@backends
@pytest.mark.parametrize(
    "bad_label",
    [BLANK, V, VD - 1, -1],  # the blank, a duration logit's index (twice), negative
)
def test_bad_label_ids(backend, bad_label):
    acts, labels, act_lens, label_lens = inputs()
    labels = labels.clone()
    labels[0, 1] = bad_label
    with pytest.raises(ValueError, match="labels"):
        call(acts, labels, act_lens, label_lens, backend=backend)
    # the same id in the padding is ignored
    labels = inputs()[1].clone()
    labels[1, 2] = bad_label
    assert math.isfinite(
        float(call(acts, labels, act_lens, label_lens, backend=backend))
    )


@backends
@pytest.mark.parametrize("width", [len(DURATIONS), 2, 0])
def test_joint_output_too_narrow(backend, width):
    """acts.shape[3] must be V + D with the blank < V."""
    acts, labels, act_lens, label_lens = inputs()
    with pytest.raises(ValueError, match=r"acts\.shape\[3\]"):
        call(
            acts[..., :width],
            labels.clamp(max=0),
            act_lens,
            label_lens,
            backend=backend,
        )


@backends
def test_blank_beyond_token_logits(backend):
    acts, labels, act_lens, label_lens = inputs()
    with pytest.raises(ValueError, match="blank"):
        call(acts, labels, act_lens, label_lens, blank=V, backend=backend)


# ---------------------------------------------------------------- non-finite logits
@pytest.mark.parametrize("backend", ["torch", "numba", "auto"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("k", [1, V + 1], ids=["token", "duration"])
@pytest.mark.parametrize("omega", [0.0, 1.0])
def test_non_finite_logits(backend, value, k, omega):
    """NaN / +inf in a valid row (token or duration part) raise ValueError naming acts,
    with or without gradient, on the TDT and on omega's RNN-T branch."""
    acts, labels, act_lens, label_lens = inputs()
    acts[1, 2, 1, k] = value
    with pytest.raises(ValueError, match="acts"):
        call(acts, labels, act_lens, label_lens, backend=backend, omega=omega)
    with pytest.raises(ValueError, match="acts"):
        call(
            acts.requires_grad_(True),
            labels,
            act_lens,
            label_lens,
            backend=backend,
            omega=omega,
        )


@backends
def test_all_masked_duration_row_raises(backend):
    """A row whose duration logits are all -inf has no duration distribution."""
    acts, labels, act_lens, label_lens = inputs()
    acts[0, 1, 1, V:] = -math.inf
    with pytest.raises(ValueError, match="acts"):
        call(acts, labels, act_lens, label_lens, backend=backend)
