"""The fix for Numba's CUDA simulator (``helpers/simulator_fixes.py``), in the
simulator: every thread of a block gets the same shared array, even when the
allocation is slow enough for the threads to interleave in it."""

import time

import devices
import numpy as np
import pytest


@pytest.mark.parametrize("device", devices.params("sim"))
def test_a_block_shares_one_shared_array(device, monkeypatch):
    global cuda  # the simulator swaps module globals named cuda, not locals
    from numba import cuda
    from numba.cuda.simulator import kernelapi

    # widen the window between the simulator's look-up and its store: without the
    # fix, most threads then allocate an array of their own
    real_np = kernelapi.np

    class SlowEmpty:
        def __getattr__(self, name):
            return getattr(real_np, name)

        @staticmethod
        def empty(*args, **kwargs):
            time.sleep(0.002)
            return real_np.empty(*args, **kwargs)

    monkeypatch.setattr(kernelapi, "np", SlowEmpty())
    n = 16

    @cuda.jit
    def block_sum(out):
        sm = cuda.shared.array(16, np.float64)
        tid = cuda.threadIdx.x
        sm[tid] = tid + 1.0
        cuda.syncthreads()
        total = 0.0
        for i in range(16):
            total += sm[i]
        out[tid] = total

    out = np.zeros(n)
    block_sum[1, n](out)
    assert out.tolist() == [n * (n + 1) / 2] * n
