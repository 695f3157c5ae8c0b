"""The fused joint + loss never holds a (B, T, U, V) tensor: peak memory of a
training step at a shape whose logits take 99 MB (CPU), and on a real GPU (skipped
without one) at a shape whose logits take 512 MB.

A subprocess (one torch thread) warms the code up on a small batch (Numba kernels
loaded, allocator pools), builds the inputs, resets its peak RSS (``echo 5 >
/proc/self/clear_refs``), runs forward + backward of the fused loss and reports the
peak RSS above the RSS before the step; then does the same for the dense path
(materialised logits + the dense loss) as a control: the measurement must see the
dense step's logits, or it could not catch a fused step that made them.
"""

import json
import os
import subprocess
import sys

import devices
import pytest
import torch

_PROBE = r"""
import json, sys
import torch
from espnet_multiblank import fused_transducer_loss, multiblank_rnnt_loss, tdt_loss

def kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

kind, dtype = sys.argv[1], getattr(torch, sys.argv[2])
torch.set_num_threads(1)
opts = {
    "standard": dict(blank=0),
    "multiblank": dict(blank=3, big_blank_durations=(2, 4, 8)),
    "tdt": dict(blank=0, tdt_durations=(0, 1, 2, 3, 4)),
}[kind]
D = 5 if kind == "tdt" else 0

def inputs(B, T, U, J, V):
    gen = torch.Generator().manual_seed(0)
    enc = torch.randn(B, T, J, generator=gen).to(dtype).requires_grad_(True)
    pred = torch.randn(B, U, J, generator=gen).to(dtype).requires_grad_(True)
    w = (torch.randn(V + D, J, generator=gen) / J**0.5).to(dtype).requires_grad_(True)
    b = torch.zeros(V + D).to(dtype).requires_grad_(True)
    labels = torch.randint(4, V, (B, U - 1), generator=gen)
    return enc, pred, w, b, labels, torch.full((B,), T), torch.full((B,), U - 1)

def fused(x):
    return fused_transducer_loss(*x, reduction="mean", **opts) * 0.7

def dense(x):
    enc, pred, w, b, labels, al, ll = x
    z = torch.tanh(enc[:, :, None] + pred[:, None]) @ w.t() + b
    if D:
        loss = tdt_loss(z, labels, al, ll, durations=opts["tdt_durations"], blank=0)
    else:
        loss = multiblank_rnnt_loss(z, labels, al, ll, **opts)
    return loss * 0.7

def peak_mb(step, x):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM)
    before = kb("VmRSS")
    step(x).backward()
    return (kb("VmHWM") - before) / 1024.0

small = inputs(2, 9, 4, 16, 50)
fused(small).backward(); dense(small).backward()
B, T, U, J, V = 4, 100, 31, 64, 2000
x = inputs(B, T, U, J, V)
out = {"fused_mb": peak_mb(fused, x)}
x = inputs(B, T, U, J, V)
out["dense_mb"] = peak_mb(dense, x)
size = torch.empty((), dtype=dtype).element_size()
out["logits_mb"] = B * T * U * (V + D) * size / 2**20
print(json.dumps(out))
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
    "kind,dtype",
    [
        ("standard", "float32"),
        ("multiblank", "float32"),
        ("tdt", "float32"),
        ("standard", "bfloat16"),
    ],
)
def test_fused_step_peak_memory(kind, dtype):
    """Peak memory above the inputs stays under 30 MB (tiles of 4 MiB, planes of
    about 1 MB, the small gradients) where the logits alone take 99 MB (49 MB in
    bfloat16), and the dense control step is seen to hold them."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, kind, dtype],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(here),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["dense_mb"] > res["logits_mb"], res  # the probe sees logits
    assert res["fused_mb"] < min(30.0, 0.5 * res["logits_mb"]), res


@devices.gpu
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
