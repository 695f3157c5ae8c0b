"""Device-agnostic test bodies of the losses, one per check, for every lattice.

Every ``check_*`` function takes ``device`` (a torch device: "cpu" for the CPU and
for the CUDA simulator, "cuda" for a GPU), usually ``backend`` and a case or a
lattice name, and raises an AssertionError when the loss misbehaves. ``test_loss.py``
runs them per device (CPU, the CUDA simulator in a subprocess, a real GPU) and per
lattice (standard / multi-blank / TDT). The oracles (``loss_cases.py``): brute-force
path enumeration, the float64 PyTorch backend (itself checked against the brute
force), ``torch.autograd.gradcheck``, ESPnet's own CPU ``RNNTLossNumba`` for the
standard loss, closed forms and NeMo's published TDT value, invariances.
"""

import math

import numba
import torch
from loss_cases import (
    INCOMING_GRADIENT_CASES,
    SMALL,
    TINY_CASES,
    Case,
    _mb,
    _tdt,
    assert_grads_close,
    cached_oracle,
    case_loss_and_grad,
    loss_and_grad,
    make_inputs,
    oracle,
    reference64,
)
from oracles import (
    brute_force_costs,
    diagonal_log_prob,
    enumerate_paths,
    reduction_weights_oracle,
    standard_equal_logits_cost,
)
from tdt_oracles import (
    enumerate_tdt_paths,
    tdt_brute_force_costs,
    tdt_forward_log_prob,
)

from espnet_multiblank import (
    MultiblankRNNTLoss,
    MultiblankRNNTLossNumba,
    TDTLoss,
    multiblank_rnnt_loss,
    rnnt_loss,
    tdt_loss,
)


def _tol(dtype):
    """(rtol, relative atol) of a float64 / a float32 result against float64."""
    return (1e-9, 1e-10) if dtype == torch.float64 else (1e-5, 1e-5)


# --------------------------------------------------------------------- oracle self-test
def check_multiblank_oracle():
    """The brute force itself: path counts, the all-equal-logits closed form, and
    the NumPy forward recursion against the enumeration."""
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
    # blank not last, sigma; no FastEmit: the recursion gives log P)
    for case in [c for c in TINY_CASES if not c.tdt]:
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


def check_tdt_oracle():
    """The TDT brute force: NeMo's published fixed case, path counts, and agreement
    with an independent forward recursion."""
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
    # durations {0, 1}, T_b = 2, L = 1 by hand:
    # (0,0)-y0->(0,1)-b->(1,1)-b->end, (0,0)-y1->(1,1)-b->end,
    # (0,0)-b->(1,0)-y0->(1,1)-b->end
    assert len(enumerate_tdt_paths(2, [5], 0, (0, 1))) == 3
    # blanks only, durations {1, 2}: compositions of T_b into 1s and 2s (Fibonacci)
    assert len(enumerate_tdt_paths(6, [], 0, (2, 1))) == 13
    # no duration fits: durations {2} and T_b odd
    assert enumerate_tdt_paths(5, [], 0, (2,)) == []
    assert enumerate_tdt_paths(0, [], 0, (1,)) == [()]
    assert enumerate_tdt_paths(0, [1], 0, (1,)) == []
    for case in [c for c in TINY_CASES if c.tdt]:
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
    """Loss and gradient (with the reduction's weights and, for "none", a
    non-uniform incoming gradient) against the enumeration of every path."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, dtype)
    costs, grads = cached_oracle(case, dtype)
    w = reduction_weights_oracle(reduction, label_lens)
    grad_out = None
    if reduction == "none":  # a non-uniform incoming gradient exercises backward
        grad_out = torch.linspace(0.5, 2.0, case.B, dtype=torch.float64)
        w = w * grad_out
    loss, g = case_loss_and_grad(
        case,
        acts,
        labels,
        act_lens,
        label_lens,
        grad_out=None if grad_out is None else grad_out.to(device),
        reduction=reduction,
        backend=backend,
    )
    exp_loss = costs if reduction == "none" else (costs * w).sum()
    exp_grad = grads * w.view(-1, 1, 1, 1)
    exp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert loss.dtype == exp_dtype, loss.dtype
    assert g.dtype == dtype and g.shape == acts.shape, (g.dtype, g.shape)
    assert tuple(loss.shape) == ((case.B,) if reduction == "none" else ()), loss.shape
    rtol, atol_rel = _tol(dtype)
    torch.testing.assert_close(
        loss.cpu().double(), exp_loss, rtol=rtol, atol=rtol, msg="loss != brute force"
    )
    assert torch.isfinite(g).all()
    assert_grads_close(g, exp_grad, rtol, atol_rel, msg="gradient != brute force")


def check_known_values(device, backend, lattice: str):
    """Values known without the brute force, or against it on special logits:
    standard: all-equal logits, closed form; multi-blank: all-equal logits against the
    enumeration; TDT: NeMo's published test (cost 4.155739, sum reduction)."""
    if lattice == "standard":
        case = _mb("eq", 7, 4, 6, 0, (7, 4, 1), (3, 3, 0))
        acts = torch.full((3, 7, 4, 6), 3.25, device=device)
        _, labels, act_lens, label_lens = make_inputs(case, device)
        loss, g = loss_and_grad(
            multiblank_rnnt_loss,
            acts,
            labels,
            act_lens,
            label_lens,
            blank=0,
            reduction="none",
            backend=backend,
        )
        expected = [
            standard_equal_logits_cost(t, lab, 6) for t, lab in [(7, 3), (4, 3), (1, 0)]
        ]
        torch.testing.assert_close(
            loss.cpu().double(),
            torch.tensor(expected, dtype=torch.float64),
            rtol=1e-5,
            atol=1e-5,
        )
        assert torch.isfinite(g).all()
    elif lattice == "multiblank":
        acts = torch.full((3, 7, 4, 6), 3.25, device=device)
        mb = _mb("eq_mb", 7, 4, 6, 5, (7, 4, 2), (3, 3, 1), (2, 4))
        _, labels, act_lens, label_lens = make_inputs(mb, device)
        costs, grads = oracle(mb, acts, labels, act_lens, label_lens)
        loss, g = case_loss_and_grad(
            mb, acts, labels, act_lens, label_lens, reduction="none", backend=backend
        )
        torch.testing.assert_close(loss.cpu().double(), costs, rtol=1e-5, atol=1e-5)
        assert_grads_close(g, grads, 1e-5, 1e-5)
    else:
        acts = torch.zeros(1, 3, 2, 4 + 3, device=device)
        loss = tdt_loss(
            acts,
            torch.tensor([[0]], device=device),
            torch.tensor([3], device=device),
            torch.tensor([1], device=device),
            blank=3,
            durations=[0, 1, 2],
            reduction="sum",
            sigma=0.05,
            backend=backend,
        )
        assert abs(float(loss) - 4.155739) < 1e-5, float(loss)


def _no_label_case(lattice):
    if lattice == "tdt":
        return _tdt("nolab", 7, 1, 5, 4, (7, 3, 1), (0, 0, 0), (1, 2), 0.05, seed=15)
    durations = (2, 3) if lattice == "multiblank" else ()
    return _mb("nolab", 7, 1, 5, 4, (7, 3, 1), (0, 0, 0), durations, 0.05, seed=15)


def check_no_label_dimension(device, backend, lattice: str):
    """U = 1 (labels of shape (B, 0)): only blanks; against the brute force."""
    c = _no_label_case(lattice)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    assert labels.shape == (3, 0)
    costs, grads = oracle(c, acts, labels, act_lens, label_lens)
    loss, g = case_loss_and_grad(
        c, acts, labels, act_lens, label_lens, reduction="none", backend=backend
    )
    torch.testing.assert_close(loss.double().cpu(), costs, rtol=1e-5, atol=1e-5)
    assert_grads_close(g, grads, 1e-5, 1e-5)


def check_wide_labels(device, backend, lattice: str):
    """labels wider than U - 1 (extra columns of garbage) give the same result."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = dict(reduction="none", backend=backend)
    loss, g = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    extra = torch.full((c.B, 3), -5, dtype=labels.dtype, device=labels.device)
    loss_w, g_w = case_loss_and_grad(
        c, acts, torch.cat([labels, extra], dim=1), act_lens, label_lens, **kw
    )
    assert torch.equal(loss_w, loss) and torch.equal(g_w, g)


# ----------------------------------------------------------------- medium: vs reference
def check_vs_reference(
    device, backend, case: Case, dtype, reduction="mean_label_normalized"
):
    """``backend`` in ``dtype`` vs the float64 PyTorch backend on a medium random batch
    with variable lengths (the reference is validated against the brute force)."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    ref_loss, ref_grad = reference64(
        case, acts, labels, act_lens, label_lens, reduction
    )
    loss, g = case_loss_and_grad(
        case,
        acts.to(dtype),
        labels,
        act_lens,
        label_lens,
        reduction=reduction,
        backend=backend,
    )
    rtol, atol_rel = _tol(dtype)
    torch.testing.assert_close(loss.double().cpu(), ref_loss.cpu(), rtol=rtol, atol=0.0)
    assert_grads_close(g, ref_grad, 10 * rtol, atol_rel)


def check_gradcheck(device, backend, case: Case, reduction: str):
    """torch.autograd.gradcheck in float64 (no FastEmit/clamp: those are not
    gradients)."""
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    acts.requires_grad_(True)

    def f(x):
        return case.loss_fn(
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
    import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (nltk first)

    # isort: split
    from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import RNNTLossNumba

    case = _mb("esp", 6, 4, 5, blank, (6, 4), (3, 2), seed=41)
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
        multiblank_rnnt_loss,
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
def check_half_precision(device, backend, lattice: str, dtype):
    """float16 / bfloat16 logits: loss float32, gradient in ``dtype``, against the
    float64 reference on the same values; the reductions' weights (uniform and per
    utterance) survive the CPU's float32 chunks."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    for reduction in ("sum", "mean_volume", "mean_label_normalized"):
        loss, g = case_loss_and_grad(
            c, acts, labels, act_lens, label_lens, reduction=reduction, backend=backend
        )
        assert loss.dtype == torch.float32, loss.dtype
        assert g.dtype == dtype, g.dtype
        ref_loss, ref_grad = reference64(
            c, acts, labels, act_lens, label_lens, reduction
        )
        torch.testing.assert_close(
            loss.double().cpu(), ref_loss.cpu(), rtol=1e-5, atol=1e-5
        )
        assert_grads_close(g, ref_grad, torch.finfo(dtype).eps, 1e-5)


def check_index_dtypes(device, backend, lattice: str):
    """int32 and int64 labels / lengths (also mixed) give identical results."""
    c = SMALL[lattice]
    results = []
    for lab_dt, len_dt in [
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
        (torch.int32, torch.int64),
    ]:
        acts, labels, act_lens, label_lens = make_inputs(c, device)
        results.append(
            case_loss_and_grad(
                c,
                acts,
                labels.to(lab_dt),
                act_lens.to(len_dt),
                label_lens.to(len_dt),
                reduction="mean",
                backend=backend,
            )
        )
    for loss, g in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(g, results[0][1])


def check_non_contiguous(device, backend, lattice: str):
    """A transposed view and a slice of a wider tensor give the same loss and
    gradient as the contiguous tensor (and the gradient flows back to the base)."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="sum", backend=backend)
    loss, g = loss_and_grad(c.loss_fn, acts, labels, act_lens, label_lens, **kw)

    base = acts.transpose(1, 2).contiguous().requires_grad_(True)  # (B, U, T, V')
    view = base.transpose(1, 2)
    assert not view.is_contiguous()
    loss_t = c.loss_fn(view, labels, act_lens, label_lens, **kw)
    loss_t.backward()
    torch.testing.assert_close(loss_t.detach(), loss)
    torch.testing.assert_close(base.grad.transpose(1, 2), g)

    wide = torch.cat([acts, torch.randn_like(acts[..., :3])], dim=-1)
    wide.requires_grad_(True)
    sliced = wide[..., : c.width]
    assert not sliced.is_contiguous()
    loss_s = c.loss_fn(sliced, labels, act_lens, label_lens, **kw)
    loss_s.backward()
    torch.testing.assert_close(loss_s.detach(), loss)
    torch.testing.assert_close(wide.grad[..., : c.width], g)
    assert torch.count_nonzero(wide.grad[..., c.width :]) == 0


_PADDING_CASES = {
    "standard": _mb("pad", 10, 7, 8, 7, (6, 4, 5), (3, 2, 1), (), 0.05, 0.2, seed=61),
    "multiblank": _mb(
        "pad", 10, 7, 8, 7, (6, 4, 5), (3, 2, 1), (2, 4), 0.05, 0.2, seed=61
    ),
    "tdt": _tdt(
        "pad", 10, 7, 6, 5, (6, 4, 5), (3, 2, 1), (0, 1, 2, 3), 0.05, 0.2, seed=91
    ),
}


def check_padding(device, backend, lattice: str):
    """T > max T_b and U > max L_b + 1: padding (NaN included) gets exactly zero
    gradient, garbage in the padded labels is ignored, and the costs equal those of
    the cropped batch."""
    c = _PADDING_CASES[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    assert (labels == -1).any() and (labels == c.blank).any()
    if c.tdt:  # the index of the first duration logit
        assert (labels == c.V).any()
    for b in range(c.B):  # NaN in the padding must be ignored
        acts[b, c.act_lens[b] :] = math.nan
        acts[b, :, c.label_lens[b] + 1 :] = math.nan
    kw = dict(reduction="none", backend=backend)
    loss, g = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    for b in range(c.B):
        T_b, U_b = c.act_lens[b], c.label_lens[b] + 1
        assert torch.count_nonzero(g[b, T_b:]) == 0, f"utterance {b}: t >= T_b"
        assert torch.count_nonzero(g[b, :, U_b:]) == 0, f"utterance {b}: u >= U_b"
        assert torch.count_nonzero(g[b, :T_b, :U_b]) > 0
    crop_T, crop_U = max(c.act_lens), max(c.label_lens) + 1
    loss_c, g_c = case_loss_and_grad(
        c,
        acts[:, :crop_T, :crop_U],
        labels[:, : crop_U - 1],
        act_lens,
        label_lens,
        **kw,
    )
    torch.testing.assert_close(loss, loss_c, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g[:, :crop_T, :crop_U], g_c, rtol=1e-6, atol=1e-7)


def check_retain_graph(device, backend, lattice: str, reduction: str):
    """backward twice (retain_graph) gives identical gradients; the second call with a
    different incoming gradient scales it and does not modify the first result; a
    summed loss accumulates into x.grad without sharing storage with the saved
    gradient."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    x = acts.clone().requires_grad_(True)
    loss = c.loss_fn(
        x,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction=reduction, backend=backend),
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
    loss2 = c.loss_fn(
        x,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="sum", backend=backend),
    )
    loss2.backward(retain_graph=True)
    first = x.grad.clone()
    loss2.backward(retain_graph=True)
    torch.testing.assert_close(x.grad, 2 * first)
    x.grad.zero_()  # in place, as optimizer.zero_grad(set_to_none=False) does
    loss2.backward()
    assert torch.equal(x.grad, first), "x.grad shares storage with the saved gradient"


def check_threads_unchanged(device, backend, lattice: str):
    """torch's and numba's thread counts are the same after a call as before, including
    after the caller changed them (CPU kernels)."""
    import espnet_multiblank.loss.cpu.driver as cpu_driver

    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = dict(reduction="mean", backend=backend)
    before = (torch.get_num_threads(), numba.get_num_threads())
    threshold = cpu_driver.PARALLEL_MIN_ELEMENTS
    try:
        cpu_driver.PARALLEL_MIN_ELEMENTS = 0  # take the parallel path on a small case
        torch.set_num_threads(2)
        numba.set_num_threads(1)  # differs from what the kernel will use
        case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
        assert (torch.get_num_threads(), numba.get_num_threads()) == (2, 1)
    finally:
        cpu_driver.PARALLEL_MIN_ELEMENTS = threshold
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
    case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    try:
        torch.set_num_threads(1)
        numba.set_num_threads(1)
        case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
        assert (torch.get_num_threads(), numba.get_num_threads()) == (1, 1)
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])


def check_shift_invariance(device, backend, lattice: str, dtype):
    """A constant added to each row's part with its own softmax (the whole row; a
    TDT's token part or its duration part) changes neither loss nor gradient (k2's
    invariance test); raising one logit alone does change the loss (so the test can
    fail)."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    kw = dict(reduction="none", backend=backend)
    loss, g = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    gen = torch.Generator().manual_seed(7)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for part in c.softmax_parts:
        shift = (
            torch.rand(acts.shape[:3], generator=gen, dtype=torch.float64) - 0.5
        ) * 40
        shifted = acts.clone()
        shifted[..., part] += shift[..., None].to(device=device, dtype=dtype)
        loss_s, g_s = case_loss_and_grad(c, shifted, labels, act_lens, label_lens, **kw)
        torch.testing.assert_close(loss_s, loss, rtol=tol, atol=tol)
        torch.testing.assert_close(g_s, g, rtol=tol, atol=tol)
    moved = acts.clone()
    moved[..., 0] += 1.0
    loss_m, _ = case_loss_and_grad(c, moved, labels, act_lens, label_lens, **kw)
    assert not torch.allclose(loss_m, loss)


def check_duration_permutation(device, backend, lattice: str):
    """Durations permuted together with their logits (a TDT's duration logits, the
    big blanks' ids blank - 1 - i): same loss, and the gradient permuted the same
    way; permuting the durations alone changes the loss (so the test can fail)."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device, torch.float64)
    kw = dict(reduction="none", backend=backend)
    loss, g = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    perm = [2, 0, 3, 1] if c.tdt else [2, 0, 1]
    durs = tuple(c.durations[p] for p in perm)
    idx = list(range(c.width))
    for i, p in enumerate(perm):
        if c.tdt:  # duration logit i now holds the old duration logit p
            idx[c.V + i] = c.V + p
        else:  # big blank i (id blank - 1 - i) now holds the old big blank p
            idx[c.blank - 1 - i] = c.blank - 1 - p
    over = {"durations" if c.tdt else "big_blank_durations": durs}
    loss_p, g_p = case_loss_and_grad(
        c, acts[..., idx], labels, act_lens, label_lens, **kw, **over
    )
    torch.testing.assert_close(loss_p, loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g_p, g[..., idx], rtol=1e-10, atol=1e-10)
    loss_x, _ = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw, **over)
    assert not torch.allclose(loss_x, loss)


def check_forward_only(device, backend, lattice: str):
    """Without autograd (no requires_grad, or under no_grad) the loss is the same."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="none", backend=backend)
    loss, _ = loss_and_grad(c.loss_fn, acts, labels, act_lens, label_lens, **kw)
    plain = c.loss_fn(acts, labels, act_lens, label_lens, **kw)
    assert not plain.requires_grad
    torch.testing.assert_close(plain, loss, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        nog = c.loss_fn(
            acts.clone().requires_grad_(True), labels, act_lens, label_lens, **kw
        )
    torch.testing.assert_close(nog, loss, rtol=1e-6, atol=1e-6)


def check_loss_dtypes(device, backend, lattice: str):
    """Loss dtype: float32 for float32/half input, float64 for float64 input."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = c.kwargs(reduction="mean", backend=backend)
    for dt, exp in [
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
    ]:
        loss = c.loss_fn(acts.to(dt), labels, act_lens, label_lens, **kw)
        assert loss.dtype == exp, (dt, loss.dtype)


_MASK_CASES = {  # the symbol masked is V - 1, a label id (never the blank)
    "standard": _mb("mask", 7, 4, 6, 0, (7, 5), (3, 2), seed=71),
    "multiblank": _mb("mask", 7, 4, 7, 2, (7, 5), (3, 2), (2, 4), seed=71),
    "tdt": _tdt("mask", 6, 3, 5, 0, (6, 4), (2, 2), (0, 1, 2), seed=71),
}


def check_masked_symbol(device, backend, lattice: str):
    """A -inf logit on a symbol that is never emitted is allowed: the result equals the
    loss over the vocabulary without that symbol, and its gradient column is 0."""
    c = _MASK_CASES[lattice]
    k = c.V - 1
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    labels = torch.where(labels == k, torch.full_like(labels, c.label_ids[0]), labels)
    masked = acts.clone()
    masked[..., k] = float("-inf")
    kw = dict(reduction="none", backend=backend)
    loss, g = case_loss_and_grad(c, masked, labels, act_lens, label_lens, **kw)
    keep = [i for i in range(c.width) if i != k]
    ref, ref_g = case_loss_and_grad(
        c.but(V=c.V - 1),
        acts[..., keep].double(),
        labels,
        act_lens,
        label_lens,
        reduction="none",
        backend="torch",
    )
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    # p = exp(-inf) = 0; a fast float32 exp may flush to the smallest normal (~1e-38)
    assert float(g[..., k].abs().max()) <= 1e-30
    assert_grads_close(g[..., keep], ref_g, 1e-5, 1e-5)


# --------------------------------------------------------------------------- robustness
_LARGE_CASES = {
    "standard": _mb("big", 10, 5, 6, 5, (10, 8), (4, 3), seed=81),
    "multiblank": _mb("big", 10, 5, 6, 5, (10, 8), (4, 3), (2, 4), seed=81),
    "tdt": _tdt("big", 9, 4, 5, 4, (9, 7), (3, 2), (0, 1, 2, 3), seed=81),
}


def check_large_logits(device, backend, lattice: str, dtype, scale):
    """Logits of magnitude ~``scale`` (1e4: a single dominant path; 100: large costs
    with competing paths): finite, and equal to the float64 reference."""
    c = _LARGE_CASES[lattice].but(scale=scale)
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    loss, g = case_loss_and_grad(
        c, acts, labels, act_lens, label_lens, reduction="none", backend=backend
    )
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    ref_loss, ref_grad = reference64(c, acts, labels, act_lens, label_lens, "none")
    assert float(ref_loss.min()) > scale  # really large costs
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=0.0)
    atol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(g.double(), ref_grad, rtol=0.0, atol=atol)


def check_row_width(device, backend, lattice: str, dtype, width: int, scale: float):
    """Rows of ``width`` logits (the CPU kernel computes the exps of narrow rows
    frame by frame, of wide ones row by row), logits of magnitude ``scale`` (1e4: most
    rows far below the frame's maximum, redone with their own), sigma, FastEmit and
    clamp: equal to the float64 reference."""
    if lattice == "tdt":
        c = _tdt(
            f"w{width}",
            9,
            4,
            width - 4,
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
    else:
        durations = (2, 4) if lattice == "multiblank" else ()
        c = _mb(
            f"v{width}",
            9,
            4,
            width,
            width - 1,
            (9, 6),
            (3, 2),
            durations,
            0.05,
            0.1,
            0.5,
            101,
            scale,
        )
    acts, labels, act_lens, label_lens = make_inputs(c, device, dtype)
    kw = dict(reduction="none", backend=backend)
    loss, g = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    ref_loss, ref_grad = reference64(c, acts, labels, act_lens, label_lens, "none")
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(loss.double(), ref_loss, rtol=tol, atol=tol)
    assert_grads_close(g, ref_grad, tol, tol)


def check_long_utterance(device, lattice: str):
    """One long utterance with the numba backend (multi-blank [2, 4, 8]: T = 2000,
    U = 501, V = 8; TDT [0..4]: T = 400, U = 101): float32 and float64 finite and
    equal to the float64 NumPy forward recursion of the oracles; the float32
    gradient equal to the float64 one (whose correctness the medium tests
    establish)."""
    if lattice == "tdt":
        c = _tdt("long", 400, 101, 8, 7, (400,), (100,), (0, 1, 2, 3, 4), 0.05, seed=51)
    else:
        c = _mb("long", 2000, 501, 8, 7, (2000,), (500,), (2, 4, 8), seed=91)
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = dict(reduction="sum", backend="numba")
    loss32, g32 = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    assert torch.isfinite(loss32) and torch.isfinite(g32).all()
    loss64, g64 = case_loss_and_grad(
        c, acts.double(), labels, act_lens, label_lens, **kw
    )
    forward = tdt_forward_log_prob if c.tdt else diagonal_log_prob
    expected = -forward(
        acts[0].cpu(),
        labels[0].tolist(),
        c.act_lens[0],
        c.label_lens[0],
        c.blank,
        c.durations,
        c.sigma,
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


# --------------------------------------------------------------------------- edge cases
_IMPOSSIBLE_CASES = {
    # (case, which utterances have no path); utterance 0 is T_b = 0 = L_b (cost 0)
    "standard": (
        _mb("zero", 6, 4, 7, 6, (0, 0, 6, 5), (0, 2, 3, 1), sigma=0.05, seed=101),
        [False, True, False, False],
    ),
    "multiblank": (
        _mb("zero", 6, 4, 7, 6, (0, 0, 6, 5), (0, 2, 3, 1), (2, 4), 0.05, seed=101),
        [False, True, False, False],
    ),
    # durations {0, 2}: odd T_b cannot be reached
    "tdt": (
        _tdt("imp", 5, 3, 4, 1, (0, 0, 5, 3, 4), (0, 2, 2, 1, 1), (0, 2), seed=61),
        [False, True, True, True, False],
    ),
}


def check_impossible(device, backend, lattice: str, reduction: str):
    """T_b = 0 = L_b costs 0; an utterance without a complete path (T_b = 0 < L_b;
    for a TDT also durations that cannot land on T_b) costs +inf with an exactly zero
    gradient; a reduced loss with one is +inf; the other utterances are unaffected."""
    c, impossible = _IMPOSSIBLE_CASES[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    loss, g = case_loss_and_grad(
        c, acts, labels, act_lens, label_lens, reduction=reduction, backend=backend
    )
    costs, grads = oracle(c, acts, labels, act_lens, label_lens)
    assert float(costs[0]) == 0.0  # the oracle agrees
    assert [math.isinf(float(x)) for x in costs] == impossible
    n = len(impossible) - impossible[::-1].index(True)  # the last impossible one + 1
    if reduction == "none":
        assert float(loss[0]) == 0.0
        assert loss[1:n].tolist() == [math.inf] * (n - 1)
        torch.testing.assert_close(
            loss[n:].double().cpu(), costs[n:], rtol=1e-5, atol=1e-5
        )
    else:
        assert float(loss) == math.inf
    assert torch.isfinite(g).all()
    assert torch.count_nonzero(g[:n]) == 0
    w = reduction_weights_oracle(reduction, label_lens).view(-1, 1, 1, 1)
    assert_grads_close(g[n:], (grads * w)[n:], 1e-5, 1e-5)
    if c.tdt:  # durations (2, 3) and T_b = 1: nothing fits
        c2 = _tdt("imp2", 5, 2, 4, 0, (1, 5), (0, 1), (2, 3), seed=62)
        acts, labels, act_lens, label_lens = make_inputs(c2, device)
        loss, g = case_loss_and_grad(
            c2, acts, labels, act_lens, label_lens, reduction="none", backend=backend
        )
        assert float(loss[0]) == math.inf and torch.count_nonzero(g[0]) == 0
        assert math.isfinite(float(loss[1])) and torch.count_nonzero(g[1]) > 0


def check_no_frames(device, backend, lattice: str):
    """Utterances with no frames: a batch of T_b = 0 = L_b costs 0 with a zero
    gradient; T = 0 (every T_b = 0) costs 0 without labels, +inf with, and the
    gradient is empty."""
    c = SMALL[lattice]
    acts = torch.randn(2, 3, 2, c.width, device=device)
    labels = torch.full((2, 1), c.label_ids[0], dtype=torch.long, device=device)
    zeros = torch.zeros(2, dtype=torch.long, device=device)
    loss, g = case_loss_and_grad(
        c, acts, labels, zeros, zeros, reduction="sum", backend=backend
    )
    assert float(loss) == 0.0
    assert torch.count_nonzero(g) == 0
    acts = torch.randn(2, 0, 3, c.width, device=device, requires_grad=True)
    labels = torch.tensor([c.label_ids[:2]] * 2, device=device)
    loss = c.loss_fn(
        acts,
        labels,
        torch.tensor([0, 0], device=device),
        torch.tensor([0, 2], device=device),
        **c.kwargs(reduction="none", backend=backend),
    )
    assert loss.tolist() == [0.0, math.inf]
    loss[:1].sum().backward()
    assert acts.grad is None or acts.grad.shape == acts.shape


def check_empty_batch(device, backend, lattice: str):
    """B = 0: "none" gives an empty (0,) vector, "sum" gives 0."""
    c = SMALL[lattice]
    acts = torch.randn(0, 4, 3, c.width, device=device, requires_grad=True)
    labels = torch.zeros(0, 2, dtype=torch.long, device=device)
    lens = torch.zeros(0, dtype=torch.long, device=device)
    none = c.loss_fn(
        acts, labels, lens, lens, **c.kwargs(reduction="none", backend=backend)
    )
    assert none.shape == (0,)
    total = c.loss_fn(
        acts, labels, lens, lens, **c.kwargs(reduction="sum", backend=backend)
    )
    assert float(total.detach()) == 0.0
    total.backward()
    assert acts.grad is None or acts.grad.shape == acts.shape


def check_incoming_gradient(device, backend, lattice: str):
    """Any incoming gradient (0.7, negative, per utterance) multiplies the clamped
    per-utterance gradient: d loss / d acts_b = g_out[b] * w_b * clip(d cost_b)."""
    case = INCOMING_GRADIENT_CASES[lattice]
    acts, labels, act_lens, label_lens = make_inputs(case, device, torch.float64)
    costs, grads = cached_oracle(case, torch.float64)
    for reduction, g_out in [
        ("none", torch.tensor([-1.5, 0.7], dtype=torch.float64)),
        ("mean", torch.tensor(0.7, dtype=torch.float64)),
        ("sum", torch.tensor(-2.0, dtype=torch.float64)),
        ("mean_label_normalized", torch.tensor(1.3, dtype=torch.float64)),
    ]:
        loss, g = case_loss_and_grad(
            case,
            acts,
            labels,
            act_lens,
            label_lens,
            grad_out=g_out.to(device),
            reduction=reduction,
            backend=backend,
        )
        w = reduction_weights_oracle(reduction, label_lens) * g_out
        assert_grads_close(g, grads * w.view(-1, 1, 1, 1), 1e-9, 1e-10)


# -------------------------------------------------------------------------- API surface
def check_modules(device, backend, lattice: str):
    """The module forms equal the functional ones: MultiblankRNNTLoss and the
    ESPnet drop-in MultiblankRNNTLossNumba (clamp=-1 off, a 1-element result, clamp
    before the 1/B weight), rnnt_loss for the standard lattice, TDTLoss (its repr
    names the options)."""
    c = SMALL[lattice]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    loss_f, g_f = case_loss_and_grad(
        c, acts, labels, act_lens, label_lens, reduction="mean", backend=backend
    )

    def via_module(mod):
        x = acts.clone().requires_grad_(True)
        loss = mod(x, labels, act_lens, label_lens)
        loss.backward()
        return loss.detach(), x.grad

    if c.tdt:
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
        loss_m, g_m = via_module(mod)
        assert torch.equal(loss_m, loss_f) and torch.equal(g_m, g_f)
        return
    mod = MultiblankRNNTLoss(
        c.blank, c.durations, "mean", c.fastemit_lambda, 0.0, c.sigma, backend=backend
    )
    assert isinstance(mod, torch.nn.Module)
    assert f"big_blank_durations={list(c.durations)}" in repr(mod)
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
    _, g_cf = case_loss_and_grad(
        c,
        acts,
        labels,
        act_lens,
        label_lens,
        reduction="mean",
        backend=backend,
        clamp=0.01,
    )
    assert torch.equal(g_c, g_cf)
    assert float(g_c.abs().max()) <= 0.01 / c.B + 1e-9  # clamp before the 1/B weight
    if lattice == "standard":
        std = _mb("std", 6, 4, 5, 2, (6, 4), (3, 2), seed=111)
        acts, labels, act_lens, label_lens = make_inputs(std, device)
        a = rnnt_loss(
            acts,
            labels,
            act_lens,
            label_lens,
            blank=2,
            reduction="none",
            backend=backend,
        )
        b = multiblank_rnnt_loss(
            acts, labels, act_lens, label_lens, 2, (), "none", backend=backend
        )
        assert torch.equal(a, b)
        costs, _ = oracle(std, acts, labels, act_lens, label_lens)
        torch.testing.assert_close(a.double().cpu(), costs, rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------------- omega (TDT)
def check_omega_one_is_rnnt(device, backend):
    """omega = 1: exactly the standard RNN-T loss on the token logits (no sigma,
    FastEmit and clamp kept), and an exactly zero gradient on the duration logits."""
    c = SMALL["tdt"]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    for clamp in (0.0, 0.02):
        loss, g = case_loss_and_grad(
            c,
            acts,
            labels,
            act_lens,
            label_lens,
            reduction="mean",
            backend=backend,
            omega=1.0,
            clamp=clamp,
        )
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
    tdt, _ = case_loss_and_grad(
        c, acts, labels, act_lens, label_lens, reduction="mean", backend=backend
    )
    assert not torch.allclose(tdt, loss)


def check_omega_draw(device, backend):
    """0 < omega < 1: each call is either the TDT or the RNN-T loss, chosen by one draw
    of torch's default generator (torch.manual_seed reproduces it); both occur."""
    c = SMALL["tdt"]
    acts, labels, act_lens, label_lens = make_inputs(c, device)
    kw = dict(reduction="sum", backend=backend)
    tdt, _ = case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    rnnt, _ = case_loss_and_grad(c, acts, labels, act_lens, label_lens, omega=1.0, **kw)
    seen = []
    for seed in range(12):
        torch.manual_seed(seed)
        expect_rnnt = float(torch.rand(())) < 0.5
        torch.manual_seed(seed)
        loss, g = case_loss_and_grad(
            c, acts, labels, act_lens, label_lens, omega=0.5, **kw
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
    case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    assert torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------- processes (CPU only)
_CONCURRENT_SCRIPT = r"""
import sys, threading
sys.path.insert(0, sys.argv[1])
import torch, loss_cases as lc
import espnet_multiblank.loss.cpu.driver as cpu_driver
cpu_driver.PARALLEL_MIN_ELEMENTS = 0  # exercise the parallel kernels on a small case
c = lc.ALL_OPTIONS_MEDIUM[sys.argv[2]]
acts, labels, al, ll = lc.make_inputs(c, "cpu")
kw = dict(reduction="sum", backend="numba")
ref = lc.case_loss_and_grad(c, acts, labels, al, ll, **kw)
errors = []
def work():
    try:
        for _ in range(5):
            l, g = lc.case_loss_and_grad(c, acts, labels, al, ll, **kw)
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

_FORK_SCRIPT = r"""
import multiprocessing as mp, sys
sys.path.insert(0, sys.argv[1])
import torch, loss_cases as lc
import espnet_multiblank.loss.cpu.driver as cpu_driver
cpu_driver.PARALLEL_MIN_ELEMENTS = 0  # exercise the parallel kernels on a small case
torch.set_num_threads(2)
c = lc.ALL_OPTIONS_MEDIUM[sys.argv[2]]
acts, labels, al, ll = lc.make_inputs(c, "cpu")
kw = dict(reduction="sum", backend="numba")
ref = lc.case_loss_and_grad(c, acts, labels, al, ll, **kw)  # the parent goes first

def child(q):
    l, g = lc.case_loss_and_grad(c, acts, labels, al, ll, **kw)
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


def _run_script(script: str, family: str) -> None:
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", script, here, family],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])


def check_concurrent_calls_cpu(family: str):
    """Calls from several Python threads at once give the right results and do not
    abort the process (Numba's workqueue threading layer aborts on concurrent
    parallel launches; hence a subprocess)."""
    _run_script(_CONCURRENT_SCRIPT, family)


def check_forked_child_cpu(family: str):
    """A forked child (DataLoader workers, multiprocessing) may call the loss after the
    parent did: GNU OpenMP is not fork-safe, so a naive parallel kernel hangs there."""
    _run_script(_FORK_SCRIPT, family)
