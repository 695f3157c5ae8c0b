"""The fused loss's Triton tile kernels beyond the bodies of test_fused_loss.py:
compiled for a Hopper GPU without one, and other block sizes in the interpreter.

* ``helpers/triton_sm90.py`` in a subprocess (no ``TRITON_INTERPRET``): every kernel
  with the arguments the launch code passes compiles for sm_90a (Triton's own
  ``ptxas``), and the float32 kernels do not spill;
* in the CUDA simulator's subprocess (Triton's interpreter, ``conftest.py``): block
  sizes other than the interpreter's tiny ones (a whole row in one chunk with rows
  past the tile's end; one row per program; the GPU's blocks) give the dense path's
  results.
"""

import os
import subprocess
import sys

import devices
import pytest
import torch
from helpers import fused_cases as fc

HERE = os.path.dirname(os.path.abspath(__file__))


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "helpers", "triton_sm90.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert out.stdout.count("registers") >= 12, out.stdout  # every kernel compiled


BLOCKS = {
    "one-chunk": dict(rows=8, vocab=16, rows_j=8, width=16, warps=4),
    "row-per-program": dict(rows=1, vocab=8, rows_j=1, width=8, warps=4),
    "gpu": None,  # gpu_blocks(V, J, itemsize)
}


@pytest.mark.parametrize("device", devices.params("sim"))
@pytest.mark.parametrize("blocks", sorted(BLOCKS))
@pytest.mark.parametrize("kind", sorted(fc.LATTICES))
def test_block_sizes(kind, blocks, device, monkeypatch):
    from espnet_multiblank.fused import triton_tile_ops as tto

    if BLOCKS[blocks] is None:
        monkeypatch.setattr(tto, "blocks_for", tto.gpu_blocks)
    else:
        monkeypatch.setattr(tto, "BLOCKS_OVERRIDE", tto.Blocks(**BLOCKS[blocks]))
    case = fc.LATTICES[kind](sigma=0.05, fastemit_lambda=0.1, clamp=0.3)
    inputs = fc.make_inputs(case, torch.float64)
    got = fc.fused_loss(case, inputs, "none", path="triton")
    want = fc.dense_loss(case, inputs, "none")
    fc.assert_same_results(got, want, rtol=1e-9, atol=1e-10)
