"""Inputs of the loss tests, for every lattice: cases, inputs, the oracles' glue.

A :class:`Case` is one batch configuration of one lattice (``"standard"``,
``"multiblank"`` or ``"tdt"``); everything that differs between the lattices (which
loss function and keyword arguments, which ids are blanks, how wide a row of logits
is, which brute force is the oracle) is a property of the case, so that the check
bodies of ``loss_checks.py`` are written once.

The oracles (``oracles.py``, ``tdt_oracles.py``) are independent of the package:
brute-force enumeration of every path on tiny shapes, float64 NumPy recursions for
long ones, closed forms. The float64 PyTorch backend (``backend="torch"``), checked
against the brute force on the tiny cases, is the oracle for medium shapes.
"""

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Tuple

import torch
from oracles import brute_force_costs
from tdt_oracles import tdt_brute_force_costs

from espnet_multiblank import multiblank_rnnt_loss, tdt_loss
from espnet_multiblank.loss.reductions import REDUCTIONS as PACKAGE_REDUCTIONS

LATTICES = ("standard", "multiblank", "tdt")
BACKENDS = ("torch", "numba")
#: every reduction of the package (the oracle's weights, oracles.py, are written out
#: by hand for each and refuse an unknown one)
REDUCTIONS = PACKAGE_REDUCTIONS

# label padding must be ignored: ids the loss would reject there (a TDT's list adds
# the first duration logit's index)
_GARBAGE = {"multiblank": (-1, "blank", 10**6), "tdt": (-1, "blank", "V", 10**6)}


@dataclass(frozen=True)
class Case:
    """One batch of one lattice; ``act_lens`` / ``label_lens`` give B.

    ``V`` counts the softmax's symbols (TDT: the token logits; a row of logits has
    ``width = V + len(durations)`` units); ``durations`` are the big blanks'
    (``"standard"``: none) or the TDT's.
    """

    lattice: str
    name: str
    T: int
    U: int
    V: int
    blank: int
    act_lens: Tuple[int, ...]
    label_lens: Tuple[int, ...]
    durations: Tuple[int, ...] = ()
    sigma: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = 0.0
    seed: int = 0
    scale: float = 1.0

    def __post_init__(self):
        assert self.lattice in LATTICES, self.lattice
        assert (self.lattice == "standard") == (
            not self.durations and self.lattice != "tdt"
        ), (self.lattice, self.durations)

    @property
    def id(self) -> str:
        return f"{self.lattice}-{self.name}"

    @property
    def tdt(self) -> bool:
        return self.lattice == "tdt"

    @property
    def B(self) -> int:
        return len(self.act_lens)

    @property
    def D(self) -> int:
        """Duration logits per row (0 but for a TDT)."""
        return len(self.durations) if self.tdt else 0

    @property
    def width(self) -> int:
        return self.V + self.D

    @property
    def blank_ids(self) -> Tuple[int, ...]:
        if self.tdt:
            return (self.blank,)
        return (self.blank,) + tuple(
            self.blank - 1 - i for i in range(len(self.durations))
        )

    @property
    def label_ids(self) -> Tuple[int, ...]:
        return tuple(k for k in range(self.V) if k not in self.blank_ids)

    @property
    def softmax_parts(self) -> Tuple[slice, ...]:
        """The parts of a row with a softmax of their own."""
        if self.tdt:
            return (slice(0, self.V), slice(self.V, self.width))
        return (slice(0, self.V),)

    @property
    def loss_fn(self):
        return tdt_loss if self.tdt else multiblank_rnnt_loss

    def kwargs(self, **over) -> dict:
        """Keyword arguments of the case's loss function."""
        kw = dict(
            blank=self.blank,
            fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp,
            sigma=self.sigma,
        )
        if self.tdt:
            kw["durations"] = self.durations
        else:
            kw["big_blank_durations"] = self.durations
        kw.update(over)
        return kw

    def but(self, **changes) -> "Case":
        return replace(self, **changes)


def make_inputs(
    case: Case,
    device,
    dtype=torch.float32,
    padding: str = "garbage",
    index_dtype=torch.int64,
):
    """(acts, labels, act_lens, label_lens) for ``case`` on ``device``.

    The logits (B, T, U, width) are drawn in float64 on the CPU from ``case.seed``
    (then cast), so that the same case gives the same values on every device and
    dtype. Label padding (positions >= label_lens[b]) holds garbage that the loss
    must ignore, or zeros (``padding="zero"``, for other libraries).
    """
    gen = torch.Generator().manual_seed(case.seed)
    acts = torch.randn(
        case.B, case.T, case.U, case.width, generator=gen, dtype=torch.float64
    )
    acts = acts * case.scale
    ids = torch.tensor(case.label_ids)
    labels = ids[torch.randint(len(ids), (case.B, case.U - 1), generator=gen)]
    named = {"blank": case.blank, "V": case.V}
    garbage = [named.get(g, g) for g in _GARBAGE["tdt" if case.tdt else "multiblank"]]
    for b, L in enumerate(case.label_lens):
        for j in range(L, case.U - 1):
            labels[b, j] = garbage[j % len(garbage)] if padding == "garbage" else 0
    return (
        acts.to(device=device, dtype=dtype),
        labels.to(device=device, dtype=index_dtype),
        torch.tensor(case.act_lens, dtype=index_dtype, device=device),
        torch.tensor(case.label_lens, dtype=index_dtype, device=device),
    )


def oracle(case: Case, acts, labels, act_lens, label_lens):
    """Brute-force per-utterance (costs, grads) for ``case`` (float64, CPU)."""
    brute = tdt_brute_force_costs if case.tdt else brute_force_costs
    return brute(
        acts.cpu(),
        labels.cpu(),
        act_lens.cpu(),
        label_lens.cpu(),
        case.blank,
        case.durations,
        case.sigma,
        case.fastemit_lambda,
        case.clamp,
    )


@lru_cache(maxsize=None)
def cached_oracle(case: Case, dtype: torch.dtype):
    """:func:`oracle` of ``make_inputs(case, "cpu", dtype)``, computed once per case."""
    return oracle(case, *make_inputs(case, "cpu", dtype))


def loss_and_grad(fn, acts, labels, act_lens, label_lens, grad_out=None, **kw):
    """``fn(copy, labels, ..., **kw)`` on a fresh leaf copy of ``acts``; return
    (loss, d loss / d acts). For a non-scalar loss the gradient is that of
    ``(loss * grad_out).sum()`` (``grad_out`` defaults to ones)."""
    x = acts.detach().clone().requires_grad_(True)
    loss = fn(x, labels, act_lens, label_lens, **kw)
    if grad_out is None:
        grad_out = torch.ones_like(loss)
    (g,) = torch.autograd.grad(loss, x, grad_outputs=grad_out.to(loss))
    return loss.detach(), g


def case_loss_and_grad(case: Case, acts, labels, act_lens, label_lens, **kw):
    """:func:`loss_and_grad` with the case's loss function and options (``kw``
    overrides them; ``grad_out`` is passed on)."""
    grad_out = kw.pop("grad_out", None)
    return loss_and_grad(
        case.loss_fn,
        acts,
        labels,
        act_lens,
        label_lens,
        grad_out=grad_out,
        **case.kwargs(**kw),
    )


def reference64(case: Case, acts, labels, act_lens, label_lens, reduction="none", **o):
    """Float64 PyTorch-backend loss and gradient (the oracle for medium shapes)."""
    return case_loss_and_grad(
        case,
        acts.double(),
        labels,
        act_lens,
        label_lens,
        reduction=reduction,
        backend="torch",
        **o,
    )


def assert_grads_close(actual, expected, rtol, atol_rel, msg=""):
    """Element-wise closeness with an absolute tolerance relative to max |expected|."""
    expected = expected.to(torch.float64).cpu()
    actual = actual.to(torch.float64).cpu()
    atol = atol_rel * max(
        float(expected.abs().max()) if expected.numel() else 0.0, 1e-3
    )
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=msg or None)


def ids(cases):
    return [c.id for c in cases]


# --------------------------------------------------------------------------- cases
def _mb(name, *args, **kw):
    """A multi-blank case, or a standard one when it has no big blanks."""
    durations = args[6] if len(args) > 6 else kw.get("durations", ())
    return Case("multiblank" if durations else "standard", name, *args, **kw)


def _tdt(name, *args, **kw):
    if len(args) <= 6 and "durations" not in kw:
        kw["durations"] = (0, 1, 2)
    return Case("tdt", name, *args, **kw)


TINY_CASES = [
    _mb("std_blank0", 5, 4, 5, 0, (5, 3), (3, 2), seed=1),
    _mb("std_blank_last", 6, 3, 5, 4, (6, 4, 1), (2, 2, 0), seed=2),
    _mb("std_sigma", 5, 4, 6, 2, (5, 4), (3, 1), sigma=0.05, seed=3),
    _mb("mb248_blank_last", 9, 3, 8, 7, (9, 7, 4), (2, 1, 2), (2, 4, 8), seed=4),
    _mb("mb248_espnet_layout", 8, 4, 7, 3, (8, 6), (3, 2), (2, 4, 8), seed=5),
    _mb("mb23_blank_middle", 7, 4, 7, 4, (7, 5, 2), (3, 2, 1), (2, 3), seed=6),
    _mb("mb3_single", 7, 4, 4, 1, (7, 5, 2), (3, 0, 1), (3,), seed=7),
    _mb("mb24_sigma", 7, 4, 6, 5, (7, 6), (3, 2), (4, 2), sigma=0.05, seed=8),
    _mb("std_fastemit", 6, 4, 5, 0, (6, 4), (3, 2), fastemit_lambda=0.5, seed=9),
    _mb(
        "mb248_fastemit_sigma",
        8,
        4,
        7,
        6,
        (8, 5),
        (3, 2),
        (2, 4, 8),
        0.05,
        0.3,
        seed=10,
    ),
    _mb("std_clamp", 6, 4, 5, 4, (6, 5), (3, 3), clamp=0.05, seed=11),
    _mb("mb24_clamp_fastemit", 7, 4, 6, 2, (7, 6), (3, 1), (2, 4), 0.05, 0.2, 0.1, 12),
    # more labels than frames, T_b = 1, a duration longer than every T_b
    _mb("std_labels_gt_frames", 3, 4, 5, 0, (2, 1, 3), (3, 3, 3), seed=13),
    _mb(
        "mb_short",
        4,
        4,
        6,
        5,
        (1, 4, 2),
        (3, 3, 0),
        (2, 3),
        fastemit_lambda=0.1,
        seed=14,
    ),
    _tdt("d012_blank_last", 5, 3, 4, 3, (5, 3), (2, 1), (0, 1, 2), seed=1),
    _tdt("d021_unsorted", 5, 3, 5, 0, (5, 4), (2, 1), (0, 2, 1), 0.05, seed=2),
    _tdt("d23_no_one", 7, 3, 4, 2, (7, 5, 1), (2, 1, 0), (2, 3), seed=3),
    _tdt("d31_reversed", 6, 3, 4, 1, (6, 4), (2, 2), (3, 1), 0.05, seed=4),
    _tdt("d1_only", 5, 3, 4, 2, (5, 3), (2, 1), (1,), seed=5),
    _tdt("d01234", 6, 3, 5, 4, (6, 4, 2), (2, 1, 2), (0, 1, 2, 3, 4), 0.05, seed=6),
    _tdt("d02_even_only", 6, 3, 4, 0, (6, 5, 4), (2, 1, 1), (0, 2), seed=7),
    _tdt("d102_fastemit", 5, 3, 4, 1, (5, 4), (2, 2), (1, 0, 2), 0.05, 0.3, seed=8),
    _tdt("d012_clamp", 5, 3, 4, 3, (5, 4), (2, 1), (0, 1, 2), clamp=0.05, seed=9),
    _tdt(
        "d201_all_options",
        5,
        3,
        5,
        2,
        (5, 3),
        (2, 2),
        (2, 0, 1),
        0.05,
        0.2,
        0.08,
        seed=10,
    ),
    # more labels than frames; T_b = 1 with labels
    _tdt("labels_gt_frames", 3, 4, 4, 3, (2, 1, 3), (3, 3, 3), (0, 1, 2), seed=11),
    # impossible (T_b = 0 < L_b) and empty (T_b = 0 = L_b) utterances
    _tdt("zero_length", 4, 3, 4, 0, (0, 0, 4), (0, 2, 1), (0, 1), seed=12),
]

MEDIUM_CASES = [
    _mb("std", 30, 10, 20, 0, (30, 22, 17), (9, 5, 7), seed=21),
    _mb(
        "mb248_blank_last", 30, 10, 20, 19, (30, 22, 17), (9, 5, 7), (2, 4, 8), seed=22
    ),
    _mb(
        "mb248_all_options",
        30,
        10,
        20,
        3,
        (30, 22, 17),
        (9, 5, 7),
        (2, 4, 8),
        sigma=0.05,
        fastemit_lambda=0.1,
        clamp=0.05,
        seed=23,
    ),
    _tdt("d01234", 24, 8, 20, 19, (24, 17, 11), (7, 4, 5), (0, 1, 2, 3, 4), seed=21),
    _tdt(
        "d4021_all_options",
        24,
        8,
        20,
        3,
        (24, 17, 11),
        (7, 4, 5),
        (4, 0, 2, 1),
        sigma=0.05,
        fastemit_lambda=0.1,
        clamp=0.05,
        seed=22,
    ),
    _tdt("d23_blank0", 24, 8, 20, 0, (24, 21, 13), (7, 7, 2), (2, 3), 0.05, seed=23),
]

#: the medium case with every option, per family (the reductions test runs on it)
ALL_OPTIONS_MEDIUM = {"multiblank": MEDIUM_CASES[1], "tdt": MEDIUM_CASES[4]}

GRADCHECK_CASES = [
    _mb("std", 3, 3, 4, 0, (3, 2), (2, 1), seed=31),
    _mb("mb23_sigma", 4, 3, 5, 4, (4, 3), (2, 1), (2, 3), sigma=0.05, seed=32),
    _tdt("d012", 4, 3, 4, 3, (4, 3), (2, 1), (0, 1, 2), seed=31),
    _tdt("d21_sigma", 5, 3, 4, 0, (5, 4), (2, 1), (2, 1), sigma=0.05, seed=32),
]

#: per lattice, a small case with sigma and FastEmit for the API and layout checks
SMALL = {
    "standard": _mb(
        "small",
        9,
        5,
        10,
        9,
        (9, 7, 5),
        (4, 2, 3),
        sigma=0.05,
        fastemit_lambda=0.1,
        seed=51,
    ),
    "multiblank": _mb(
        "mb",
        9,
        5,
        10,
        9,
        (9, 7, 5),
        (4, 2, 3),
        (2, 4, 8),
        sigma=0.05,
        fastemit_lambda=0.1,
        seed=51,
    ),
    "tdt": _tdt(
        "small", 8, 4, 7, 2, (8, 6, 5), (3, 2, 1), (0, 1, 2, 3), 0.05, 0.1, seed=41
    ),
}

#: per lattice, a tiny case with a gradient clamp and B = 2 (multi-blank and TDT:
#: sigma and FastEmit too), for the incoming-gradient check against the oracle
INCOMING_GRADIENT_CASES = {
    "standard": TINY_CASES[10],  # std_clamp
    "multiblank": TINY_CASES[11],  # mb24_clamp_fastemit
    "tdt": TINY_CASES[23],  # d201_all_options
}
