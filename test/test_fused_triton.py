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


def _per_tile(row, pass_):
    small = row["small"]
    phase = small["phases"][f"{pass_} tiles"]
    tiles = small["tiles"][pass_]
    return sum(phase["launches"].values()) / tiles, len(phase["syncs"]) / tiles


@pytest.mark.slow
def test_launches_and_syncs_of_a_step(tmp_path):
    """bench/fused_profile.py's counts (the CUDA paths run in the simulator and the
    interpreter, a TDT batch of many tiles): the Triton path launches 4 kernels a
    tile in forward and 10 in backward (2 of them Triton's; the matmuls, the
    activation and its derivative, the bias gradient's sum torch's) and waits for
    the device 4 times a step, never in a tile; the torch tile operations, the
    control that the counters see them, launch tens a tile and wait 8 times."""
    out = tmp_path / "profile.json"
    script = os.path.join(os.path.dirname(HERE), "bench", "fused_profile.py")
    args = ["--paths", "triton,torch-tiles", "--lattices", "tdt", "--tile-shape", ""]
    res = subprocess.run(
        [sys.executable, script, *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    import json

    rows = {r["path"]: r for r in json.loads(out.read_text())["rows"]}
    new, old = rows["triton"], rows["torch-tiles"]
    assert new["small"]["tiles"]["forward"] >= 5  # many tiles: per-tile counts
    assert _per_tile(new, "forward") == (4, 0)
    assert _per_tile(new, "backward") == (10, 0)
    syncs = [s for p in new["small"]["phases"].values() for s in p["syncs"]]
    assert len(syncs) == 4, syncs
    assert _per_tile(old, "forward")[0] > 30 and _per_tile(old, "backward")[0] > 30
    old_syncs = [s for p in old["small"]["phases"].values() for s in p["syncs"]]
    assert len(old_syncs) == 8, old_syncs


@devices.gpu
@pytest.mark.parametrize("V", [1024, 5000])
@pytest.mark.parametrize("kind", sorted(fc.LATTICES))
def test_gpu_paths_agree_at_the_issue_width(kind, V):
    """On a GPU, at the issue's joint width and vocabularies (the GPU's blocks: one
    chunk of 1024 logits, or five with a partial last one), the Triton tile kernels,
    the torch tile operations and the dense float64 path give the same costs and
    gradients (float32 inputs)."""
    case = fc.LATTICES[kind](
        act_lens=(40, 33),
        label_lens=(12, 7),
        T=40,
        U=13,
        J=320,
        V=V,
        sigma=0.05,
        fastemit_lambda=0.05,
    )
    inputs = fc.make_inputs(case, torch.float32, device="cuda")
    want = fc.dense_loss(case, inputs, "mean")
    for path in ("triton", "torch-tiles"):
        got = fc.fused_loss(case, inputs, "mean", path=path)
        fc.assert_same_results(got, want, rtol=2e-4, atol=2e-5, what=path)
