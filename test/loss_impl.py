"""Device-agnostic test bodies for the multi-blank RNN-T loss (torchaudio style).

Every ``check_*`` function takes ``device`` (and usually ``backend``) and raises an
AssertionError when the loss misbehaves; ``test_loss_cpu.py`` runs them on the CPU, a
CUDA file can run the same bodies on "cuda". The oracles are:

* the brute-force path enumeration of ``oracles.py`` (tiny shapes, float64);
* the float64 PyTorch backend (``backend="torch"``), itself validated against the brute
  force on the tiny cases (so that it may serve as the oracle for medium shapes);
* ``torch.autograd.gradcheck``;
* ESPnet's own CPU ``RNNTLossNumba`` for the standard loss;
* closed forms (all-equal logits) and invariances (per-row constant shifts).
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, Tuple

import numba
import torch
from oracles import (
    brute_force_costs,
    diagonal_log_prob,
    enumerate_paths,
    reduce_oracle,
    reduction_weights_oracle,
    standard_equal_logits_cost,
)

from espnet_multiblank import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    multiblank_rnnt_loss,
    rnnt_loss,
)

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
    """One batch configuration; ``act_lens`` / ``label_lens`` give B."""

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

    @property
    def B(self) -> int:
        return len(self.act_lens)

    @property
    def blank_ids(self) -> Tuple[int, ...]:
        return (self.blank,) + tuple(
            self.blank - 1 - i for i in range(len(self.durations))
        )

    @property
    def label_ids(self) -> Tuple[int, ...]:
        return tuple(k for k in range(self.V) if k not in self.blank_ids)

    def kwargs(self, **over) -> dict:
        """Keyword arguments of ``multiblank_rnnt_loss`` for this case."""
        kw = dict(
            blank=self.blank,
            big_blank_durations=self.durations,
            fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp,
            sigma=self.sigma,
        )
        kw.update(over)
        return kw


def make_inputs(
    case: Case,
    device,
    dtype=torch.float32,
    padding: str = "garbage",
    index_dtype=torch.int64,
):
    """(acts, labels, act_lens, label_lens) for ``case`` on ``device``.

    The logits are drawn in float64 on the CPU from ``case.seed`` (then cast), so that
    the same case gives the same values on every device and dtype. Label padding
    (positions >= label_lens[b]) holds "garbage" (-1, the blank id, a huge id), which
    the loss must ignore, or zeros (``padding="zero"``, for other libraries).
    """
    gen = torch.Generator().manual_seed(case.seed)
    acts = torch.randn(
        case.B, case.T, case.U, case.V, generator=gen, dtype=torch.float64
    )
    acts = acts * case.scale
    ids = torch.tensor(case.label_ids)
    labels = ids[torch.randint(len(ids), (case.B, case.U - 1), generator=gen)]
    garbage = torch.tensor([-1, case.blank, 10**6])
    for b, L in enumerate(case.label_lens):
        for j in range(L, case.U - 1):
            labels[b, j] = garbage[j % 3] if padding == "garbage" else 0
    return (
        acts.to(device=device, dtype=dtype),
        labels.to(device=device, dtype=index_dtype),
        torch.tensor(case.act_lens, dtype=index_dtype, device=device),
        torch.tensor(case.label_lens, dtype=index_dtype, device=device),
    )


def oracle(case: Case, acts, labels, act_lens, label_lens):
    """Brute-force per-utterance (costs, grads) for ``case`` (float64, CPU)."""
    return brute_force_costs(
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


def loss_and_grad(acts, labels, act_lens, label_lens, grad_out=None, **kw):
    """Call the API on a fresh leaf copy of ``acts``; return (loss, d loss / d acts).

    For ``reduction="none"`` the gradient is that of ``(loss * grad_out).sum()``.
    """
    x = acts.detach().clone().requires_grad_(True)
    loss = multiblank_rnnt_loss(x, labels, act_lens, label_lens, **kw)
    if loss.dim() == 0:
        (g,) = torch.autograd.grad(loss, x)
    else:
        if grad_out is None:
            grad_out = torch.ones_like(loss)
        (g,) = torch.autograd.grad(loss, x, grad_outputs=grad_out.to(loss))
    return loss.detach(), g


def reference64(
    case: Case, acts, labels, act_lens, label_lens, reduction="none", **over
):
    """Float64 PyTorch-backend loss and gradient (the oracle for medium shapes)."""
    return loss_and_grad(
        acts.double(),
        labels,
        act_lens,
        label_lens,
        **case.kwargs(reduction=reduction, backend="torch", **over),
    )


def assert_grads_close(actual, expected, rtol, atol_rel, msg=""):
    """Element-wise closeness with an absolute tolerance relative to max |expected|."""
    expected = expected.to(torch.float64).cpu()
    actual = actual.to(torch.float64).cpu()
    atol = atol_rel * max(
        float(expected.abs().max()) if expected.numel() else 0.0, 1e-3
    )
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=msg or None)


# --------------------------------------------------------------------------- cases
TINY_CASES = [
    Case("std_blank0", 5, 4, 5, 0, (5, 3), (3, 2), seed=1),
    Case("std_blank_last", 6, 3, 5, 4, (6, 4, 1), (2, 2, 0), seed=2),
    Case("std_sigma", 5, 4, 6, 2, (5, 4), (3, 1), sigma=0.05, seed=3),
    Case("mb248_blank_last", 9, 3, 8, 7, (9, 7, 4), (2, 1, 2), (2, 4, 8), seed=4),
    Case("mb248_espnet_layout", 8, 4, 7, 3, (8, 6), (3, 2), (2, 4, 8), seed=5),
    Case("mb23_blank_middle", 7, 4, 7, 4, (7, 5, 2), (3, 2, 1), (2, 3), seed=6),
    Case("mb3_single", 7, 4, 4, 1, (7, 5, 2), (3, 0, 1), (3,), seed=7),
    Case("mb24_sigma", 7, 4, 6, 5, (7, 6), (3, 2), (4, 2), sigma=0.05, seed=8),
    Case("std_fastemit", 6, 4, 5, 0, (6, 4), (3, 2), fastemit_lambda=0.5, seed=9),
    Case(
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
    Case("std_clamp", 6, 4, 5, 4, (6, 5), (3, 3), clamp=0.05, seed=11),
    Case("mb24_clamp_fastemit", 7, 4, 6, 2, (7, 6), (3, 1), (2, 4), 0.05, 0.2, 0.1, 12),
    # more labels than frames, T_b = 1, a duration longer than every T_b
    Case("std_labels_gt_frames", 3, 4, 5, 0, (2, 1, 3), (3, 3, 3), seed=13),
    Case(
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
]
TINY_IDS = [c.name for c in TINY_CASES]

MEDIUM_CASES = [
    Case("std", 30, 10, 20, 0, (30, 22, 17), (9, 5, 7), seed=21),
    Case(
        "mb248_blank_last", 30, 10, 20, 19, (30, 22, 17), (9, 5, 7), (2, 4, 8), seed=22
    ),
    Case(
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
]
MEDIUM_IDS = [c.name for c in MEDIUM_CASES]


# --------------------------------------------------------------------- oracle self-test
def check_oracle_self_consistency():
    """The brute force itself: path counts and the all-equal-logits closed form."""
    for T_b, L in [(1, 0), (4, 2), (7, 3)]:
        n = len(enumerate_paths(T_b, list(range(1, L + 1)), 0, ()))
        assert n == math.comb(T_b - 1 + L, L), (T_b, L, n)
    # with big blanks the count of time moves is the number of compositions of T_b into
    # parts {1, 2, 4}: c(n) = c(n-1) + c(n-2) + c(n-4)
    comp = [1, 1, 2, 3]
    for n in range(4, 8):
        comp.append(comp[n - 1] + comp[n - 2] + comp[n - 4])
    assert len(enumerate_paths(7, [], 3, (2, 4))) == comp[7]
    assert enumerate_paths(0, [], 0, ()) == [()]
    assert enumerate_paths(0, [1], 0, ()) == []
    acts = torch.zeros(1, 5, 3, 4, dtype=torch.float64)
    costs, _ = brute_force_costs(acts, torch.tensor([[1, 2]]), [5], [2], 0)
    assert abs(float(costs[0]) - standard_equal_logits_cost(5, 2, 4)) < 1e-12
    # the NumPy forward recursion agrees with the enumeration (variable lengths,
    # blank not last, sigma)
    for case in TINY_CASES:
        acts, labels, act_lens, label_lens = make_inputs(case, "cpu", torch.float64)
        costs, _ = brute_force_costs(
            acts, labels, act_lens, label_lens, case.blank, case.durations, case.sigma
        )
        for b in range(case.B):
            lp = diagonal_log_prob(
                acts[b],
                labels[b].tolist(),
                case.act_lens[b],
                case.label_lens[b],
                case.blank,
                case.durations,
                case.sigma,
            )
            assert abs(-lp - float(costs[b])) < 1e-10, (case.name, b, -lp, costs[b])


# -------------------------------------------------------------------------- brute force
def check_brute_force(device, backend, case: Case, reduction: str, dtype=torch.float64):
    """API loss and gradient (and the gradient weighting of the reduction) against the
    brute-force enumeration of every path."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, dtype)
    costs, grads = cached_oracle(case, dtype)
    grad_out = None
    if reduction == "none":  # a non-uniform incoming gradient exercises backward
        grad_out = torch.linspace(0.5, 2.0, case.B, dtype=torch.float64)
    exp_loss, exp_grad = reduce_oracle(costs, grads, label_lens, reduction, grad_out)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        grad_out=None if grad_out is None else grad_out.to(device),
        **case.kwargs(reduction=reduction, backend=backend),
    )
    exp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert loss.dtype == exp_dtype, loss.dtype
    assert g.dtype == dtype and g.shape == acts.shape, (g.dtype, g.shape)
    assert tuple(loss.shape) == ((case.B,) if reduction == "none" else ()), loss.shape
    if dtype == torch.float64:
        rtol, atol_rel = 1e-9, 1e-10
    else:
        rtol, atol_rel = 1e-5, 1e-5
    torch.testing.assert_close(
        loss.cpu().double(), exp_loss, rtol=rtol, atol=rtol, msg="loss != brute force"
    )
    assert_grads_close(g, exp_grad, rtol, atol_rel, msg="gradient != brute force")


def check_no_label_dimension(device, backend):
    """U = 1 (labels of shape (B, 0)): only blanks; vs the brute force."""
    c = Case("nolab", 7, 1, 5, 4, (7, 3, 1), (0, 0, 0), (2, 3), sigma=0.05, seed=15)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    assert labels.shape == (3, 0)
    costs, grads = oracle(c, acts, labels, act_lens, label_lens)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="none", backend=backend),
    )
    torch.testing.assert_close(loss.double().cpu(), costs, rtol=1e-5, atol=1e-5)
    assert_grads_close(g, grads, 1e-5, 1e-5)


def check_wide_labels(device, backend):
    """labels wider than U - 1 (extra columns of garbage) give the same result."""
    c = MB_CASE
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    extra = torch.full((c.B, 3), -5, dtype=labels.dtype, device=labels.device)
    loss_w, g_w = loss_and_grad(
        acts, torch.cat([labels, extra], dim=1), act_lens, label_lens, **kw
    )
    assert torch.equal(loss_w, loss) and torch.equal(g_w, g)


_CONCURRENT_SCRIPT = r"""
import sys, threading
sys.path.insert(0, sys.argv[1])
import torch, loss_impl as impl
import espnet_multiblank.loss.cpu.driver as cpu_compute
cpu_compute.PARALLEL_MIN_ELEMENTS = 0  # exercise the parallel kernels on a small case
c = impl.MEDIUM_CASES[1]
acts, labels, al, ll = impl.make_inputs(c, "cpu")
kw = c.kwargs(reduction="sum", backend="numba")
ref = impl.loss_and_grad(acts, labels, al, ll, **kw)
errors = []
def work():
    try:
        for _ in range(5):
            l, g = impl.loss_and_grad(acts, labels, al, ll, **kw)
            if not (torch.equal(l, ref[0]) and torch.equal(g, ref[1])):
                errors.append("different result")
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
print("ERRORS", errors)
sys.exit(1 if errors else 0)
"""


def check_concurrent_calls_cpu():
    """Calls from several Python threads at once give the right results and do not abort
    the process (Numba's workqueue threading layer aborts on concurrent parallel
    launches; hence a subprocess)."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _CONCURRENT_SCRIPT, here],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])


_FORK_SCRIPT = r"""
import multiprocessing as mp, sys
sys.path.insert(0, sys.argv[1])
import torch, loss_impl as impl
import espnet_multiblank.loss.cpu.driver as cpu_compute
cpu_compute.PARALLEL_MIN_ELEMENTS = 0  # exercise the parallel kernels on a small case
torch.set_num_threads(2)
c = impl.MEDIUM_CASES[1]
acts, labels, al, ll = impl.make_inputs(c, "cpu")
kw = c.kwargs(reduction="sum", backend="numba")
ref = impl.loss_and_grad(acts, labels, al, ll, **kw)  # the parent uses the kernel first

def child(q):
    l, g = impl.loss_and_grad(acts, labels, al, ll, **kw)
    same = torch.equal(l, ref[0]) and torch.allclose(g, ref[1], rtol=1e-6, atol=1e-7)
    q.put(bool(same))

ctx = mp.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,))
p.start()
p.join(120)
if p.is_alive():
    p.kill()
    print("HANG in the forked child")
    sys.exit(2)
ok = q.get(timeout=5) if p.exitcode == 0 else False
print("child exit", p.exitcode, "same result", ok)
sys.exit(0 if ok else 1)
"""


def check_forked_child_cpu():
    """A forked child (DataLoader workers, multiprocessing) may call the loss after the
    parent did: GNU OpenMP is not fork-safe, so a naive parallel kernel hangs there."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, here],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])


def check_equal_logits(device, backend):
    """All-equal logits: standard loss has a closed form; multi-blank vs brute force."""
    case = Case("eq", 7, 4, 6, 0, (7, 4, 1), (3, 3, 0))
    acts = torch.full((3, 7, 4, 6), 3.25, device=device)
    _, labels, act_lens, label_lens = make_inputs(case, device)
    loss, g = loss_and_grad(
        acts, labels, act_lens, label_lens, blank=0, reduction="none", backend=backend
    )
    expected = [
        standard_equal_logits_cost(t, l, 6) for t, l in [(7, 3), (4, 3), (1, 0)]
    ]
    torch.testing.assert_close(
        loss.cpu().double(),
        torch.tensor(expected, dtype=torch.float64),
        rtol=1e-5,
        atol=1e-5,
    )
    assert torch.isfinite(g).all()
    mb = Case("eq_mb", 7, 4, 6, 5, (7, 4, 2), (3, 3, 1), (2, 4))
    _, labels, act_lens, label_lens = make_inputs(mb, device)
    costs, grads = oracle(mb, acts, labels, act_lens, label_lens)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **mb.kwargs(reduction="none", backend=backend),
    )
    torch.testing.assert_close(loss.cpu().double(), costs, rtol=1e-5, atol=1e-5)
    assert_grads_close(g, grads, 1e-5, 1e-5)


# ----------------------------------------------------------------- medium: vs reference
def check_vs_reference(device, backend, case: Case, dtype, reduction="mean_volume"):
    """``backend`` in ``dtype`` vs the float64 PyTorch backend on a medium random batch
    with variable lengths (the reference is validated against the brute force)."""
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
    if dtype == torch.float64:
        rtol, atol_rel = 1e-9, 1e-10
    else:
        rtol, atol_rel = 1e-5, 1e-5
    torch.testing.assert_close(loss.double(), ref_loss, rtol=rtol, atol=0.0)
    assert_grads_close(g, ref_grad, 10 * rtol, atol_rel)


# --------------------------------------------------------------------------- gradcheck
GRADCHECK_CASES = [
    Case("std", 3, 3, 4, 0, (3, 2), (2, 1), seed=31),
    Case("mb23_sigma", 4, 3, 5, 4, (4, 3), (2, 1), (2, 3), sigma=0.05, seed=32),
]


def check_gradcheck(device, backend, case: Case, reduction: str):
    """torch.autograd.gradcheck in float64 (no FastEmit/clamp: those are not
    gradients)."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    acts.requires_grad_(True)

    def f(x):
        return multiblank_rnnt_loss(
            x,
            labels,
            act_lens,
            label_lens,
            **case.kwargs(reduction=reduction, backend=backend),
        )

    assert torch.autograd.gradcheck(f, (acts,), eps=1e-6, atol=1e-6, rtol=1e-4)


# ------------------------------------------------------------------------ ESPnet oracle
def check_vs_espnet(device, backend, blank: int, reduction: str):
    """Standard loss vs ESPnet's CPU ``RNNTLossNumba`` (raw logits, int32 indices)."""
    import espnet_multiblank.espnet.quiet  # noqa: F401  (silence nltk first)

    # isort: split
    from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import RNNTLossNumba

    case = Case("esp", 6, 4, 5, blank, (6, 4), (3, 2), seed=41)
    acts, labels, act_lens, label_lens = make_inputs(
        case, "cpu", torch.float32, padding="zero", index_dtype=torch.int32
    )
    x = acts.clone().requires_grad_(True)
    esp = RNNTLossNumba(blank=blank, reduction=reduction)(
        x, labels, act_lens, label_lens
    )
    grad_out = torch.ones_like(esp) if reduction == "none" else None
    (esp_grad,) = torch.autograd.grad(esp, x, grad_outputs=grad_out)
    esp = esp.detach().reshape(-1) if reduction == "none" else esp.detach().reshape(())
    loss, g = loss_and_grad(
        acts.to(device),
        labels.to(device),
        act_lens.to(device),
        label_lens.to(device),
        blank=blank,
        reduction=reduction,
        backend=backend,
    )
    torch.testing.assert_close(loss.cpu(), esp, rtol=1e-5, atol=1e-5)
    assert_grads_close(g, esp_grad, 1e-4, 1e-5)


# --------------------------------------------------------------------- dtypes / layouts
MB_CASE = Case(
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
)


def check_half_precision(device, backend, dtype):
    """float16 / bfloat16 logits: computed in float32 (a few utterances at a time), loss
    float32, grad in ``dtype``; per-utterance reduction weights survive the chunking."""
    acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device, dtype)
    for reduction in ("sum", "mean_volume"):
        loss, g = loss_and_grad(
            acts,
            labels,
            act_lens,
            label_lens,
            **MB_CASE.kwargs(reduction=reduction, backend=backend),
        )
        assert loss.dtype == torch.float32, loss.dtype
        assert g.dtype == dtype, g.dtype
        ref_loss, ref_grad = reference64(
            MB_CASE, acts, labels, act_lens, label_lens, reduction
        )
        torch.testing.assert_close(
            loss.double().cpu(), ref_loss.cpu(), rtol=1e-5, atol=1e-5
        )
        eps = torch.finfo(dtype).eps
        assert_grads_close(g, ref_grad, eps, 1e-5)


def check_index_dtypes(device, backend):
    """int32 and int64 labels / lengths (also mixed) give identical results."""
    results = []
    for lab_dt, len_dt in [
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
        (torch.int32, torch.int64),
    ]:
        acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device)
        results.append(
            loss_and_grad(
                acts,
                labels.to(lab_dt),
                act_lens.to(len_dt),
                label_lens.to(len_dt),
                **MB_CASE.kwargs(reduction="mean", backend=backend),
            )
        )
    for loss, g in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(g, results[0][1])


def check_non_contiguous(device, backend):
    """A transposed view and a slice along V give the same loss and gradient as the
    contiguous tensor (and the gradient flows back to the base tensor)."""
    c = MB_CASE
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="sum", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)

    base = acts.transpose(1, 2).contiguous().requires_grad_(True)  # (B, U, T, V)
    view = base.transpose(1, 2)
    assert not view.is_contiguous()
    loss_t = multiblank_rnnt_loss(view, labels, act_lens, label_lens, **kw)
    loss_t.backward()
    torch.testing.assert_close(loss_t.detach(), loss)
    torch.testing.assert_close(base.grad.transpose(1, 2), g)

    wide = torch.cat([acts, torch.randn_like(acts[..., :3])], dim=-1).requires_grad_(
        True
    )
    sliced = wide[..., : c.V]
    assert not sliced.is_contiguous()
    loss_s = multiblank_rnnt_loss(sliced, labels, act_lens, label_lens, **kw)
    loss_s.backward()
    torch.testing.assert_close(loss_s.detach(), loss)
    torch.testing.assert_close(wide.grad[..., : c.V], g)
    assert torch.count_nonzero(wide.grad[..., c.V :]) == 0


def check_padding(device, backend):
    """T > max act_lens and U > max label_lens + 1: padding (NaN included) gets exactly
    zero gradient, garbage in the padded labels is ignored, and the costs equal those
    of the cropped batch."""
    c = Case(
        "pad",
        10,
        7,
        8,
        7,
        (6, 4, 5),
        (3, 2, 1),
        (2, 4),
        sigma=0.05,
        fastemit_lambda=0.2,
        seed=61,
    )
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    assert (labels == -1).any() and (labels == c.blank).any()
    for b in range(c.B):  # NaN in the padding must be ignored
        acts[b, c.act_lens[b] :] = math.nan
        acts[b, :, c.label_lens[b] + 1 :] = math.nan
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    for b in range(c.B):
        T_b, U_b = c.act_lens[b], c.label_lens[b] + 1
        assert torch.count_nonzero(g[b, T_b:]) == 0, f"utterance {b}: t >= T_b"
        assert torch.count_nonzero(g[b, :, U_b:]) == 0, f"utterance {b}: u >= U_b"
        assert torch.count_nonzero(g[b, :T_b, :U_b]) > 0
    crop_T, crop_U = max(c.act_lens), max(c.label_lens) + 1
    loss_c, g_c = loss_and_grad(
        acts[:, :crop_T, :crop_U],
        labels[:, : crop_U - 1],
        act_lens,
        label_lens,
        **kw,
    )
    torch.testing.assert_close(loss, loss_c, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g[:, :crop_T, :crop_U], g_c, rtol=1e-6, atol=1e-7)


def check_retain_graph(device, backend, reduction):
    """backward twice (retain_graph) gives identical gradients; the second call with a
    different incoming gradient scales it and does not modify the first result."""
    acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device)
    x = acts.clone().requires_grad_(True)
    loss = multiblank_rnnt_loss(
        x,
        labels,
        act_lens,
        label_lens,
        **MB_CASE.kwargs(reduction=reduction, backend=backend),
    )
    ones = torch.ones_like(loss)
    (g1,) = torch.autograd.grad(loss, x, grad_outputs=ones, retain_graph=True)
    g1_copy = g1.clone()
    (g2,) = torch.autograd.grad(loss, x, grad_outputs=ones, retain_graph=True)
    assert torch.equal(g1, g2)
    (g3,) = torch.autograd.grad(loss, x, grad_outputs=3 * ones, retain_graph=True)
    torch.testing.assert_close(g3, 3 * g1_copy)
    assert torch.equal(g1, g1_copy), "the first gradient was modified in place"
    (g4,) = torch.autograd.grad(loss, x, grad_outputs=ones)
    assert torch.equal(g4, g1_copy)
    x.grad = None
    loss2 = multiblank_rnnt_loss(
        x,
        labels,
        act_lens,
        label_lens,
        **MB_CASE.kwargs(reduction="sum", backend=backend),
    )
    loss2.backward(retain_graph=True)
    first = x.grad.clone()
    loss2.backward(retain_graph=True)
    torch.testing.assert_close(x.grad, 2 * first)
    x.grad.zero_()  # in place, as optimizer.zero_grad(set_to_none=False) does
    loss2.backward()
    assert torch.equal(x.grad, first), "x.grad shares storage with the saved gradient"


def check_threads_unchanged(device, backend):
    """torch's and numba's thread counts are the same after a call as before, including
    after the caller changed them."""
    import espnet_multiblank.loss.cpu.driver as cpu_compute

    acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device)
    kw = MB_CASE.kwargs(reduction="mean", backend=backend)
    before = (torch.get_num_threads(), numba.get_num_threads())
    threshold = cpu_compute.PARALLEL_MIN_ELEMENTS
    try:
        cpu_compute.PARALLEL_MIN_ELEMENTS = 0  # take the parallel path on a small case
        torch.set_num_threads(2)
        numba.set_num_threads(1)  # differs from what the kernel will use
        loss_and_grad(acts, labels, act_lens, label_lens, **kw)
        assert (torch.get_num_threads(), numba.get_num_threads()) == (2, 1)
    finally:
        cpu_compute.PARALLEL_MIN_ELEMENTS = threshold
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
    loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    try:
        torch.set_num_threads(1)
        numba.set_num_threads(1)
        loss_and_grad(acts, labels, act_lens, label_lens, **kw)
        assert (torch.get_num_threads(), numba.get_num_threads()) == (1, 1)
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])


def check_shift_invariance(device, backend, dtype):
    """Adding a constant to each row logits[b, t, u, :] changes neither loss nor
    gradient (the loss only sees log_softmax; k2's invariance test)."""
    acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device, dtype)
    gen = torch.Generator().manual_seed(7)
    shift = (torch.rand(acts.shape[:3], generator=gen, dtype=torch.float64) - 0.5) * 40
    shifted = acts + shift[..., None].to(device=device, dtype=dtype)
    kw = MB_CASE.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    loss_s, g_s = loss_and_grad(shifted, labels, act_lens, label_lens, **kw)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(loss_s, loss, rtol=tol, atol=tol)
    torch.testing.assert_close(g_s, g, rtol=tol, atol=tol)


def check_forward_only(device, backend):
    """Without autograd (no requires_grad, or under no_grad) the loss is the same."""
    acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device)
    kw = MB_CASE.kwargs(reduction="none", backend=backend)
    loss, _ = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    plain = multiblank_rnnt_loss(acts, labels, act_lens, label_lens, **kw)
    assert not plain.requires_grad
    torch.testing.assert_close(plain, loss, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        nog = multiblank_rnnt_loss(
            acts.clone().requires_grad_(True), labels, act_lens, label_lens, **kw
        )
    torch.testing.assert_close(nog, loss, rtol=1e-6, atol=1e-6)


def check_loss_dtypes(device, backend):
    """Loss dtype: float32 for float32/half input, float64 for float64 input."""
    acts, labels, act_lens, label_lens = make_inputs(MB_CASE, device)
    kw = MB_CASE.kwargs(reduction="mean", backend=backend)
    for dt, exp in [
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
    ]:
        loss = multiblank_rnnt_loss(acts.to(dt), labels, act_lens, label_lens, **kw)
        assert loss.dtype == exp, (dt, loss.dtype)


def check_masked_symbol(device, backend):
    """A -inf logit on a symbol that is never emitted is allowed: the result equals the
    loss over the vocabulary without that symbol, and its gradient column is 0."""
    c = Case("mask", 7, 4, 6, 0, (7, 5), (3, 2), seed=71)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    labels = torch.where(
        labels == 5, torch.ones_like(labels), labels
    )  # 5 never a label
    masked = acts.clone()
    masked[..., 5] = float("-inf")
    kw = dict(blank=0, reduction="none", backend=backend)
    loss, g = loss_and_grad(masked, labels, act_lens, label_lens, **kw)
    ref, ref_g = loss_and_grad(
        acts[..., :5].double(),
        labels,
        act_lens,
        label_lens,
        blank=0,
        reduction="none",
        backend="torch",
    )
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    # p = exp(-inf) = 0; a fast float32 exp may flush to the smallest normal (~1e-38)
    assert float(g[..., 5].abs().max()) <= 1e-30
    assert_grads_close(g[..., :5], ref_g, 1e-5, 1e-5)


# --------------------------------------------------------------------------- robustness
def check_large_logits(device, backend, dtype, scale):
    """Logits of magnitude ~``scale`` (1e4: a single dominant path; 100: large costs
    with competing paths): finite, and equal to the float64 reference."""
    c = Case("big", 10, 5, 6, 5, (10, 8), (4, 3), (2, 4), scale=scale, seed=81)
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
    assert float(ref_loss.min()) > scale  # really large costs
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=0.0)
    atol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(g.double(), ref_grad, rtol=0.0, atol=atol)


def check_vocabulary_size(device, backend, dtype, V: int, scale: float):
    """A vocabulary of ``V`` symbols (the CPU kernel computes the exps of small
    vocabularies frame by frame, of large ones row by row), logits of magnitude
    ``scale`` (1e4: most rows far below the frame's maximum, redone with their own),
    big blanks [2, 4], clamp and FastEmit: equal to the float64 reference."""
    c = Case(
        f"v{V}", 9, 4, V, V - 1, (9, 6), (3, 2), (2, 4), 0.05, 0.1, 0.5, 101, scale
    )
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    kw = c.kwargs(reduction="none", backend=backend)
    loss, g = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    ref_loss, ref_grad = reference64(c, acts, labels, act_lens, label_lens, "none")
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(loss.double(), ref_loss, rtol=tol, atol=tol)
    assert_grads_close(g, ref_grad, tol, tol)


def check_long_utterance(device, durations: Sequence[int]):
    """T = 2000, U = 501, V = 8, B = 1 with the numba backend: float32 and float64
    finite and equal to the float64 NumPy forward recursion of ``oracles.py``; the
    float32 gradient equal to the float64 one (whose correctness the medium tests
    establish)."""
    blank = 7
    c = Case("long", 2000, 501, 8, blank, (2000,), (500,), tuple(durations), seed=91)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="sum", backend="numba")
    loss32, g32 = loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    assert torch.isfinite(loss32) and torch.isfinite(g32).all()
    loss64, g64 = loss_and_grad(acts.double(), labels, act_lens, label_lens, **kw)
    expected = -diagonal_log_prob(
        acts[0].cpu(), labels[0].tolist(), 2000, 500, blank, c.durations
    )
    assert abs(float(loss64) - expected) <= 1e-10 * expected, (float(loss64), expected)
    assert abs(float(loss32) - expected) <= 1e-5 * expected, (float(loss32), expected)
    assert_grads_close(g32, g64, 1e-3, 1e-4)


def check_long_equal_logits(device):
    """T = 2000, U = 501 standard loss with all-equal logits vs the closed form."""
    acts = torch.zeros(1, 2000, 501, 8, device=device)
    labels = torch.ones(1, 500, dtype=torch.long, device=device)
    loss = multiblank_rnnt_loss(
        acts,
        labels,
        torch.tensor([2000], device=device),
        torch.tensor([500], device=device),
        blank=0,
        reduction="sum",
        backend="numba",
    )
    expected = standard_equal_logits_cost(2000, 500, 8)
    assert math.isfinite(float(loss))
    assert abs(float(loss) - expected) <= 1e-5 * expected, (float(loss), expected)


def check_zero_length(device, backend, reduction):
    """T_b = 0, L_b = 0 costs 0; T_b = 0 < L_b is impossible: +inf with exactly zero
    gradient; the other utterances are unaffected."""
    c = Case(
        "zero", 6, 4, 7, 6, (0, 0, 6, 5), (0, 2, 3, 1), (2, 4), sigma=0.05, seed=101
    )
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    loss, g = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction=reduction, backend=backend),
    )
    costs, grads = oracle(c, acts, labels, act_lens, label_lens)
    assert float(costs[0]) == 0.0 and math.isinf(float(costs[1]))  # the oracle agrees
    if reduction == "none":
        assert float(loss[0]) == 0.0
        assert float(loss[1]) == math.inf
        torch.testing.assert_close(
            loss[2:].double().cpu(), costs[2:], rtol=1e-5, atol=1e-5
        )
    else:
        assert float(loss) == math.inf
    assert torch.isfinite(g).all()
    assert torch.count_nonzero(g[:2]) == 0
    w = reduction_weights_oracle(reduction, label_lens.cpu()).view(-1, 1, 1, 1)
    assert_grads_close(g[2:], (grads * w)[2:], 1e-5, 1e-5)


def check_all_empty(device, backend):
    """A batch of utterances with no frames and no labels: loss 0, gradient 0."""
    acts = torch.randn(2, 3, 2, 4, device=device)
    labels = torch.ones(2, 1, dtype=torch.long, device=device)
    zeros = torch.zeros(2, dtype=torch.long, device=device)
    loss, g = loss_and_grad(
        acts, labels, zeros, zeros, blank=0, reduction="sum", backend=backend
    )
    assert float(loss) == 0.0
    assert torch.count_nonzero(g) == 0


# -------------------------------------------------------------------------- API surface
def check_module_and_aliases(device, backend):
    """MultiblankRNNTLoss == functional; MultiblankRNNTLossNumba (ESPnet constructor,
    clamp=-1 off); rnnt_loss == multiblank loss without big blanks."""
    c = MB_CASE
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    loss_f, g_f = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="mean", backend=backend),
    )

    def via_module(mod):
        x = acts.clone().requires_grad_(True)
        loss = mod(x, labels, act_lens, label_lens)
        loss.backward()
        return loss.detach(), x.grad

    mod = MultiblankRNNTLoss(
        c.blank, c.durations, "mean", c.fastemit_lambda, 0.0, c.sigma, backend=backend
    )
    assert isinstance(mod, torch.nn.Module)
    loss_m, g_m = via_module(mod)
    assert torch.equal(loss_m, loss_f) and torch.equal(g_m, g_f)
    alias = MultiblankRNNTLossNumba(
        c.blank,
        list(c.durations),
        fastemit_lambda=c.fastemit_lambda,
        sigma=c.sigma,
        backend=backend,
    )  # clamp defaults to -1: off
    assert alias.opts.clamp == 0.0 and alias.blank == c.blank
    assert tuple(alias.big_blank_durations) == c.durations
    loss_a, g_a = via_module(alias)
    assert loss_a.shape == (1,)  # as ESPnet's class
    assert torch.equal(loss_a.reshape(()), loss_f) and torch.equal(g_a, g_f)
    clamped = MultiblankRNNTLossNumba(
        c.blank,
        c.durations,
        clamp=0.01,
        sigma=c.sigma,
        fastemit_lambda=c.fastemit_lambda,
        backend=backend,
    )
    _, g_c = via_module(clamped)
    _, g_cf = loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="mean", backend=backend, clamp=0.01),
    )
    assert torch.equal(g_c, g_cf)
    assert float(g_c.abs().max()) <= 0.01 / c.B + 1e-9  # clamp before the 1/B weight

    std = Case("std", 6, 4, 5, 2, (6, 4), (3, 2), seed=111)
    acts, labels, act_lens, label_lens = make_inputs(std, device)
    a = rnnt_loss(
        acts, labels, act_lens, label_lens, blank=2, reduction="none", backend=backend
    )
    b = multiblank_rnnt_loss(
        acts, labels, act_lens, label_lens, 2, (), "none", backend=backend
    )
    assert torch.equal(a, b)
    costs, _ = oracle(std, acts, labels, act_lens, label_lens)
    torch.testing.assert_close(a.double().cpu(), costs, rtol=1e-5, atol=1e-5)


def check_empty_batch(device, backend):
    """B = 0: "none" gives an empty (0,) vector, "sum" gives 0."""
    acts = torch.randn(0, 4, 3, 5, device=device, requires_grad=True)
    labels = torch.zeros(0, 2, dtype=torch.long, device=device)
    lens = torch.zeros(0, dtype=torch.long, device=device)
    none = multiblank_rnnt_loss(
        acts, labels, lens, lens, blank=0, reduction="none", backend=backend
    )
    assert none.shape == (0,)
    total = multiblank_rnnt_loss(
        acts, labels, lens, lens, blank=0, reduction="sum", backend=backend
    )
    assert float(total.detach()) == 0.0
    total.backward()
    assert acts.grad is None or acts.grad.shape == acts.shape
