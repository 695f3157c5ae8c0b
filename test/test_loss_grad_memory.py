"""The gradient costs one logits-sized buffer whatever gradient flows in (CPU).

In training the loss is rarely backpropagated with an incoming gradient of exactly 1:
the plug-in's model weights it by 1 - ctc_weight, ESPnet's trainer divides by
accum_grad and AMP multiplies by its loss scale. These tests check, against the
float64 PyTorch backend (the oracle validated by brute force in test_loss.py),
that any incoming gradient gives the right values, that backward hands back the
buffer saved by the forward pass (no second logits-sized tensor: by storage identity
and by a peak-RSS probe in a subprocess), and how ``retain_graph=True`` behaves:
a gradient handed out is never modified afterwards, a second backward with the same
incoming gradient returns the same buffer and one with a different incoming gradient
returns correct values in a new tensor.

Both lattice families (multi-blank and TDT) and three code paths are covered: the CPU
kernel's deferred last pass (float32 / float64 logits), the plain kernel contract that
finishes the gradient in the forward pass (as the CUDA kernels do; here the CPU kernel
behind a wrapper without ``begin``) and half-precision logits (computed in float32
chunks).
"""

import json
import os
import subprocess
import sys

import loss_cases as lc
import pytest
import torch

from espnet_multiblank.loss.api import BACKENDS  # noqa: F401  (import check)
from espnet_multiblank.loss.cpu import driver
from espnet_multiblank.loss.families import family_of
from espnet_multiblank.loss.function import FusedTransducerFunction
from espnet_multiblank.loss.options import make_options, make_tdt_options
from espnet_multiblank.loss.validation import validate_inputs

#: per family, a case with sigma, FastEmit and padding (multi-blank [2, 4, 8];
#: TDT [0, 1, 2, 3])
CASES = {family: lc.SMALL[family] for family in ("multiblank", "tdt")}
families = pytest.mark.parametrize("family", list(CASES))


def plain_kernel(case):
    """The CPU kernel through the plain contract only (finished in the forward pass,
    like the CUDA kernels): no ``begin`` / ``finish`` attributes."""
    compute = driver.tdt_compute if case.tdt else driver.compute

    def kernel(*args):
        return compute(*args)

    return kernel


def _loss(case, x, labels, act_lens, label_lens, reduction, path, **over):
    kw = case.kwargs(reduction=reduction, **over)
    if path == "deferred":
        return case.loss_fn(x, labels, act_lens, label_lens, backend="numba", **kw)
    opts = (make_tdt_options if case.tdt else make_options)(**kw)
    family = family_of(opts)
    lab, al, ll = validate_inputs(x, labels, act_lens, label_lens, opts, family)
    return FusedTransducerFunction.apply(x, lab, al, ll, opts, plain_kernel(case))


def _incoming(kind, reduction, B, dtype):
    """The gradient flowing into the loss: a named case."""
    if reduction == "none":
        base = torch.linspace(0.5, 2.0, B, dtype=torch.float64)
        if kind == "negative":
            base = -base
        elif kind == "amp":
            base = base * 65536.0
        return base.to(dtype)
    value = {"one": 1.0, "0.7": 0.7, "negative": -2.5, "amp": 65536.0 / 3}[kind]
    return torch.tensor(value, dtype=dtype)


def _saved_buffer(loss):
    """The gradient buffer saved by our Function for ``loss``'s graph."""
    node = loss.grad_fn
    while node is not None and "FusedTransducerFunction" not in type(node).__name__:
        node = node.next_functions[0][0]
    assert node is not None, "the loss node was not found in the graph"
    return node.saved_tensors[0]


@families
@pytest.mark.parametrize("path", ["deferred", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", lc.REDUCTIONS)
@pytest.mark.parametrize("kind", ["one", "0.7", "negative", "amp"])
def test_incoming_gradient_values_and_no_copy(family, path, dtype, reduction, kind):
    """grad = incoming x reference grad; backward returns the saved buffer itself."""
    CASE = CASES[family]
    acts, labels, act_lens, label_lens = lc.make_inputs(CASE, "cpu", dtype)
    x = acts.clone().requires_grad_(True)
    loss = _loss(CASE, x, labels, act_lens, label_lens, reduction, path)
    g_in = _incoming(kind, reduction, CASE.B, loss.dtype)
    ptr = _saved_buffer(loss).data_ptr()
    (g,) = torch.autograd.grad(loss, x, grad_outputs=g_in)
    assert g.data_ptr() == ptr, "backward returned a new tensor, not the saved buffer"
    _, ref = lc.reference64(CASE, acts, labels, act_lens, label_lens, reduction)
    w = g_in.double().view(-1, 1, 1, 1) if reduction == "none" else g_in.double()
    rtol, atol_rel = (1e-9, 1e-10) if dtype == torch.float64 else (1e-4, 1e-5)
    lc.assert_grads_close(g, ref * w, rtol, atol_rel)


@families
@pytest.mark.parametrize("path", ["deferred", "plain"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_retain_graph_different_incoming(family, path, reduction):
    """backward with 0.7, then (retain_graph) with 1.3, then 0.7 again, then 1.3: each
    result is right; the first is never modified; the same incoming gradient gives the
    same buffer back, another one a new tensor."""
    CASE = CASES[family]
    acts, labels, act_lens, label_lens = lc.make_inputs(CASE, "cpu", torch.float64)
    x = acts.clone().requires_grad_(True)
    loss = _loss(CASE, x, labels, act_lens, label_lens, reduction, path)
    _, ref = lc.reference64(CASE, acts, labels, act_lens, label_lens, reduction)
    ones = torch.ones_like(loss)
    results = []
    for factor in (0.7, 1.3, 0.7, 1.3):
        (g,) = torch.autograd.grad(
            loss, x, grad_outputs=factor * ones, retain_graph=True
        )
        lc.assert_grads_close(g, factor * ref, 1e-9, 1e-10, msg=f"factor {factor}")
        results.append((factor, g, g.clone()))
    for factor, g, copy in results:
        assert torch.equal(g, copy), f"the gradient of factor {factor} was modified"
    buffer = _saved_buffer(loss)
    assert results[0][1].data_ptr() == buffer.data_ptr()
    assert results[2][1].data_ptr() == buffer.data_ptr()  # same incoming: same buffer
    assert results[1][1].data_ptr() != buffer.data_ptr()  # other incoming: new tensor


@families
@pytest.mark.parametrize("path", ["deferred", "plain"])
def test_zero_then_nonzero_incoming(family, path):
    """An incoming gradient of 0 gives 0 without losing the buffer: a later backward
    (retain_graph) with 2 is still right; a NaN incoming gradient gives NaN."""
    CASE = CASES[family]
    acts, labels, act_lens, label_lens = lc.make_inputs(CASE, "cpu", torch.float64)
    x = acts.clone().requires_grad_(True)
    loss = _loss(CASE, x, labels, act_lens, label_lens, "none", path)
    _, ref = lc.reference64(CASE, acts, labels, act_lens, label_lens, "none")
    zero = torch.tensor([0.0, 1.0, 0.0], dtype=loss.dtype)
    (g0,) = torch.autograd.grad(loss, x, grad_outputs=zero, retain_graph=True)
    lc.assert_grads_close(g0, ref * zero.view(-1, 1, 1, 1), 1e-9, 1e-10)
    assert torch.count_nonzero(g0[0]) == 0 and torch.count_nonzero(g0[2]) == 0
    (g2,) = torch.autograd.grad(
        loss, x, grad_outputs=torch.full_like(zero, 2.0), retain_graph=True
    )
    lc.assert_grads_close(g2, 2.0 * ref, 1e-9, 1e-10)
    nan = torch.tensor([1.0, float("nan"), 1.0], dtype=loss.dtype)
    (gn,) = torch.autograd.grad(loss, x, grad_outputs=nan)
    assert torch.isnan(gn[1]).all() and not torch.isnan(gn[0]).any()


@families
def test_scaled_loss_backward_into_a_network(family):
    """The ESPnet pattern: (1 - ctc_weight) * loss / accum_grad * amp_scale, with the
    logits coming out of a layer: the layer's parameters get the reference gradient."""
    CASE = CASES[family]
    torch.manual_seed(0)
    B, T, U, H = 3, 9, 5, 6
    _, labels, act_lens, label_lens = lc.make_inputs(CASE, "cpu", torch.float32)
    hidden = torch.randn(B, T, U, H)
    factor = (1 - 0.3) / 4 * 1024.0

    def grads(backend, dtype):
        torch.manual_seed(1)
        layer = torch.nn.Linear(H, CASE.width).to(dtype)  # the same parameters
        acts = layer(hidden.to(dtype)[:, : CASE.T, : CASE.U])
        kw = CASE.kwargs(reduction="mean", backend=backend)
        loss = CASE.loss_fn(acts, labels, act_lens, label_lens, **kw)
        (loss * factor).backward()
        return layer.weight.grad.double(), layer.bias.grad.double()

    got = grads("numba", torch.float32)
    want = grads("torch", torch.float64)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


@families
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_incoming(family, dtype):
    """float16 / bfloat16 logits: the gradient (in the input dtype) is scaled in place
    by an incoming 0.7, and a retain_graph backward with 1 is right too."""
    CASE = CASES[family]
    acts, labels, act_lens, label_lens = lc.make_inputs(CASE, "cpu", dtype)
    x = acts.clone().requires_grad_(True)
    kw = CASE.kwargs(reduction="sum", backend="numba")
    loss = CASE.loss_fn(x, labels, act_lens, label_lens, **kw)
    ptr = _saved_buffer(loss).data_ptr()
    _, ref = lc.reference64(CASE, acts, labels, act_lens, label_lens, "sum")
    eps = torch.finfo(dtype).eps
    (g,) = torch.autograd.grad(
        loss, x, grad_outputs=torch.tensor(0.7), retain_graph=True
    )
    assert g.dtype == dtype and g.data_ptr() == ptr
    lc.assert_grads_close(g, 0.7 * ref, 2 * eps, 1e-5)
    (g1,) = torch.autograd.grad(loss, x, grad_outputs=torch.tensor(1.0))
    lc.assert_grads_close(g1, ref, 2 * eps, 1e-5)


_PROBE = r"""
import json, sys
import torch
from espnet_multiblank import multiblank_rnnt_loss, tdt_loss

def kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

dtype, incoming = getattr(torch, sys.argv[1]), float(sys.argv[2])
tdt = sys.argv[3] == "tdt"
torch.set_num_threads(1)
B, T, U, V = 4, 100, 40, 1000  # 16e6 logits: 64 MB in float32
D = 5 if tdt else 0
gen = torch.Generator().manual_seed(0)
x = torch.randn(B, T, U, V + D, generator=gen).to(dtype).requires_grad_(True)
labels = torch.randint(1, V, (B, U - 1), generator=gen)
lens_t, lens_u = torch.full((B,), T), torch.full((B,), U - 1)
if tdt:
    loss = tdt_loss(x, labels, lens_t, lens_u, 0, range(5), reduction="mean")
else:
    loss = multiblank_rnnt_loss(x, labels, lens_t, lens_u, 0, (), "mean")
loss = loss * incoming
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM)
before = kb("VmRSS")
loss.backward()
peak = kb("VmHWM")
print(json.dumps({"extra_mb": (peak - before) / 1024.0,
                  "logits_mb": x.numel() * x.element_size() / 2**20}))
"""


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _clear_refs_works(), reason="needs /proc/self/clear_refs")
@pytest.mark.parametrize(
    "dtype,incoming",
    [("float32", 0.7), ("float32", 1.0), ("float64", 3.0), ("bfloat16", 0.7)],
)
@families
def test_backward_peak_memory(family, dtype, incoming):
    """Peak RSS during backward stays far below one more logits-sized buffer (the
    previous implementation multiplied the saved gradient into a new tensor)."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, dtype, str(incoming), family],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(here),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["extra_mb"] < 0.25 * res["logits_mb"], res
