"""The fused loss's CUDA stages (torch tile operations + the Numba CUDA lattice).

1. Without a GPU: every case of ``helpers/fused_cuda_cases.py`` runs in Numba's CUDA
   simulator, in ONE subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (it must be set before
   numba.cuda is imported and must not leak into the other tests), on CPU tensors
   with the CUDA stages forced, against the CPU fused path and the dense path; the
   CUDA lattice alone against the torch planes lattice. About 10 s.
2. On a real GPU (skipped otherwise, with the reason; ``bench/gpu_check.sh`` runs
   them with ``-k test_gpu``): the same cases on CUDA tensors through the public
   function, a float32 batch against the dense CUDA path, bfloat16, and the peak
   memory of a step whose logits take 512 MB.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_CASES = os.path.join(_HERE, "helpers", "fused_cuda_cases.py")
from helpers import fused_cases as fc  # noqa: E402
from helpers.fused_cuda_cases import ALL  # noqa: E402


def _numba_cuda_importable() -> bool:
    return importlib.util.find_spec("numba_cuda") is not None


@pytest.fixture(scope="module")
def sim_results():
    if not _numba_cuda_importable():
        pytest.skip("numba-cuda is not installed (pip install numba-cuda)")
    env = dict(os.environ)
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, _CASES, "--sim"],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            records[rec["case"]] = rec
    if proc.returncode != 0 or not records:
        pytest.fail(
            f"simulator run failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    return records


CASE_NAMES = [name for name, _ in ALL]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_sim_case(sim_results, name):
    rec = sim_results.get(name)
    assert rec is not None, f"case {name} did not run"
    assert rec["ok"], rec["msg"]


# ------------------------------------------------------------------------ real GPU
_GPU = torch.cuda.is_available() and _numba_cuda_importable()
gpu = pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU and numba-cuda")


@gpu
@pytest.mark.parametrize("name", CASE_NAMES)
def test_gpu_case(name):
    dict(ALL)[name](name, "cuda")


@gpu
@pytest.mark.parametrize("kind", ["standard", "multiblank", "tdt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_matches_dense(kind, dtype):
    """A medium ragged batch on the GPU against the float64 dense path (on the GPU),
    and the CPU fused path; gradients in the input dtype."""
    case = fc.LATTICES[kind](
        act_lens=(80, 61, 17, 40),
        label_lens=(20, 9, 0, 14),
        T=80,
        U=21,
        J=64,
        V=300,
        sigma=0.05,
        fastemit_lambda=0.05,
    )
    cpu_inputs = fc.make_inputs(case, dtype)
    inputs = [None if x is None else x.cuda() for x in cpu_inputs]
    got = fc.fused_loss(case, inputs, "mean_volume")
    want = fc.dense_loss(case, inputs, "mean_volume")
    tol = 2e-4 if dtype == torch.float32 else 2.0**-8
    fc.assert_close("loss", got[0], want[0], 1e-5, 1e-5)
    for name, g, w in zip(fc.GRAD_NAMES, got[1], want[1]):
        assert g.dtype == dtype and g.is_cuda
        fc.assert_close(name, g, w, tol, 2e-5)
    cpu = fc.fused_loss(case, cpu_inputs, "mean_volume")
    for name, g, w in zip(fc.GRAD_NAMES, got[1], cpu[1]):
        fc.assert_close(name + " vs CPU", g, w, tol, 2e-5)


@gpu
def test_gpu_peak_memory():
    """Peak CUDA memory of a fused training step above its inputs stays far below
    the logits (512 MB here): the default 32 MiB tiles, the planes, the gradients."""
    from espnet_multiblank import fused_transducer_loss

    B, T, U, J, V = 8, 200, 40, 256, 2000
    gen = torch.Generator().manual_seed(0)
    enc = torch.randn(B, T, J, generator=gen).cuda().requires_grad_(True)
    pred = torch.randn(B, U, J, generator=gen).cuda().requires_grad_(True)
    w = (torch.randn(V, J, generator=gen) / J**0.5).cuda().requires_grad_(True)
    b = torch.zeros(V).cuda().requires_grad_(True)
    labels = torch.randint(1, V, (B, U - 1), generator=gen).cuda()
    al = torch.full((B,), T).cuda()
    ll = torch.full((B,), U - 1).cuda()
    args = (enc, pred, w, b, labels, al, ll)
    fused_transducer_loss(*args, blank=0).backward()  # compile, warm the allocator
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    (0.7 * fused_transducer_loss(*args, blank=0)).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    logits = B * T * U * V * 4
    assert extra < logits / 5, (extra / 2**20, logits / 2**20)
