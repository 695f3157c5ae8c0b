"""Compile the CUDA kernels for a Hopper GPU (sm_90) without any GPU.

The simulator runs the kernels as Python and so cannot catch what only Numba's CUDA
compiler rejects (typing, literal shared-array sizes, unsupported casts), nor show
what the compiled code looks like. This script compiles every kernel with exactly
the argument types ``launch.py`` passes (C-contiguous arrays;
Python ints -> int64, floats -> float64) for the four logits storages (bfloat16 as
int16 bits), two duration sets each and the row layouts a GPU uses for V = 64, 1000
and 32000, and checks the PTX:

* no local memory (``.local``: the chunk registers and per-row arrays must stay in
  registers once the loops are unrolled);
* the row kernels' chunk loop (the PTX loop with the most loads of the logits'
  width) issues at least ``unroll`` of them before its first store or barrier
  (so that they can all be in flight at once; the compiler would have to keep a
  load behind an earlier store to a possibly aliasing address);
* for float32 / float16 / bfloat16 logits that loop does no float64 arithmetic (the
  per-row float64 work is outside it).

When ``ptxas`` (CUDA toolkit) is on PATH, each PTX is also assembled for sm_90 with
``-v`` and the registers, spill bytes and shared memory per kernel are printed;
spills fail the check. It needs NVVM (``numba-cuda[cu13]`` or ``[cu12]`` brings it);
exit code 3 when NVVM is missing. Run by ``test/test_loss_cuda.py`` in a
subprocess (no simulator there).

Usage: python test/helpers/cuda_ptx_check.py [--verbose]
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)

from numba import cuda, types  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))  # the repository root

from espnet_multiblank.lattice import MultiblankLattice, TDTLattice  # noqa: E402
from espnet_multiblank.loss.cuda.kernels import get_kernels  # noqa: E402
from espnet_multiblank.loss.cuda.launch import gpu_row_config  # noqa: E402
from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_kernels  # noqa: E402

# storage -> (numba type of the logits array elements, of the costs)
STORAGE_TYPES = {
    "float64": (types.float64, types.float64),
    "float32": (types.float32, types.float32),
    "float16": (types.float16, types.float32),
    "bfloat16": (types.int16, types.float32),
}
LOAD_WIDTH = {"float64": "f64", "float32": "f32", "float16": "u16", "bfloat16": "u16"}


def signatures(storage):
    EL, CO = STORAGE_TYPES[storage]
    A4 = EL[:, :, :, ::1]
    W3 = types.float64[:, :, ::1]
    W4 = types.float64[:, :, :, ::1]
    I2, I1 = types.int64[:, ::1], types.int64[::1]
    L1 = types.float64[::1]
    i64, f64 = types.int64, types.float64
    return {
        "row_stats": (A4, I2, I1, I1, i64, f64, W3, W4),
        "alpha_beta": (W4, I1, I1, f64, i64, W3, W3, L1, CO[::1]),
        "weights": (W4, I1, I1, W3, W3, L1),
        "grad": (A4, I2, I1, I1, i64, i64, f64, f64, L1, W3, W4, L1, A4),
    }


def tdt_signatures(storage):
    EL, CO = STORAGE_TYPES[storage]
    A4 = EL[:, :, :, ::1]
    W3 = types.float64[:, :, ::1]
    W4 = types.float64[:, :, :, ::1]
    I2, I1 = types.int64[:, ::1], types.int64[::1]
    B1, L1 = types.int32[::1], types.float64[::1]
    i64, f64 = types.int64, types.float64
    return {
        "row_stats": (A4, I2, I1, I1, i64, i64, f64, W4, W4, B1),
        "alpha_beta": (W4, I1, I1, B1, f64, i64, W3, W3, L1, CO[::1]),
        "weights": (W4, I1, I1, W3, W3, L1),
        "grad": (A4, I2, I1, I1, i64, i64, f64, f64, L1, W4, W4, L1, A4),
    }


def ptxas_info(ptx: str):
    """{'registers', 'spill_stores', 'spill_loads', 'smem'} from ``ptxas -v``, or
    None when ptxas is not installed."""
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [exe, "-arch=sm_90", "-v", path, "-o", os.devnull],
            capture_output=True,
            text=True,
        )
    if out.returncode != 0:
        raise RuntimeError(f"ptxas failed: {out.stderr[-2000:]}")
    text = out.stderr

    def grab(pattern, default=0):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else default

    return dict(
        registers=grab(r"Used (\d+) registers"),
        spill_stores=grab(r"(\d+) bytes spill stores"),
        spill_loads=grab(r"(\d+) bytes spill loads"),
        smem=grab(r"(\d+) bytes smem"),
    )


def loops(ptx: str):
    """The bodies (PTX text) of the loops: from a label to a later branch back to
    it."""
    lines = ptx.splitlines()
    where = {}
    for i, ln in enumerate(lines):
        m = re.match(r"^(\$L\w+):", ln.strip())
        if m:
            where[m.group(1)] = i
    bodies = []
    for i, ln in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L\w+);", ln)
        if m and where.get(m.group(1), i) < i:
            bodies.append("\n".join(lines[where[m.group(1)] : i + 1]))
    return bodies


def check_kernel(label, kernel, sig, storage, unroll, row_kernel, failures, verbose):
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    info = ptxas_info(ptx)
    notes = []
    if ".local" in ptx:
        failures.append(f"{label}: local memory in the PTX")
        notes.append("LOCAL MEMORY")
    if row_kernel:
        # the chunk loop: the loop with the most loads of the logits' width
        pat = rf"ld\.global(?:\.nc)?\.{LOAD_WIDTH[storage]}\b"
        body = max(loops(ptx), key=lambda x: len(re.findall(pat, x)), default="")
        n_loads = len(re.findall(pat, body))
        notes.append(f"chunk loop: {n_loads} loads")
        if n_loads < unroll:
            failures.append(f"{label}: {n_loads} loads in the chunk loop < {unroll}")
        # all `unroll` of them issued before the loop's first store or barrier (the
        # compiler may sink a load into the block that uses it, past a
        # data-independent branch; it may not put one behind a store)
        lines = body.splitlines()
        idx = [i for i, ln in enumerate(lines) if re.search(pat, ln)]
        stops = [
            i for i, ln in enumerate(lines) if re.search(r"st\.global|bar\.sync", ln)
        ]
        before = len([i for i in idx if not stops or i < stops[0]])
        if before < unroll:
            failures.append(
                f"{label}: {before} loads before the first store < {unroll}"
            )
        notes.append(f"{before} before the first store")
        if storage != "float64":
            f64_ops = [
                ln.strip()
                for ln in body.splitlines()
                if re.search(r"\.f64\b", ln) and not re.search(r"\b(ld|st|mov)\.", ln)
            ]
            notes.append(f"{len(f64_ops)} f64 ops")
            if f64_ops:
                failures.append(f"{label}: float64 work in the chunk loop {f64_ops}")
    if info is not None:
        notes.append(
            f"{info['registers']} regs, spill {info['spill_stores']}/"
            f"{info['spill_loads']} B, smem {info['smem']} B"
        )
        if info["spill_stores"] or info["spill_loads"]:
            failures.append(f"{label}: register spills {info}")
    print(f"{label}: {ptx.count(chr(10))} PTX lines; " + "; ".join(notes))
    if verbose:
        print(ptx)


def main(argv):
    verbose = "--verbose" in argv
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as e:
        print(f"NVVM not available: {e}")
        return 3
    if shutil.which("ptxas") is None:
        print("ptxas not on PATH: registers / spills not reported")
    failures = []
    # every storage with the layout of V = 1000; the layouts of V = 64 (16 rows per
    # block) and V = 32000 (several chunks per thread) for float32 and bfloat16
    small, mid, big = (gpu_row_config(V) for V in (64, 1000, 32000))
    jobs = [(s, mid, True) for s in ("float32", "bfloat16", "float16", "float64")]
    jobs += [(s, cfg, False) for s in ("float32", "bfloat16") for cfg in (small, big)]
    names = ("row_stats", "alpha_beta", "weights", "grad")
    for storage, cfg, with_dp in jobs:
        for family, durations_sets in (
            ("mb", ((2, 4, 8), ())),
            ("tdt", ((0, 1, 2, 3, 4), (2, 1))),
        ):
            for durations in durations_sets:
                if family == "mb":
                    lattice = MultiblankLattice.create(len(durations), durations)
                    kernels = dict(zip(names, get_kernels(storage, lattice, cfg)))
                    sigs = signatures(storage)
                else:
                    lattice = TDTLattice.create(0, durations)
                    kernels = dict(zip(names, get_tdt_kernels(storage, lattice, cfg)))
                    sigs = tdt_signatures(storage)
                for name, sig in sigs.items():
                    if name in ("alpha_beta", "weights") and not with_dp:
                        continue  # the DP kernels do not depend on the row layout
                    check_kernel(
                        f"{family} {storage} {durations} {cfg} {name}",
                        kernels[name],
                        sig,
                        storage,
                        cfg[2],
                        name in ("row_stats", "grad"),
                        failures,
                        verbose,
                    )
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
