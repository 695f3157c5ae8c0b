"""Compile the fused loss's Triton tile kernels for a Hopper GPU (sm_90) without a GPU.

Triton's interpreter (what CI runs the kernels in) executes them as numpy code, so it
cannot catch what only the compiler rejects (types, a constexpr branch it never takes,
libdevice calls) nor what the compiled code costs (registers, spills). This module
records the launches :class:`~espnet_multiblank.fused.triton_tile_ops.TritonTileOps`
makes for a tile (the real launch code, with the kernels swapped for recorders: the
exact arguments, constexprs and warps a GPU gets), compiles each with
``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (Triton brings its own
``ptxas``: a cubin comes out) and reads ``ptxas -v``'s registers and spill bytes
(float32 kernels must not spill).

Used by ``test/test_fused_triton.py``; ``python test/helpers/triton_sm90.py`` prints
the table.
"""

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))  # the repository root


@dataclass
class Launch:
    """One recorded launch: the kernel, its positional and keyword arguments."""

    name: str
    kernel: object
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for ``triton_kernels``: ``kernel[grid](...)`` records the call."""

    def __init__(self, module, out: List[Launch]):
        self._module = module
        self._out = out

    def __getattr__(self, name):
        kernel = getattr(self._module, name)
        out = self._out

        class _Grid:
            def __getitem__(self, grid):
                def call(*args, **kwargs):
                    out.append(Launch(name, kernel, args, kwargs))

                return call

        return _Grid()


def record_launches(lattice: str, dtype_name: str, V: int, J: int, clamp: float):
    """The four launches of one tile (gather, extract, apply, scatter) of a small
    batch, made by the real launch code on CPU tensors (nothing runs)."""
    import numpy as np
    import torch

    from espnet_multiblank.fused import triton_kernels
    from espnet_multiblank.fused.loss_package import family_of
    from espnet_multiblank.fused.planes import lattice_grid, new_planes
    from espnet_multiblank.fused.tiling import Tiling
    from espnet_multiblank.fused.triton_tile_ops import TritonTileOps
    from espnet_multiblank.loss.options import make_options, make_tdt_options

    dtype = getattr(torch, dtype_name)
    if lattice == "tdt":
        opts = make_tdt_options(0, (0, 1, 2, 3, 4), "mean", 0.05, 0.0, 0.1, clamp)
    elif lattice == "multiblank":
        opts = make_options(V - 1, (2, 4, 8), "mean", 0.1, clamp, 0.05)
    else:
        opts = make_options(0, (), "mean", 0.0, clamp, 0.0)
    layout = family_of(opts).layout(opts)
    Vp = V + layout.num_durations
    B, T, U = 2, 6, 4
    act_lens = torch.tensor([6, 4])
    label_lens = torch.tensor([3, 2])
    al, ll = act_lens.numpy(), label_lens.numpy()
    tiling = Tiling.create(T, U, al, ll, 1 << 20)
    grid = lattice_grid(al, ll)
    labels = torch.ones((B, U - 1), dtype=torch.int64)
    ops = TritonTileOps(opts, layout, tiling, labels, act_lens, label_lens, Vp, grid)
    launches: List[Launch] = []
    ops.kernels = _Recorder(triton_kernels, launches)
    index = ops.index(0, tiling.num_rows)
    R = tiling.num_rows
    enc2d = torch.zeros((B * T, J), dtype=dtype)
    pred2d = torch.zeros((B * U, J), dtype=dtype)
    pre = torch.zeros((R, J), dtype=dtype)
    z = torch.zeros((R, Vp), dtype=dtype)
    planes = new_planes(layout, B, grid[0], grid[1], torch.device("cpu"))
    planes = planes.__class__(
        planes.rows, planes.lse, torch.from_numpy(np.zeros(B, np.int32))
    )
    ops.gather(enc2d, pred2d, index, pre)
    ops.extract(z, index, planes)
    ops.apply(z, index, planes, torch.ones(B, dtype=torch.float64))
    ops.scatter(pre, index, enc2d, pred2d)
    return launches


def _type_of(param, value) -> str:
    from triton.runtime.jit import mangle_type

    annotation = param.annotation_type
    if annotation:
        return annotation
    return mangle_type(value)


def compile_sm90(launch: Launch):
    """The compiled kernel of ``launch`` for sm_90 (``triton.compile``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = launch.kernel
    names = kernel.arg_names
    values = dict(zip(names, launch.args))
    values.update({k: v for k, v in launch.kwargs.items() if k in names})
    signature, constexprs = {}, {}
    for param in kernel.params:
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        else:
            signature[param.name] = _type_of(param, value)
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    options = {"num_warps": launch.kwargs.get("num_warps", 4)}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def ptxas_report(ptx: str) -> Dict[str, int]:
    """``ptxas -v`` on ``ptx`` for sm_90: registers and spill bytes."""
    import triton

    ptxas = triton.knobs.nvidia.ptxas.path
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
            capture_output=True,
            text=True,
        )
    if out.returncode:
        raise RuntimeError(f"ptxas failed: {out.stderr[-2000:]}")
    out = out.stderr
    regs = re.search(r"Used (\d+) registers", out)
    stores = re.search(r"(\d+) bytes spill stores", out)
    loads = re.search(r"(\d+) bytes spill loads", out)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "spill_stores": int(stores.group(1)) if stores else 0,
        "spill_loads": int(loads.group(1)) if loads else 0,
    }


#: what a GPU compiles: every lattice in float32 at the issue's V (1024, 5000: the
#: same blocks) with the clamp on for one of them, float64 for the TDT (the
#: duration part and float64 tiles)
CONFIGS = [
    ("standard", "float32", 1024, 320, 0.0),
    ("multiblank", "float32", 5000, 320, 0.5),
    ("tdt", "float32", 1024, 320, 0.0),
    ("tdt", "float64", 1024, 320, 0.5),
]


def check_all(verbose: bool = False):
    """Compile every kernel of every config; (rows of the table, problems)."""
    rows, problems = [], []
    seen = set()
    for config in CONFIGS:
        for launch in record_launches(*config):
            key = (launch.name, config[0] if "rows" in launch.name else "", config[1])
            if key in seen:
                continue
            seen.add(key)
            compiled = compile_sm90(launch)
            rep = ptxas_report(compiled.asm["ptx"])
            rows.append((launch.name, config, rep))
            # float32 is what training runs; float64 (the tests' oracle dtype) may
            # spill a few bytes
            spills = rep["spill_stores"] + rep["spill_loads"]
            if spills and config[1] == "float32":
                problems.append(f"{launch.name} {config}: spills {rep}")
            if verbose:
                print(launch.name, config, rep)
    return rows, problems


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    _, problems = check_all(verbose=True)
    print("\n".join(problems) or "no spills")
    sys.exit(1 if problems else 0)
