"""Compile the CUDA kernels to PTX for a Hopper GPU (sm_90) without any GPU.

The simulator runs the kernels as Python and so cannot catch what only Numba's CUDA
compiler rejects (typing, literal shared-array sizes, unsupported casts). This script
compiles each kernel with exactly the argument types ``launch.py`` and
``tdt_launch.py`` pass (C-contiguous arrays; Python ints -> int64, floats -> float64)
for both dtypes and two duration sets, multi-blank and TDT.
It needs NVVM (``numba-cuda[cu13]`` or ``[cu12]`` brings it); exit code 3 when NVVM is
missing. Run by ``test/test_loss_cuda_sim.py`` in a subprocess (no simulator there).

Usage: python test/cuda_ptx_check.py
"""

import os
import sys

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)

from numba import cuda, types  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from espnet_multiblank.lattice import MultiblankLattice, TDTLattice  # noqa: E402
from espnet_multiblank.loss.cuda.kernels import get_kernels  # noqa: E402
from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_kernels  # noqa: E402


def signatures(FT):
    A4 = FT[:, :, :, ::1]
    W3 = types.float64[:, :, ::1]
    W4 = types.float64[:, :, :, ::1]
    I2, I1 = types.int64[:, ::1], types.int64[::1]
    i64, f64 = types.int64, types.float64
    return {
        "row_stats": (A4, I2, I1, I1, i64, f64, W3, W4),
        "alpha_beta": (W4, I1, I1, f64, i64, W3, W3, types.float64[::1], FT[::1]),
        "weights": (W4, I1, I1, W3, W3, types.float64[::1]),
        "grad": (
            A4,
            I2,
            I1,
            I1,
            i64,
            f64,
            f64,
            FT[::1],
            W3,
            W4,
            types.float64[::1],
            A4,
        ),
    }


def tdt_signatures(FT):
    A4 = FT[:, :, :, ::1]
    W3 = types.float64[:, :, ::1]
    W4 = types.float64[:, :, :, ::1]
    I2, I1 = types.int64[:, ::1], types.int64[::1]
    B1, L1 = types.int32[::1], types.float64[::1]
    i64, f64 = types.int64, types.float64
    return {
        "tdt_row_stats": (A4, I2, I1, I1, i64, i64, f64, W4, W4, B1),
        "tdt_alpha_beta": (W4, I1, I1, B1, f64, i64, W3, W3, L1, FT[::1]),
        "tdt_weights": (W4, I1, I1, W3, W3, L1),
        "tdt_grad": (A4, I2, I1, I1, i64, i64, f64, f64, FT[::1], W4, W4, L1, A4),
    }


def main():
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as e:
        print(f"NVVM not available: {e}")
        return 3
    for dtype_name, durations in (("float32", (2, 4, 8)), ("float64", ())):
        lattice = MultiblankLattice.create(len(durations), durations)
        kernels = dict(
            zip(
                ("row_stats", "alpha_beta", "weights", "grad"),
                get_kernels(dtype_name, lattice, 128),
            )
        )
        for name, sig in signatures(getattr(types, dtype_name)).items():
            ptx, _ = cuda.compile_ptx(kernels[name].py_func, sig, cc=(9, 0))
            spills = ".local" in ptx
            print(
                f"{dtype_name} {durations} {name}: {ptx.count(chr(10))} PTX lines"
                f"{' (local memory!)' if spills else ''}"
            )
    for dtype_name, durations in (("float32", (0, 1, 2, 3, 4)), ("float64", (2, 1))):
        lattice = TDTLattice.create(0, durations)
        kernels = dict(
            zip(
                ("tdt_row_stats", "tdt_alpha_beta", "tdt_weights", "tdt_grad"),
                get_tdt_kernels(dtype_name, lattice, 128),
            )
        )
        for name, sig in tdt_signatures(getattr(types, dtype_name)).items():
            ptx, _ = cuda.compile_ptx(kernels[name].py_func, sig, cc=(9, 0))
            spills = ".local" in ptx
            print(
                f"{dtype_name} {durations} {name}: {ptx.count(chr(10))} PTX lines"
                f"{' (local memory!)' if spills else ''}"
            )
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
