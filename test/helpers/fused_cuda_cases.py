"""Cases of the fused loss's CUDA stages, for the CUDA simulator and a real GPU.

Run as a script (``python test/helpers/fused_cuda_cases.py --sim``) it sets
``NUMBA_ENABLE_CUDASIM=1`` before numba is imported and runs every case on CPU
tensors with the CUDA stages forced (torch tile operations + the Numba CUDA lattice
kernels, simulated), printing one JSON line per case: ``{"case": name, "ok": bool,
"msg": str}``. ``test/test_fused_cuda_sim.py`` runs it in a subprocess, so that the
simulator never leaks into other tests. On a GPU the same cases run on CUDA tensors
through the public function (:func:`run_case` with ``device="cuda"``).

Each case compares with the CPU fused path (Numba stages) and with the dense path
(float64 materialised logits + the dense loss); the lattice cases compare the CUDA
lattice alone with the torch planes lattice on random planes.
"""

import json
import os
import sys
import traceback

if __name__ == "__main__" and "--sim" in sys.argv:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba.cuda is imported

_HERE = os.path.dirname(os.path.abspath(__file__))
_TEST = os.path.dirname(_HERE)
for _p in (_TEST, os.path.dirname(_TEST)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
from helpers import fused_cases as fc  # noqa: E402
from helpers.planes_oracle import random_planes  # noqa: E402

from espnet_multiblank.fused import api  # noqa: E402
from espnet_multiblank.fused import loss_package as lp  # noqa: E402
from espnet_multiblank.fused.joint_loss import STAGES  # noqa: E402

CASES = {
    "standard": fc.standard(sigma=0.05),
    "multiblank": fc.multiblank(big=(2, 4), sigma=0.05, fastemit_lambda=0.1),
    "tdt": fc.tdt(tdt=(0, 1, 2), sigma=0.05, fastemit_lambda=0.1),
    "standard-clamp-fastemit": fc.standard(
        "c", fastemit_lambda=0.2, clamp=0.01, act_lens=(6, 0, 5), label_lens=(3, 1, 0)
    ),
    "tdt-impossible-clamp": fc.tdt(
        "i", tdt=(2, 3), clamp=0.01, act_lens=(5, 1, 4), label_lens=(2, 0, 1)
    ),
    "multiblank-float32-ragged": fc.multiblank(
        "r", big=(3, 2), act_lens=(9, 3, 7), label_lens=(0, 2, 3)
    ),
}
DTYPES = {"multiblank-float32-ragged": torch.float32}
TOL = {
    torch.float64: dict(rtol=1e-9, atol=1e-10),
    torch.float32: dict(rtol=2e-4, atol=2e-5),
}
LATTICE_CASES = {
    "lattice-standard": ("multiblank", (), (5, 3, 0), (2, 1, 1)),
    "lattice-multiblank": ("multiblank", (2, 4), (7, 4, 2), (2, 0, 1)),
    "lattice-tdt": ("tdt", (0, 1, 2, 3), (6, 4, 1), (2, 3, 0)),
    "lattice-tdt-impossible": ("tdt", (2, 3), (5, 1), (1, 0)),
}


def fused_on(case, inputs, device, reduction="mean"):
    """(loss, grads) of the fused loss with the CUDA stages: on a GPU through the
    public function; in the simulator (CPU tensors) with the stages forced."""
    params = fc.leaves(inputs)
    # tiles of 5 rows: several tiles, frames split between them
    per_row = (case.Vp + 3 * case.J) * inputs[0].element_size()
    kw = case.fused_kwargs(tile_bytes=5 * per_row)
    fo = api.make_fused_options(reduction=reduction, **kw)
    stages = STAGES["cuda"] if device == "cpu" else None
    loss = api._loss(*params, *inputs[4:], fo, stages=stages)
    g_out = fc.default_grad_out(reduction, case.B, loss.dtype).to(loss.device)
    return loss.detach(), fc._grads(loss, params, g_out)


def run_case(name, device):
    """Raise AssertionError when the CUDA stages disagree with the CPU fused path or
    the dense path."""
    case = CASES[name]
    dtype = DTYPES.get(name, torch.float64)
    cpu_inputs = fc.make_inputs(case, dtype)
    inputs = [None if x is None else x.to(device) for x in cpu_inputs]
    for reduction in ("none", "mean_volume"):
        got = fused_on(case, inputs, device, reduction)
        cpu = fc.fused_loss(case, cpu_inputs, reduction)
        dense = fc.dense_loss(case, cpu_inputs, reduction)
        fc.assert_same_results(got, cpu, **TOL[dtype], what=f"{reduction} vs CPU")
        fc.assert_same_results(got, dense, **TOL[dtype], what=f"{reduction} vs dense")


def run_lattice_case(name, device):
    """The CUDA lattice alone against the torch planes lattice on random planes."""
    kind, durations, act_lens, label_lens = LATTICE_CASES[name]
    if kind == "tdt":
        opts = lp.make_tdt_options(0, durations, fastemit_lambda=0.2)
    else:
        opts = lp.make_options(len(durations), durations, fastemit_lambda=0.2)
    T, U = max(act_lens), max(label_lens) + 1
    rows = random_planes(opts, act_lens, label_lens, T, U, seed=1)
    al, ll = torch.tensor(act_lens), torch.tensor(label_lens)
    want_rows = rows.clone()
    want = lp.run_lattice_torch(opts, want_rows, al, ll, True)
    got_rows = rows.to(device)
    got = lp.run_lattice_cuda(opts, got_rows, al.to(device), ll.to(device), True)
    got, got_rows = got.cpu(), got_rows.cpu()
    assert torch.equal(torch.isfinite(got), torch.isfinite(want)), (got, want)
    ok = torch.isfinite(want)
    assert torch.allclose(got[ok], want[ok], rtol=1e-12, atol=1e-12), (got, want)
    t = torch.arange(T).view(1, T, 1)
    u = torch.arange(U).view(1, 1, U)
    valid = (t < al.view(-1, 1, 1)) & (u <= ll.view(-1, 1, 1)) & ok.view(-1, 1, 1)
    assert torch.allclose(got_rows[valid], want_rows[valid], rtol=1e-10, atol=1e-12)


ALL = [(n, run_case) for n in CASES] + [(n, run_lattice_case) for n in LATTICE_CASES]


def main():
    device = "cpu" if "--sim" in sys.argv else "cuda"
    only = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
    for name, run in ALL:
        if only and only not in name:
            continue
        try:
            run(name, device)
            rec = {"case": name, "ok": True, "msg": ""}
        except Exception:  # report every case, whatever goes wrong
            rec = {"case": name, "ok": False, "msg": traceback.format_exc()[-3000:]}
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
