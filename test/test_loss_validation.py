"""Every input check of the losses, for every lattice: the right exception type, and
a message that names the offending argument."""

import math
from dataclasses import dataclass
from typing import Callable, Tuple

import pytest
import torch

from espnet_multiblank import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    TDTLoss,
    multiblank_rnnt_loss,
    tdt_loss,
)
from espnet_multiblank.loss.options import make_options

backends = pytest.mark.parametrize("backend", ["torch", "numba"])
B, T, U = 2, 5, 4


@dataclass(frozen=True)
class Spec:
    """The valid baseline of one lattice, and what it calls."""

    lattice: str
    V: int  # softmax symbols (a TDT's tokens)
    blank: int
    durations: Tuple[int, ...]
    labels: Tuple[Tuple[int, ...], ...]
    fn: Callable
    module: Callable

    @property
    def width(self) -> int:
        return self.V + (len(self.durations) if self.lattice == "tdt" else 0)

    def options(self, **kw) -> dict:
        key = "durations" if self.lattice == "tdt" else "big_blank_durations"
        return {"blank": self.blank, key: self.durations, **kw}


SPECS = {
    # big blanks (durations [2, 4]) are 6 and 5; labels in [0, 5)
    "multiblank": Spec(
        "multiblank",
        8,
        7,
        (2, 4),
        ((1, 2, 3), (4, 0, 0)),
        multiblank_rnnt_loss,
        MultiblankRNNTLoss,
    ),
    "standard": Spec(
        "standard",
        8,
        7,
        (),
        ((1, 2, 3), (4, 0, 0)),
        multiblank_rnnt_loss,
        MultiblankRNNTLoss,
    ),
    # token logits 0..5, blank 2, then 3 duration logits
    "tdt": Spec("tdt", 6, 2, (0, 1, 2), ((1, 3, 5), (4, 0, 0)), tdt_loss, TDTLoss),
}
lattices = pytest.mark.parametrize("lattice", list(SPECS))


def inputs(spec):
    """Valid inputs: (acts, labels, act_lens, label_lens)."""
    acts = torch.randn(B, T, U, spec.width)
    labels = torch.tensor(spec.labels)
    return acts, labels, torch.tensor([5, 3]), torch.tensor([3, 1])


def call(spec, acts, labels, act_lens, label_lens, backend="torch", **kw):
    return spec.fn(
        acts, labels, act_lens, label_lens, backend=backend, **spec.options(**kw)
    )


def _replace(spec, i, value):
    args = list(inputs(spec))
    args[i] = value(args[i]) if callable(value) else value
    return args


@lattices
def test_valid_inputs_pass(lattice):
    """The baseline used by every other test is accepted."""
    spec = SPECS[lattice]
    assert math.isfinite(float(call(spec, *inputs(spec))))


# ----------------------------------------------------------------------- tensors
@lattices
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
def test_ranks_and_types(lattice, backend, index, value, exc, name):
    spec = SPECS[lattice]
    with pytest.raises(exc, match=name):
        call(spec, *_replace(spec, index, value), backend=backend)


@lattices
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
def test_dtypes(lattice, backend, index, dtype, name):
    spec = SPECS[lattice]
    with pytest.raises(TypeError, match=name):
        call(spec, *_replace(spec, index, lambda x: x.to(dtype)), backend=backend)


@lattices
@backends
@pytest.mark.parametrize(
    "index,name", [(1, "labels"), (2, "act_lens"), (3, "label_lens")]
)
@pytest.mark.parametrize(
    "change",
    [lambda x: torch.cat([x, x[:1]]), lambda x: x[:1]],
    ids=["longer", "shorter"],
)
def test_batch_mismatch(lattice, backend, index, name, change):
    spec = SPECS[lattice]
    with pytest.raises(ValueError, match=name):
        call(spec, *_replace(spec, index, change), backend=backend)


@lattices
@backends
@pytest.mark.parametrize(
    "index,name", [(1, "labels"), (2, "act_lens"), (3, "label_lens")]
)
def test_device_mismatch(lattice, backend, index, name):
    """A second device is not needed: 'meta' tensors are enough to exercise the check,
    which must fire before anything reads the values."""
    spec = SPECS[lattice]
    with pytest.raises(ValueError, match=name):
        call(spec, *_replace(spec, index, lambda x: x.to("meta")), backend=backend)


# ----------------------------------------------------------------------- lengths
@lattices
@backends
@pytest.mark.parametrize(
    "act_lens,label_lens,name",
    [
        ([-1, 3], [3, 1], "act_lens"),
        ([6, 3], [3, 1], "act_lens"),  # > T
        ([5, 3], [-1, 1], "label_lens"),
        ([5, 3], [3, -1], "label_lens"),
        ([5, 3], [4, 1], "label_lens"),  # > U - 1
    ],
)
def test_bad_lengths(lattice, backend, act_lens, label_lens, name):
    spec = SPECS[lattice]
    acts, labels, _, _ = inputs(spec)
    with pytest.raises(ValueError, match=name):
        call(
            spec,
            acts,
            labels,
            torch.tensor(act_lens),
            torch.tensor(label_lens),
            backend,
        )


@lattices
@backends
def test_label_lens_longer_than_labels(lattice, backend):
    """labels narrower than U - 1: label_lens may not exceed labels.shape[1]."""
    spec = SPECS[lattice]
    acts, labels, act_lens, _ = inputs(spec)
    with pytest.raises(ValueError, match="label_lens"):
        call(spec, acts, labels[:, :2], act_lens, torch.tensor([3, 1]), backend)
    # ... but a narrower labels tensor is fine when the lengths fit
    call(spec, acts, labels[:, :2], act_lens, torch.tensor([2, 1]), backend="torch")


# ----------------------------------------------------------------------- label values
#: per lattice, the ids a label must not take: out of [0, V) (a TDT's duration
#: logits' indices too), the blank, any big blank
BAD_LABELS = {
    "multiblank": [-1, 8, 100, 7, 6, 5],
    "standard": [-1, 8, 100, 7],
    "tdt": [2, 6, 8, -1],
}


@pytest.mark.parametrize(
    "lattice,bad",
    [(k, v) for k, vs in BAD_LABELS.items() for v in vs],
    ids=[f"{k}-label{v}" for k, vs in BAD_LABELS.items() for v in vs],
)
@backends
def test_bad_label_ids(lattice, bad, backend):
    """Out of range, or a blank, within the valid length: refused; the same id in the
    padding is ignored."""
    spec = SPECS[lattice]
    acts, labels, act_lens, label_lens = inputs(spec)
    labels = labels.clone()
    labels[0, 2] = bad
    with pytest.raises(ValueError, match="labels"):
        call(spec, acts, labels, act_lens, label_lens, backend)
    labels = inputs(spec)[1].clone()
    labels[1, 2] = bad
    assert math.isfinite(float(call(spec, acts, labels, act_lens, label_lens, backend)))


@lattices
@pytest.mark.parametrize("bad", [-1, 10**6, "V", "blank", "blank - 1"])
def test_padding_may_hold_anything(lattice, bad):
    """Positions >= label_lens[b] are padding and are not checked."""
    spec = SPECS[lattice]
    bad = {"V": spec.V, "blank": spec.blank, "blank - 1": spec.blank - 1}.get(bad, bad)
    acts, labels, act_lens, label_lens = inputs(spec)
    labels = labels.clone()
    labels[1, 1:] = bad
    ref = call(spec, acts, inputs(spec)[1], act_lens, label_lens)
    assert torch.equal(call(spec, acts, labels, act_lens, label_lens), ref)


@lattices
@backends
def test_callers_labels_are_not_modified(lattice, backend):
    """The checks zero the padding of their own copy of the labels."""
    spec = SPECS[lattice]
    acts, labels, act_lens, label_lens = inputs(spec)
    labels[1, 1:] = -3
    kept = labels.clone()
    call(spec, acts, labels, act_lens, label_lens, backend)
    assert torch.equal(labels, kept)


def test_labels_id_5_is_valid_without_a_third_big_blank():
    """Sanity check of the fixture: with 2 big blanks, id blank - 3 is an ordinary
    label."""
    spec = SPECS["multiblank"]
    acts, labels, act_lens, label_lens = inputs(spec)
    labels = labels.clone()
    labels[0, 2] = spec.blank - 3
    assert math.isfinite(float(call(spec, acts, labels, act_lens, label_lens)))


@backends
@pytest.mark.parametrize("width", [3, 2, 0])
def test_tdt_joint_output_too_narrow(backend, width):
    """acts.shape[3] must be V + D with the blank < V."""
    spec = SPECS["tdt"]
    acts, labels, act_lens, label_lens = inputs(spec)
    with pytest.raises(ValueError, match=r"acts\.shape\[3\]"):
        call(
            spec,
            acts[..., :width],
            labels.clamp(max=0),
            act_lens,
            label_lens,
            backend=backend,
        )


@backends
def test_tdt_blank_beyond_token_logits(backend):
    spec = SPECS["tdt"]
    acts, labels, act_lens, label_lens = inputs(spec)
    with pytest.raises(ValueError, match="blank"):
        call(spec, acts, labels, act_lens, label_lens, blank=spec.V, backend=backend)


# ----------------------------------------------------------------------- scalar options
#: per family, options refused at the call (ValueError / TypeError naming them)
BAD_OPTIONS = {
    "multiblank": [
        (dict(blank=8), ValueError, "blank"),  # = V
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
    "tdt": [
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
    ],
}
#: per family, options its module refuses at construction
BAD_MODULE_OPTIONS = {
    "multiblank": [
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
    "tdt": BAD_OPTIONS["tdt"] + [(dict(backend="cuda"), ValueError, "backend")],
}


def _options_params(table):
    return [
        pytest.param(family, kw, exc, name, id=f"{family}-{kw!r}")
        for family, rows in table.items()
        for kw, exc, name in rows
    ]


@pytest.mark.parametrize("family,kw,exc,name", _options_params(BAD_OPTIONS))
def test_bad_options(family, kw, exc, name):
    spec = SPECS[family]
    with pytest.raises(exc, match=name):
        call(spec, *inputs(spec), **kw)


@pytest.mark.parametrize("family,kw,exc,name", _options_params(BAD_MODULE_OPTIONS))
def test_module_constructor(family, kw, exc, name):
    """The modules validate their options at construction."""
    spec = SPECS[family]
    with pytest.raises(exc, match=name):
        spec.module(**spec.options(**kw))


@lattices
@pytest.mark.parametrize("backend", ["cuda-numba", "cuda", "", "Torch", None])
def test_unknown_backend(lattice, backend):
    spec = SPECS[lattice]
    with pytest.raises(ValueError, match="backend"):
        call(spec, *inputs(spec), backend=backend)


def test_options_cache_is_neither_stale_nor_lenient():
    """make_options caches validated options by the exact arguments: a mutated list
    gives new options, and 7.0 / True are refused after 7 / 1 were accepted."""
    blank = SPECS["multiblank"].blank
    durations = [2, 4]
    first = make_options(blank, durations)
    assert make_options(blank, [2, 4]) is first
    durations.append(6)
    assert make_options(blank, durations).big_blank_durations == (2, 4, 6)
    with pytest.raises(TypeError, match="blank"):
        make_options(float(blank), [2, 4])
    make_options(blank, [2, 4], "mean", 1)
    with pytest.raises(TypeError, match="big_blank_durations"):
        make_options(blank, [2, True])
    with pytest.raises(ValueError, match="reduction"):
        make_options(blank, [2, 4], "MEAN")


@pytest.mark.parametrize("family", ["multiblank", "tdt"])
def test_durations_accept_lists_numpy_and_tensors_in_any_order(family):
    np = pytest.importorskip("numpy")
    spec = SPECS[family]
    acts, labels, act_lens, label_lens = inputs(spec)
    durations = list(spec.durations)
    key = "durations" if family == "tdt" else "big_blank_durations"
    a = call(spec, acts, labels, act_lens, label_lens, **{key: durations})
    for other in (np.array(durations), torch.tensor(durations)):
        b = call(spec, acts, labels, act_lens, label_lens, **{key: other})
        assert torch.equal(a, b)
    reordered = spec.module(**spec.options(**{key: torch.tensor(durations[::-1])}))
    assert tuple(getattr(reordered, key)) == tuple(durations[::-1])


def test_module_negative_clamp():
    """clamp < 0 is an error for MultiblankRNNTLoss but means "off" for the ESPnet-style
    MultiblankRNNTLossNumba."""
    spec = SPECS["multiblank"]
    with pytest.raises(ValueError, match="clamp"):
        MultiblankRNNTLoss(spec.blank, spec.durations, clamp=-1.0)
    assert MultiblankRNNTLossNumba(spec.blank, spec.durations, clamp=-1).opts.clamp == 0


@lattices
def test_module_checks_tensors(lattice):
    spec = SPECS[lattice]
    loss = spec.module(**spec.options(backend="torch"))
    acts, labels, act_lens, label_lens = inputs(spec)
    with pytest.raises(ValueError, match="label_lens"):
        loss(acts, labels, act_lens, torch.tensor([9, 1]))


# -------------------------------------------------------------------- non-finite logits
def _non_finite_params():
    out = []
    for lattice, spec in SPECS.items():
        parts = {"token": 3}  # a label's logit
        if lattice == "tdt":
            parts = {"token": 1, "duration": spec.V + 1}
        omegas = (0.0, 1.0) if lattice == "tdt" else (0.0,)
        for part, k in parts.items():
            for omega in omegas:
                out.append(
                    pytest.param(
                        lattice, k, omega, id=f"{lattice}-{part}-omega{omega:g}"
                    )
                )
    return out


@pytest.mark.parametrize("backend", ["torch", "numba", "auto"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("lattice,k,omega", _non_finite_params())
def test_non_finite_logits(backend, value, lattice, k, omega):
    """NaN / +inf in a valid row (a TDT's token or duration part) raise ValueError
    naming acts, with or without gradient (a TDT also on omega's RNN-T branch)."""
    spec = SPECS[lattice]
    extra = dict(omega=omega) if lattice == "tdt" else {}
    acts, labels, act_lens, label_lens = inputs(spec)
    acts[1, 2, 1, k] = value
    with pytest.raises(ValueError, match="acts"):
        call(spec, acts, labels, act_lens, label_lens, backend=backend, **extra)
    with pytest.raises(ValueError, match="acts"):
        call(
            spec,
            acts.requires_grad_(True),
            labels,
            act_lens,
            label_lens,
            backend=backend,
            **extra,
        )


@backends
def test_tdt_all_masked_duration_row_raises(backend):
    """A row whose duration logits are all -inf has no duration distribution."""
    spec = SPECS["tdt"]
    acts, labels, act_lens, label_lens = inputs(spec)
    acts[0, 1, 1, spec.V :] = -math.inf
    with pytest.raises(ValueError, match="acts"):
        call(spec, acts, labels, act_lens, label_lens, backend=backend)
