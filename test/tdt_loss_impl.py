"""Device-agnostic test bodies of the TDT loss (``test_tdt_loss_cpu.py`` runs them on
the CPU; a CUDA file can run the same bodies on "cuda").

Oracles:
* the brute-force enumeration of every TDT path in ``tdt_oracles.py`` (tiny shapes,
  float64), itself checked against a NumPy forward recursion and NeMo's published
  fixed case;
* the float64 PyTorch backend (``backend="torch"``), checked against the brute force on
  the tiny cases, for medium shapes;
* ``torch.autograd.gradcheck``; the standard RNN-T loss (omega = 1);
* invariances: a constant added to the token part or to the duration part of a row,
  durations permuted together with their logits.
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Tuple

import torch
from oracles import reduction_weights_oracle as reduction_weights
from tdt_oracles import (
    enumerate_tdt_paths,
    tdt_brute_force_costs,
    tdt_forward_log_prob,
)

from espnet_multiblank import TDTLoss, rnnt_loss, tdt_loss

BACKENDS = ("torch", "numba")
REDUCTIONS = (
    "none",
    "sum",
    "mean",
    "mean_batch",
    "mean_volume",
    "mean_label_normalized",
)


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Case:
    """One TDT batch; ``act_lens`` / ``label_lens`` give B; V counts the token logits
    (blank included), the joint output has V + len(durations) units."""

    name: str
    T: int
    U: int
    V: int
    blank: int
    act_lens: Tuple[int, ...]
    label_lens: Tuple[int, ...]
    durations: Tuple[int, ...] = (0, 1, 2)
    sigma: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = 0.0
    seed: int = 0
    scale: float = 1.0

    @property
    def B(self) -> int:
        return len(self.act_lens)

    @property
    def D(self) -> int:
        return len(self.durations)

    @property
    def label_ids(self) -> Tuple[int, ...]:
        return tuple(k for k in range(self.V) if k != self.blank)

    def kwargs(self, **over) -> dict:
        kw = dict(
            blank=self.blank,
            durations=self.durations,
            sigma=self.sigma,
            fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp,
        )
        kw.update(over)
        return kw


def make_inputs(case: Case, device, dtype=torch.float32, index_dtype=torch.int64):
    """(acts, labels, act_lens, label_lens); acts (B, T, U, V + D) drawn in float64
    from ``case.seed`` then cast; label padding holds garbage (-1, the blank, a duration
    logit's index, a huge id) that the loss must ignore."""
    gen = torch.Generator().manual_seed(case.seed)
    acts = torch.randn(
        case.B, case.T, case.U, case.V + case.D, generator=gen, dtype=torch.float64
    )
    acts = acts * case.scale
    ids = torch.tensor(case.label_ids)
    labels = ids[torch.randint(len(ids), (case.B, case.U - 1), generator=gen)]
    garbage = [-1, case.blank, case.V, 10**6]
    for b, L in enumerate(case.label_lens):
        for j in range(L, case.U - 1):
            labels[b, j] = garbage[j % 4]
    return (
        acts.to(device=device, dtype=dtype),
        labels.to(device=device, dtype=index_dtype),
        torch.tensor(case.act_lens, dtype=index_dtype, device=device),
        torch.tensor(case.label_lens, dtype=index_dtype, device=device),
    )


def oracle(case: Case, acts, labels, act_lens, label_lens):
    """Brute-force per-utterance (costs, grads), float64 on the CPU."""
    return tdt_brute_force_costs(
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
    return oracle(case, *make_inputs(case, "cpu", dtype))


def loss_and_grad(acts, labels, act_lens, label_lens, grad_out=None, **kw):
    """tdt_loss on a fresh leaf copy of ``acts``; (loss, d loss / d acts)."""
    x = acts.detach().clone().requires_grad_(True)
    loss = tdt_loss(x, labels, act_lens, label_lens, **kw)
    if grad_out is None:
        grad_out = torch.ones_like(loss)
    (g,) = torch.autograd.grad(loss, x, grad_outputs=grad_out.to(loss))
    return loss.detach(), g


def reference64(case: Case, acts, labels, act_lens, label_lens, reduction="none", **o):
    return loss_and_grad(
        acts.double(),
        labels,
        act_lens,
        label_lens,
        **case.kwargs(reduction=reduction, backend="torch", **o),
    )


def assert_grads_close(actual, expected, rtol, atol_rel, msg=""):
    """Element-wise closeness, absolute tolerance relative to max |expected|."""
    expected = expected.to(torch.float64).cpu()
    actual = actual.to(torch.float64).cpu()
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    atol = atol_rel * max(scale, 1e-3)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=msg or None)


# --------------------------------------------------------------------------- cases
TINY_CASES = [
    Case("d012_blank_last", 5, 3, 4, 3, (5, 3), (2, 1), (0, 1, 2), seed=1),
    Case("d021_unsorted", 5, 3, 5, 0, (5, 4), (2, 1), (0, 2, 1), 0.05, seed=2),
    Case("d23_no_one", 7, 3, 4, 2, (7, 5, 1), (2, 1, 0), (2, 3), seed=3),
    Case("d31_reversed", 6, 3, 4, 1, (6, 4), (2, 2), (3, 1), 0.05, seed=4),
    Case("d1_only", 5, 3, 4, 2, (5, 3), (2, 1), (1,), seed=5),
    Case("d01234", 6, 3, 5, 4, (6, 4, 2), (2, 1, 2), (0, 1, 2, 3, 4), 0.05, seed=6),
    Case("d02_even_only", 6, 3, 4, 0, (6, 5, 4), (2, 1, 1), (0, 2), seed=7),
    Case("d102_fastemit", 5, 3, 4, 1, (5, 4), (2, 2), (1, 0, 2), 0.05, 0.3, seed=8),
    Case("d012_clamp", 5, 3, 4, 3, (5, 4), (2, 1), (0, 1, 2), clamp=0.05, seed=9),
    Case(
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
    Case("labels_gt_frames", 3, 4, 4, 3, (2, 1, 3), (3, 3, 3), (0, 1, 2), seed=11),
    # impossible (T_b = 0 < L_b) and empty (T_b = 0 = L_b) utterances
    Case("zero_length", 4, 3, 4, 0, (0, 0, 4), (0, 2, 1), (0, 1), seed=12),
]
TINY_IDS = [c.name for c in TINY_CASES]

MEDIUM_CASES = [
    Case("d01234", 24, 8, 20, 19, (24, 17, 11), (7, 4, 5), (0, 1, 2, 3, 4), seed=21),
    Case(
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
    Case("d23_blank0", 24, 8, 20, 0, (24, 21, 13), (7, 7, 2), (2, 3), 0.05, seed=23),
]
MEDIUM_IDS = [c.name for c in MEDIUM_CASES]

GRADCHECK_CASES = [
    Case("d012", 4, 3, 4, 3, (4, 3), (2, 1), (0, 1, 2), seed=31),
    Case("d21_sigma", 5, 3, 4, 0, (5, 4), (2, 1), (2, 1), sigma=0.05, seed=32),
]

#: a small case used by the API and layout checks
SMALL = Case(
    "small", 8, 4, 7, 2, (8, 6, 5), (3, 2, 1), (0, 1, 2, 3), 0.05, 0.1, seed=41
)


# --------------------------------------------------------------------- oracle self-test
def check_oracle_self_consistency():
    """The brute force: NeMo's published fixed case, path counts, and agreement with
    an independent forward recursion."""
    # NeMo's test_rnnt_pytorch fixed case: 3 labels + blank (index 3), durations
    # [0, 1, 2], sigma 0.05, all-zero logits, labels [[0]]: cost 4.155739
    acts = torch.zeros(1, 3, 2, 4 + 3, dtype=torch.float64)
    costs, _ = tdt_brute_force_costs(
        acts, torch.tensor([[0]]), [3], [1], 3, [0, 1, 2], 0.05
    )
    assert abs(float(costs[0]) - 4.155739) < 1e-6, float(costs[0])
    # only duration 1: every step (label or blank) takes one frame and the last step
    # is a blank, so the labels pick L of the first T_b - 1 frames: C(T_b - 1, L)
    for T_b, L in [(1, 0), (4, 2), (6, 3), (3, 3)]:
        n = len(enumerate_tdt_paths(T_b, list(range(1, L + 1)), 0, (1,)))
        assert n == math.comb(T_b - 1, L), (T_b, L, n)
    # durations {0, 1}: labels on any frame, any number per frame, as in RNN-T, but
    # each label also chooses whether to advance: sum over k labels that advance of
    # C(L, k) * C(T_b - 1 - k + L, L)... checked on one value by hand: T_b = 2, L = 1
    # gives (0,0)-y0->(0,1)-b->(1,1)-b->end, (0,0)-y1->(1,1)-b->end,
    # (0,0)-b->(1,0)-y0->(1,1)-b->end
    assert len(enumerate_tdt_paths(2, [5], 0, (0, 1))) == 3
    # blanks only, durations {1, 2}: compositions of T_b into 1s and 2s (Fibonacci)
    assert len(enumerate_tdt_paths(6, [], 0, (2, 1))) == 13
    # no duration fits: durations {2} and T_b odd
    assert enumerate_tdt_paths(5, [], 0, (2,)) == []
    assert enumerate_tdt_paths(0, [], 0, (1,)) == [()]
    assert enumerate_tdt_paths(0, [1], 0, (1,)) == []
    for case in TINY_CASES:
        acts, labels, act_lens, label_lens = make_inputs(case, "cpu", torch.float64)
        costs, _ = oracle(case, acts, labels, act_lens, label_lens)
        for b in range(case.B):
            lp = tdt_forward_log_prob(
                acts[b],
                labels[b].tolist(),
                case.act_lens[b],
                case.label_lens[b],
                case.blank,
                case.durations,
                case.sigma,
            )
            want = -(1 + case.fastemit_lambda) * lp
            assert want == float(costs[b]) or abs(want - float(costs[b])) < 1e-10, (
                case.name,
                b,
                want,
                float(costs[b]),
            )


# -------------------------------------------------------------------------- brute force
def check_brute_force(device, backend, case: Case, reduction: str, dtype=torch.float64):
    """API loss and gradient (with the reduction's weights) vs the enumeration."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, dtype)
    costs, grads = cached_oracle(case, dtype)
    w = reduction_weights(reduction, label_lens)
    grad_out = None
    if reduction == "none":  # a non-uniform incoming gradient exercises backward
        grad_out = torch.linspace(0.5, 2.0, case.B, dtype=torch.float64)
        w = w * grad_out
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        grad_out=None if grad_out is None else grad_out.to(device),
        **case.kwargs(reduction=reduction, backend=backend),
    )
    exp_loss = costs if reduction == "none" else (costs * w).sum()
    if reduction != "none" and bool(torch.isinf(costs).any()):
        exp_loss = torch.tensor(math.inf, dtype=torch.float64)
    exp_grad = grads * w.view(-1, 1, 1, 1)
    exp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert loss.dtype == exp_dtype, loss.dtype
    assert g.dtype == dtype and g.shape == acts.shape, (g.dtype, g.shape)
    tol, atol_rel = (1e-9, 1e-10) if dtype == torch.float64 else (1e-5, 1e-5)
    torch.testing.assert_close(
        loss.cpu().double(), exp_loss, rtol=tol, atol=tol, msg="loss != brute force"
    )
    assert torch.isfinite(g).all()
    assert_grads_close(g, exp_grad, tol, atol_rel, msg="gradient != brute force")


def check_nemo_fixed_case(device, backend):
    """NeMo's published TDT test: cost 4.155739 (sum reduction, B = 1)."""
    acts = torch.zeros(1, 3, 2, 4 + 3, device=device)
    labels = torch.tensor([[0]], device=device)
    loss = tdt_loss(
        acts,
        labels,
        torch.tensor([3], device=device),
        torch.tensor([1], device=device),
        blank=3,
        durations=[0, 1, 2],
        reduction="sum",
        sigma=0.05,
        backend=backend,
    )
    assert abs(float(loss) - 4.155739) < 1e-5, float(loss)


# ----------------------------------------------------------------- medium: vs reference
def check_vs_reference(device, backend, case: Case, dtype, reduction="mean_volume"):
    """``backend`` in ``dtype`` vs the float64 PyTorch backend on a medium batch."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    ref_loss, ref_grad = reference64(
        case, acts, labels, act_lens, label_lens, reduction
    )
    loss, g = loss_and_grad(
        acts.to(dtype),
        labels,
        act_lens,
        label_lens,
        **case.kwargs(reduction=reduction, backend=backend),
    )
    tol, atol_rel = (1e-9, 1e-10) if dtype == torch.float64 else (1e-5, 1e-5)
    torch.testing.assert_close(loss.double().cpu(), ref_loss.cpu(), rtol=tol, atol=0.0)
    assert_grads_close(g, ref_grad, 10 * tol, atol_rel)


def check_long_utterance(device):
    """T = 400, U = 101: float32 and float64 kernels finite and equal to the NumPy
    forward recursion of the oracles; the float32 gradient equal to the float64 one."""
    c = Case("long", 400, 101, 8, 7, (400,), (100,), (0, 1, 2, 3, 4), 0.05, seed=51)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="sum", backend="numba")
    loss32, g32 = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    loss64, g64 = loss_and_grad(acts.double(), labels, act_lens, label_lens, **kw)
    assert torch.isfinite(loss32) and torch.isfinite(g32).all()
    expected = -tdt_forward_log_prob(
        acts[0].cpu(), labels[0].tolist(), 400, 100, c.blank, c.durations, c.sigma
    )
    assert abs(float(loss64) - expected) <= 1e-10 * expected, (float(loss64), expected)
    assert abs(float(loss32) - expected) <= 1e-5 * expected, (float(loss32), expected)
    assert_grads_close(g32, g64, 1e-3, 1e-4)


# --------------------------------------------------------------------------- gradcheck
def check_gradcheck(device, backend, case: Case, reduction: str):
    """torch.autograd.gradcheck in float64 (no FastEmit/clamp: those are not
    gradients)."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    acts.requires_grad_(True)

    def f(x):
        return tdt_loss(
            x,
            labels,
            act_lens,
            label_lens,
            **case.kwargs(reduction=reduction, backend=backend),
        )

    assert torch.autograd.gradcheck(f, (acts,), eps=1e-6, atol=1e-6, rtol=1e-4)


# -------------------------------------------------------------------------- invariances
def check_part_shift_invariance(device, backend, dtype):
    """A constant added to the token part, or to the duration part, of each row
    changes neither loss nor gradient (each part has its own softmax); raising one
    logit alone does change the loss (so the test can fail)."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    gen = torch.Generator().manual_seed(7)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for part in (slice(0, c.V), slice(c.V, c.V + c.D)):
        shift = torch.rand(acts.shape[:3], generator=gen, dtype=torch.float64) - 0.5
        shifted = acts.clone()
        shifted[..., part] += 40 * shift[..., None].to(device=device, dtype=dtype)
        loss_s, g_s = loss_and_grad(shifted, labels, act_lens, label_lens, **kw)
        torch.testing.assert_close(loss_s, loss, rtol=tol, atol=tol)
        torch.testing.assert_close(g_s, g, rtol=tol, atol=tol)
    # both parts shifted by different constants is still invariant; moving logit mass
    # from the token part to the duration part is not (the parts are separate)
    moved = acts.clone()
    moved[..., 0] += 1.0
    loss_m, _ = loss_and_grad(moved, labels, act_lens, label_lens, **kw)
    assert not torch.allclose(loss_m, loss)


def check_duration_permutation(device, backend):
    """Durations permuted together with their duration logits: same loss, and the
    gradient permuted the same way."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device, torch.float64)
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    perm = [2, 0, 3, 1]
    durs = tuple(c.durations[p] for p in perm)
    idx = list(range(c.V)) + [c.V + p for p in perm]
    loss_p, g_p = loss_and_grad(
        acts[..., idx], labels, act_lens, label_lens, **dict(kw, durations=durs)
    )
    torch.testing.assert_close(loss_p, loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g_p, g[..., idx], rtol=1e-10, atol=1e-10)
    # permuting the durations alone changes the loss (the test can fail)
    loss_x, _ = loss_and_grad(
        acts, labels, act_lens, label_lens, **dict(kw, durations=durs)
    )
    assert not torch.allclose(loss_x, loss)


# --------------------------------------------------------------------------- omega
def check_omega_one_is_rnnt(device, backend):
    """omega = 1: exactly the standard RNN-T loss on the token logits (no sigma,
    FastEmit and clamp kept), and an exactly zero gradient on the duration logits."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    for clamp in (0.0, 0.02):
        kw = c.kwargs(reduction="mean", backend=backend, omega=1.0, clamp=clamp)
        loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
        x = acts[..., : c.V].clone().requires_grad_(True)
        ref = rnnt_loss(
            x,
            labels,
            act_lens,
            label_lens,
            blank=c.blank,
            reduction="mean",
            fastemit_lambda=c.fastemit_lambda,
            clamp=clamp,
            backend=backend,
        )
        ref.backward()
        torch.testing.assert_close(loss, ref.detach())
        torch.testing.assert_close(g[..., : c.V], x.grad)
        assert torch.count_nonzero(g[..., c.V :]) == 0
    # and the TDT loss differs from it (the check above can fail)
    tdt, _ = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="mean", backend=backend),
    )
    assert not torch.allclose(tdt, loss)


def check_omega_draw(device, backend):
    """0 < omega < 1: each call is either the TDT or the RNN-T loss, chosen by one draw
    of torch's default generator (torch.manual_seed reproduces it); both occur."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    tdt, _ = loss_and_grad(
        acts, labels, act_lens, label_lens, **c.kwargs(reduction="sum", backend=backend)
    )
    rnnt, _ = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="sum", backend=backend, omega=1.0),
    )
    seen = []
    for seed in range(12):
        torch.manual_seed(seed)
        expect_rnnt = float(torch.rand(())) < 0.5
        torch.manual_seed(seed)
        loss, g = loss_and_grad(
            acts,
            labels,
            act_lens,
            label_lens,
            **c.kwargs(reduction="sum", backend=backend, omega=0.5),
        )
        got_rnnt = bool(torch.equal(loss, rnnt))
        assert got_rnnt or torch.equal(loss, tdt)
        assert got_rnnt == expect_rnnt, seed
        assert (torch.count_nonzero(g[..., c.V :]) == 0) == got_rnnt
        seen.append(got_rnnt)
    assert any(seen) and not all(seen)
    # omega = 0 never draws: the generator state is left alone
    torch.manual_seed(3)
    before = torch.get_rng_state()
    loss_and_grad(
        acts, labels, act_lens, label_lens, **c.kwargs(reduction="sum", backend=backend)
    )
    assert torch.equal(torch.get_rng_state(), before)


# ------------------------------------------------------------------- edge cases
def check_impossible(device, backend, reduction):
    """No complete path: T_b = 0 < L_b, durations without one that fits (e.g. only
    {2} with an odd T_b, or {2, 3} with T_b = 1): +inf cost, exactly zero gradient;
    T_b = 0 = L_b costs 0; the other utterances are unaffected."""
    c = Case("imp", 5, 3, 4, 1, (0, 0, 5, 3, 4), (0, 2, 2, 1, 1), (0, 2), seed=61)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction=reduction, backend=backend),
    )
    costs, grads = oracle(c, acts, labels, act_lens, label_lens)
    assert float(costs[0]) == 0.0
    assert [math.isinf(float(x)) for x in costs] == [False, True, True, True, False]
    if reduction == "none":
        assert float(loss[0]) == 0.0
        assert loss[1:4].tolist() == [math.inf] * 3
        torch.testing.assert_close(
            loss[4:].double().cpu(), costs[4:], rtol=1e-5, atol=1e-5
        )
    else:
        assert float(loss) == math.inf
    assert torch.isfinite(g).all()
    assert torch.count_nonzero(g[:4]) == 0
    w = reduction_weights(reduction, label_lens).view(-1, 1, 1, 1)
    assert_grads_close(g[4:], (grads * w)[4:], 1e-5, 1e-5)
    # durations (2, 3) and T_b = 1: nothing fits
    c2 = Case("imp2", 5, 2, 4, 0, (1, 5), (0, 1), (2, 3), seed=62)
    acts, labels, act_lens, label_lens = make_inputs(c2, device)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c2.kwargs(reduction="none", backend=backend),
    )
    assert float(loss[0]) == math.inf and torch.count_nonzero(g[0]) == 0
    assert math.isfinite(float(loss[1])) and torch.count_nonzero(g[1]) > 0


def check_all_T_zero(device, backend):
    """T = 0 (every T_b = 0): 0 without labels, +inf with; gradient empty."""
    acts = torch.randn(2, 0, 3, 6, device=device, requires_grad=True)
    labels = torch.tensor([[1, 2], [1, 2]], device=device)
    loss = tdt_loss(
        acts,
        labels,
        torch.tensor([0, 0], device=device),
        torch.tensor([0, 2], device=device),
        blank=0,
        durations=[0, 1, 2],
        reduction="none",
        backend=backend,
    )
    assert loss.tolist() == [0.0, math.inf]
    loss[:1].sum().backward()
    assert acts.grad is None or acts.grad.shape == acts.shape


def check_empty_batch(device, backend):
    acts = torch.randn(0, 4, 3, 7, device=device, requires_grad=True)
    labels = torch.zeros(0, 2, dtype=torch.long, device=device)
    lens = torch.zeros(0, dtype=torch.long, device=device)
    none = tdt_loss(
        acts, labels, lens, lens, 0, [0, 1, 2], reduction="none", backend=backend
    )
    assert none.shape == (0,)
    total = tdt_loss(
        acts, labels, lens, lens, 0, [0, 1, 2], reduction="sum", backend=backend
    )
    assert float(total.detach()) == 0.0
    total.backward()


def check_masked_token(device, backend):
    """A -inf token logit on a symbol never emitted is allowed: the loss equals the
    loss without that symbol, and its gradient column is (about) 0."""
    c = Case("mask", 6, 3, 5, 0, (6, 4), (2, 2), (0, 1, 2), seed=71)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    labels = torch.where(labels == 4, torch.ones_like(labels), labels)
    masked = acts.clone()
    masked[..., 4] = -math.inf
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(masked, labels, act_lens, label_lens, **kw)
    keep = [0, 1, 2, 3, 5, 6, 7]
    ref, ref_g = loss_and_grad(
        acts[..., keep].double(),
        labels,
        act_lens,
        label_lens,
        **dict(kw, backend="torch"),
    )
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    assert float(g[..., 4].abs().max()) <= 1e-30
    assert_grads_close(g[..., keep], ref_g, 1e-5, 1e-5)


def check_large_logits(device, backend, dtype, scale):
    """Logits of magnitude ~scale: finite, equal to the float64 reference."""
    c = Case("big", 9, 4, 5, 4, (9, 7), (3, 2), (0, 1, 2, 3), scale=scale, seed=81)
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="none", backend=backend),
    )
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    ref_loss, ref_grad = reference64(c, acts, labels, act_lens, label_lens, "none")
    assert float(ref_loss.min()) > scale
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=0.0)
    atol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(g.double(), ref_grad, rtol=0.0, atol=atol)


def check_vocabulary_size(device, backend, dtype, width: int, scale: float):
    """Joint outputs ``width`` = V + D wide (the CPU kernel computes the exps of
    narrow rows frame by frame, of wide ones row by row), logits of magnitude
    ``scale`` (1e4: most parts far below the frame's maximum, redone with their own),
    sigma, FastEmit and clamp: equal to the float64 reference."""
    D = 4
    c = Case(
        f"w{width}",
        9,
        4,
        width - D,
        2,
        (9, 6),
        (3, 2),
        (0, 1, 2, 3),
        0.05,
        0.1,
        0.5,
        102,
        scale,
    )
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    ref_loss, ref_grad = reference64(c, acts, labels, act_lens, label_lens, "none")
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(loss.double(), ref_loss, rtol=tol, atol=tol)
    assert_grads_close(g, ref_grad, tol, tol)


# --------------------------------------------------------------------- dtypes / layouts
def check_half_precision(device, backend, dtype):
    """float16 / bfloat16: computed in float32, loss float32, gradient in ``dtype``."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    for reduction in ("sum", "mean_volume"):
        loss, g = loss_and_grad(
            acts,
            labels,
            act_lens,
            label_lens,
            **c.kwargs(reduction=reduction, backend=backend),
        )
        assert loss.dtype == torch.float32 and g.dtype == dtype, (loss.dtype, g.dtype)
        ref_loss, ref_grad = reference64(
            c, acts, labels, act_lens, label_lens, reduction
        )
        torch.testing.assert_close(
            loss.double().cpu(), ref_loss.cpu(), rtol=1e-5, atol=1e-5
        )
        assert_grads_close(g, ref_grad, torch.finfo(dtype).eps, 1e-5)


def check_index_dtypes(device, backend):
    """int32 and int64 labels / lengths (also mixed) give identical results."""
    results = []
    for lab_dt, len_dt in [
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
        (torch.int32, torch.int64),
    ]:
        acts, labels, act_lens, label_lens = make_inputs(SMALL, device)
        results.append(
            loss_and_grad(
                acts,
                labels.to(lab_dt),
                act_lens.to(len_dt),
                label_lens.to(len_dt),
                **SMALL.kwargs(reduction="mean", backend=backend),
            )
        )
    for loss, g in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(g, results[0][1])


def check_non_contiguous(device, backend):
    """A transposed view and a slice of a wider tensor give the same loss and gradient
    as the contiguous tensor."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="sum", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    base = acts.transpose(1, 2).contiguous().requires_grad_(True)
    view = base.transpose(1, 2)
    assert not view.is_contiguous()
    loss_t = tdt_loss(view, labels, act_lens, label_lens, **kw)
    loss_t.backward()
    torch.testing.assert_close(loss_t.detach(), loss)
    torch.testing.assert_close(base.grad.transpose(1, 2), g)
    VD = c.V + c.D
    wide = torch.cat([acts, torch.randn_like(acts[..., :3])], dim=-1)
    wide.requires_grad_(True)
    sliced = wide[..., :VD]
    assert not sliced.is_contiguous()
    loss_s = tdt_loss(sliced, labels, act_lens, label_lens, **kw)
    loss_s.backward()
    torch.testing.assert_close(loss_s.detach(), loss)
    torch.testing.assert_close(wide.grad[..., :VD], g)
    assert torch.count_nonzero(wide.grad[..., VD:]) == 0


def check_padding(device, backend):
    """T > max T_b and U > max L_b + 1: padding (NaN included) gets exactly zero
    gradient, garbage padded labels are ignored, costs equal the cropped batch's."""
    c = Case("pad", 10, 7, 6, 5, (6, 4, 5), (3, 2, 1), (0, 1, 2, 3), 0.05, 0.2, seed=91)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    assert (labels == -1).any() and (labels == c.blank).any() and (labels == c.V).any()
    for b in range(c.B):  # NaN in the padding must be ignored
        acts[b, c.act_lens[b] :] = math.nan
        acts[b, :, c.label_lens[b] + 1 :] = math.nan
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    for b in range(c.B):
        T_b, U_b = c.act_lens[b], c.label_lens[b] + 1
        assert torch.count_nonzero(g[b, T_b:]) == 0
        assert torch.count_nonzero(g[b, :, U_b:]) == 0
        assert torch.count_nonzero(g[b, :T_b, :U_b]) > 0
    crop_T, crop_U = max(c.act_lens), max(c.label_lens) + 1
    loss_c, g_c = loss_and_grad(
        acts[:, :crop_T, :crop_U], labels[:, : crop_U - 1], act_lens, label_lens, **kw
    )
    torch.testing.assert_close(loss, loss_c, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g[:, :crop_T, :crop_U], g_c, rtol=1e-6, atol=1e-7)


def check_retain_graph(device, backend, reduction):
    """backward twice gives the same gradient; a second incoming gradient scales it
    without modifying the first result."""
    acts, labels, act_lens, label_lens = make_inputs(SMALL, device)
    x = acts.clone().requires_grad_(True)
    loss = tdt_loss(
        x,
        labels,
        act_lens,
        label_lens,
        **SMALL.kwargs(reduction=reduction, backend=backend),
    )
    ones = torch.ones_like(loss)
    (g1,) = torch.autograd.grad(loss, x, grad_outputs=ones, retain_graph=True)
    g1_copy = g1.clone()
    (g2,) = torch.autograd.grad(loss, x, grad_outputs=ones, retain_graph=True)
    assert torch.equal(g1, g2)
    (g3,) = torch.autograd.grad(loss, x, grad_outputs=3 * ones, retain_graph=True)
    torch.testing.assert_close(g3, 3 * g1_copy)
    assert torch.equal(g1, g1_copy)


def check_forward_only(device, backend):
    """No autograd (plain tensors, or no_grad): the same loss."""
    acts, labels, act_lens, label_lens = make_inputs(SMALL, device)
    kw = SMALL.kwargs(reduction="none", backend=backend)
    loss, _ = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    plain = tdt_loss(acts, labels, act_lens, label_lens, **kw)
    assert not plain.requires_grad
    torch.testing.assert_close(plain, loss, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        nog = tdt_loss(
            acts.clone().requires_grad_(True), labels, act_lens, label_lens, **kw
        )
    torch.testing.assert_close(nog, loss, rtol=1e-6, atol=1e-6)


def check_module(device, backend):
    """TDTLoss == tdt_loss; its repr names the options."""
    c = SMALL
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    loss_f, g_f = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="mean", backend=backend),
    )
    mod = TDTLoss(
        c.blank,
        list(c.durations),
        reduction="mean",
        sigma=c.sigma,
        fastemit_lambda=c.fastemit_lambda,
        backend=backend,
    )
    assert isinstance(mod, torch.nn.Module)
    assert mod.blank == c.blank and mod.durations == c.durations
    assert "durations=[0, 1, 2, 3]" in repr(mod)
    x = acts.clone().requires_grad_(True)
    loss_m = mod(x, labels, act_lens, label_lens)
    loss_m.backward()
    assert torch.equal(loss_m.detach(), loss_f) and torch.equal(x.grad, g_f)


def check_incoming_gradient(device, backend):
    """Any incoming gradient (0.7, negative, per utterance) multiplies the clamped
    per-utterance gradient: d loss / d acts_b = g_out[b] * w_b * clip(d cost_b)."""
    case = TINY_CASES[9]  # sigma, FastEmit and clamp
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    costs, grads = cached_oracle(case, torch.float64)
    for reduction, g_out in [
        ("none", torch.tensor([-1.5, 0.7], dtype=torch.float64)),
        ("mean", torch.tensor(0.7, dtype=torch.float64)),
        ("sum", torch.tensor(-2.0, dtype=torch.float64)),
    ]:
        loss, g = loss_and_grad(
            acts,
            labels,
            act_lens,
            label_lens,
            grad_out=g_out.to(device),
            **case.kwargs(reduction=reduction, backend=backend),
        )
        w = reduction_weights(reduction, label_lens) * g_out
        assert_grads_close(g, grads * w.view(-1, 1, 1, 1), 1e-9, 1e-10)
