"""Tests of the CUDA backend that are not kernel cases (those are in
``test_loss_kernels.py`` and ``test_loss.py``, run in the CUDA simulator and on a
GPU).

Without a GPU: importing the package does not import numba.cuda, and the kernels
compile to PTX for sm_90 (``helpers/cuda_ptx_check.py``: no local memory, the
unrolled loads, no float64 work in the float32 row loops, ptxas register / spill
counts). On a real GPU (skipped otherwise, with the reason): V = 1000 and 3000 in
float32 / float16 / bfloat16 for both losses (float64 reference on the GPU, the CPU
kernel), float32 utterances of T = 2000 against float64, the gradient's memory (one
logits-sized buffer above the inputs for an incoming gradient of 0.7), more than
1023 labels, T = 3000, a non-default stream, no torch host synchronisation, and
ESPnet's own CUDA multi-blank loss as a second oracle.
"""

import math
import os
import subprocess
import sys

import devices
import pytest
import torch
from kernel_cases import (
    BF16_TOL,
    F16_TOL,
    KernelCase,
    _tdt_case,
    case_options,
    compare_with_kernel,
    make_inputs,
    reference,
    run_case,
)

from espnet_multiblank.loss.families import family_of

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
gpu = devices.gpu


def _cuda(case):
    return family_of(case_options(case)).cuda_driver()


def _cpu(case):
    return family_of(case_options(case)).cpu_driver()


def test_import_is_lazy():
    """Importing the package must not import numba.cuda (CPU-only installs)."""
    code = (
        "import sys, espnet_multiblank.loss.cuda as m; "
        "assert callable(m.compute); "
        "bad = [k for k in sys.modules if k.startswith(('numba.cuda', 'numba_cuda'))]; "
        "assert not bad, bad; print('ok')"
    )
    env = dict(
        os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=_ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


_LARGE_TOL = {
    torch.float32: dict(cost=1e-5, grad=1e-5),
    torch.float16: F16_TOL,
    torch.bfloat16: BF16_TOL,
}


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1000, 3000])
def test_gpu_large_vocab(V, dtype):
    """Multi-blank [2, 4, 8] at V = 1000 / 3000 (teams of 128 / 512 threads: the
    shared-memory tree across warps, one chunk of 8 loads per thread): costs and
    gradients against the float64 reference on the same values (on the GPU), through
    the autograd Function with incoming gradients 0.7 and 1.3, and against the CPU
    kernel."""
    case = KernelCase(
        f"large_V{V}",
        B=3,
        T=40,
        U=9,
        V=V,
        blank=V // 2,
        durations=(2, 4, 8),
        sigma=0.05,
        act_lens=[40, 31, 17],
        label_lens=[8, 5, 6],
        reduction="mean",
        dtype=dtype,
        tol=_LARGE_TOL[dtype],
        via_function=True,
        seed=V,
    )
    keep = {}
    run_case(case, "cuda", _cuda(case), keep=keep, ref_device="cuda")
    compare_with_kernel(case, keep["costs"].cpu(), keep["grads"].cpu(), _cpu(case))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1000, 3000])
def test_gpu_tdt_large_vocab(V, dtype):
    """TDT, durations [0, 1, 2, 3, 4], V = 1000 / 3000 tokens: as
    :func:`test_gpu_large_vocab`."""
    case = _tdt_case(
        f"tdt_large_V{V}",
        B=3,
        T=40,
        U=9,
        V=V,
        blank=0,
        durations=(0, 1, 2, 3, 4),
        sigma=0.05,
        act_lens=[40, 31, 17],
        label_lens=[8, 5, 6],
        reduction="mean",
        dtype=dtype,
        tol=_LARGE_TOL[dtype],
        via_function=True,
        seed=V,
    )
    keep = {}
    run_case(case, "cuda", _cuda(case), keep=keep)
    compare_with_kernel(case, keep["costs"].cpu(), keep["grads"].cpu(), _cpu(case))


@gpu
def test_gpu_long_float32_vs_float64():
    """T = 2000 in float32 (float32 row sums, float64 lattice) against the float64
    reference: the error must not grow with the utterance's length."""
    case = KernelCase(
        "long_T2000_f32",
        B=2,
        T=2000,
        U=12,
        V=64,
        blank=63,
        durations=(2, 4, 8),
        sigma=0.05,
        act_lens=[2000, 1500],
        label_lens=[11, 7],
        dtype=torch.float32,
        tol=dict(cost=1e-6, grad=1e-6),
    )
    run_case(case, "cuda", _cuda(case), ref_device="cuda")
    tdt = _tdt_case(
        "tdt_long_T2000_f32",
        B=2,
        T=2000,
        U=12,
        V=64,
        blank=0,
        durations=(0, 1, 2, 3, 4),
        sigma=0.05,
        act_lens=[2000, 1500],
        label_lens=[11, 7],
        dtype=torch.float32,
        tol=dict(cost=1e-6, grad=1e-6),
    )
    run_case(tdt, "cuda", _cuda(tdt))


@gpu
@pytest.mark.parametrize("family", ["multiblank", "tdt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_gradient_memory(family, dtype):
    """Forward + backward with an incoming gradient of 0.7 allocate one logits-sized
    buffer (the gradient autograd hands out) plus the float64 workspaces, nothing
    else logits-sized: no float32 copy of half logits, no second gradient."""
    from espnet_multiblank import tdt_loss
    from espnet_multiblank.loss import multiblank_rnnt_loss

    B, T, U, V = 4, 100, 20, 1000
    durs = (2, 4, 8) if family == "multiblank" else (0, 1, 2, 3, 4)
    width = V + (len(durs) if family == "tdt" else 0)
    g = torch.Generator(device="cuda").manual_seed(0)
    acts = torch.randn((B, T, U, width), device="cuda", generator=g).to(dtype)
    labels = torch.randint(4, V, (B, U - 1), device="cuda", generator=g)
    tl = torch.full((B,), T, device="cuda")
    ll = torch.full((B,), U - 1, device="cuda")
    x = acts.requires_grad_(True)

    def run():
        if family == "multiblank":
            loss = multiblank_rnnt_loss(
                x, labels, tl, ll, 0 + len(durs), durs, "mean", backend="numba"
            )
        else:
            loss = tdt_loss(
                x, labels, tl, ll, 0, durs, reduction="mean", backend="numba"
            )
        (loss * 0.7).backward()

    run()  # compile, warm the caching allocator
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    grad_bytes = x.numel() * x.element_size()
    n = len(durs)
    ws = B * T * U * 8 * (n + 6)  # denom(s), lpw, alphas, betas (launch docstrings)
    assert x.grad.dtype == dtype
    assert peak <= grad_bytes + ws + (1 << 20), (peak, grad_bytes, ws)


@gpu
def test_gpu_tdt_api_vs_cpu():
    """tdt_loss on CUDA (float32, float16) vs the CPU kernel on the same values,
    V = 1000 (several strides of the row kernels), durations [0, 1, 2, 3, 4]."""
    from espnet_multiblank import tdt_loss

    g = torch.Generator().manual_seed(3)
    B, T, U, V, durs = 3, 40, 9, 1000, [0, 1, 2, 3, 4]
    acts = torch.randn(B, T, U, V + len(durs), generator=g)
    labels = torch.randint(1, V, (B, U - 1), generator=g)
    tl, ll = torch.tensor([40, 31, 17]), torch.tensor([8, 5, 6])
    kw = dict(blank=0, durations=durs, reduction="sum", sigma=0.05)
    x_cpu = acts.clone().requires_grad_(True)
    ref = tdt_loss(x_cpu, labels, tl, ll, backend="numba", **kw)
    ref.backward()
    for dtype, tol in [(torch.float32, 1e-5), (torch.float16, 2e-3)]:
        x = acts.to(dtype).cuda().requires_grad_(True)
        loss = tdt_loss(x, labels.cuda(), tl.cuda(), ll.cuda(), backend="numba", **kw)
        loss.backward()
        assert x.grad.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(loss.cpu(), ref.detach(), rtol=tol, atol=tol)
            torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, rtol=tol, atol=tol)
        else:  # the half logits differ from the float32 ones: compare loosely
            assert abs(float(loss) - float(ref)) <= 2e-3 * abs(float(ref))
            assert float((x.grad.float().cpu() - x_cpu.grad).abs().max()) < 5e-3


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_half_via_api(dtype):
    from espnet_multiblank.loss import multiblank_rnnt_loss

    case = KernelCase(
        "half",
        B=3,
        T=20,
        U=6,
        V=32,
        blank=3,
        durations=(2, 4, 8),
        sigma=0.05,
        act_lens=[20, 13, 7],
        label_lens=[5, 3, 2],
    )
    acts, labels, tl, ll, opts = make_inputs(case, "cuda")
    x = acts.to(dtype).requires_grad_(True)
    loss = multiblank_rnnt_loss(
        x, labels, tl, ll, 3, (2, 4, 8), "none", sigma=0.05, backend="numba"
    )
    loss.sum().backward()
    assert x.grad.dtype == dtype
    # oracle on exactly the values the kernel saw (the half logits upcast)
    ref_c, ref_g = reference(
        x.detach().double(), labels, tl, ll, opts, torch.ones(3, dtype=torch.float64)
    )
    torch.testing.assert_close(loss.double().cpu(), ref_c, rtol=1e-5, atol=1e-4)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-3  # the gradient is stored in half
    torch.testing.assert_close(x.grad.double().cpu(), ref_g, rtol=tol, atol=tol)


@gpu
def test_gpu_more_than_1023_labels():
    """U = 1100 > 1023, and anti-diagonals of 1040 > 1024 cells (thread strides)."""
    case = KernelCase(
        "long_labels",
        B=2,
        T=1040,
        U=1100,
        V=8,
        blank=2,
        durations=(2,),
        act_lens=[1040, 900],
        label_lens=[1099, 1030],
        dtype=torch.float64,
        tol=dict(cost=1e-9, grad=1e-9),
    )
    run_case(case, "cuda", _cuda(case), ref_device="cuda")  # float64 oracle on the GPU


@gpu
def test_gpu_T3000():
    case = KernelCase(
        "long_T",
        B=2,
        T=3000,
        U=5,
        V=16,
        blank=3,
        durations=(2, 4, 8),
        sigma=0.05,
        act_lens=[3000, 2111],
        label_lens=[4, 2],
        dtype=torch.float64,
        tol=dict(cost=1e-9, grad=1e-9),
    )
    run_case(case, "cuda", _cuda(case), ref_device="cuda")  # float64 oracle on the GPU


@gpu
def test_gpu_side_stream_and_no_torch_sync():
    """Runs on torch's current (non-default) stream; torch makes no host sync."""
    from espnet_multiblank.loss.cuda import compute

    case = KernelCase(
        "stream",
        B=4,
        T=30,
        U=8,
        V=64,
        blank=3,
        durations=(2, 4),
        sigma=0.05,
        dtype=torch.float32,
    )
    acts, labels, tl, ll, opts = make_inputs(case, "cuda")
    w = torch.ones(4, device="cuda")
    c0, g0 = compute(acts, labels, tl, ll, opts, w, True)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda.set_sync_debug_mode("error")
        try:
            c1, g1 = compute(acts, labels, tl, ll, opts, w, True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        d = (g1 - g0).abs().max() + (
            c1 - c0
        ).abs().max()  # queued on s after the kernels
    torch.cuda.current_stream().wait_stream(s)
    assert float(d) == 0.0


@gpu
def test_gpu_matches_espnet_numba():
    """ESPnet's CUDA MultiblankRNNTLossNumba (same big-blank layout) as an oracle."""
    try:
        from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import (
            MultiblankRNNTLossNumba as EspnetLoss,
        )
    except Exception as e:
        pytest.skip(f"espnet2 not importable: {e}")
    from espnet_multiblank.loss import multiblank_rnnt_loss

    B, T, U, V = 3, 40, 10, 64
    g = torch.Generator().manual_seed(1)
    acts = torch.randn(B, T, U, V, generator=g).cuda()
    labels = torch.randint(4, V, (B, U - 1), generator=g).cuda()
    tl = torch.full((B,), T, dtype=torch.int64, device="cuda")
    ll = torch.full((B,), U - 1, dtype=torch.int64, device="cuda")
    x1 = acts.clone().requires_grad_(True)
    ours = multiblank_rnnt_loss(
        x1, labels, tl, ll, 3, [2, 4, 8], "sum", sigma=0.05, backend="numba"
    )
    ours.backward()
    x2 = acts.clone().requires_grad_(True)
    theirs = EspnetLoss(3, [2, 4, 8], reduction="sum", sigma=0.05)(
        x2, labels.int(), tl.int(), ll.int()
    )
    theirs.sum().backward()
    torch.testing.assert_close(
        ours.double(), theirs.double().reshape(()), rtol=1e-5, atol=1e-3
    )
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-5)


@gpu
def test_gpu_numba_backend_forward_only():
    from espnet_multiblank.loss import multiblank_rnnt_loss

    case = KernelCase("fwd", B=2, T=7, U=4, V=10, blank=2, durations=(2,))
    acts, labels, tl, ll, opts = make_inputs(case, "cuda")
    with torch.no_grad():
        c = multiblank_rnnt_loss(acts, labels, tl, ll, 2, (2,), "none", backend="numba")
    ref_c, _ = reference(acts, labels, tl, ll, opts, torch.ones(2, dtype=torch.float64))
    assert torch.allclose(c.cpu(), ref_c, rtol=1e-10, atol=1e-10)
    assert math.isfinite(float(c.sum()))


def _compile_without_simulator(*args: str) -> subprocess.CompletedProcess:
    """``python args`` in the repository, with Numba's real CUDA compiler (the
    simulator switched off); skips the test without numba-cuda, or when the script
    exits with 3 (no NVVM to compile with)."""
    if not devices.numba_cuda_installed():
        pytest.skip("numba-cuda is not installed (pip install numba-cuda)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, *args],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode == 3:
        pytest.skip(f"no NVVM to compile with: {out.stdout.strip()[-300:]}")
    return out


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """The kernels pass Numba's real CUDA compiler (PTX for sm_90), no GPU needed."""
    out = _compile_without_simulator(
        os.path.join(_HERE, "helpers", "cuda_ptx_check.py")
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (
        out.stdout[-3000:] + out.stderr[-3000:]
    )


_WITHOUT_ROW_STACK = """
import sys
import numpy as np
del np.row_stack  # as NumPy >= 2.5 has it
if sys.argv[1] == "ours":
    import espnet_multiblank.loss.cuda.launch  # noqa: F401
from numba import cuda, types
def kernel(x):  # any kernel will do
    x[0] = 1.0
try:
    cuda.compile_ptx(kernel, (types.float32[:],), cc=(9, 0))
except Exception as e:  # missing NVVM and the row_stack failure look different
    print(type(e).__name__, e)
    sys.exit(3 if "NVVM" in str(e) or "libnvvm" in str(e).lower() else 1)
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.parametrize("first_import", ["ours", "numba_alone"])
def test_kernels_compile_where_numpy_has_no_row_stack(first_import):
    """numba-cuda <= 0.30.4 overloads ``numpy.row_stack`` at its first compile, which
    NumPy 2.5 removed: every compile fails there (seen on a GPU machine). Once the
    CUDA backend is imported the compile works; without it, it fails (the check
    reproduces the failure, so it can tell)."""
    out = _compile_without_simulator("-c", _WITHOUT_ROW_STACK, first_import)
    if first_import == "ours":
        assert out.returncode == 0 and out.stdout.strip() == "compiled", (
            out.stdout[-2000:] + out.stderr[-2000:]
        )
    else:
        assert out.returncode == 1 and "row_stack" in out.stdout, (
            out.stdout[-2000:] + out.stderr[-2000:]
        )
