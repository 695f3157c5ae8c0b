"""The per-tile stages as Triton kernels (``triton_kernels.py``), for CUDA tensors;
under Triton's interpreter (``TRITON_INTERPRET=1``, set before ``triton`` is first
imported) on CPU tensors, which is how the tests run them without a GPU.

The same stages and formulas as :class:`~espnet_multiblank.fused.torch_tile_ops.
TorchTileOps`, with what made that path slow on a GPU removed (``docs/fused.md``, 3,
"On a GPU"):

* one kernel launch per stage and tile (gather, extract, apply, scatter) instead of
  10-40 torch operations each;
* the packed rows' (enc row, pred row) index computed once per batch on the device
  (:func:`packed_rows`), a tile's index being a view of it: no per-tile index
  operations, and no host-to-device copy (each a stream synchronisation);
* the layout's symbols on the device once per process (:func:`device_ids`), the
  float options passed as kernel arguments.

The tile's matmuls stay torch's (cuBLAS), in ``joint_loss.py``, as for the other tile
stages, so that they run with torch's settings (TF32 or not) like the dense path's.
"""

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from espnet_multiblank.fused.planes import GRADIENT_FLUSH_BELOW, Planes
from espnet_multiblank.fused.tile_ops import TileOps
from espnet_multiblank.fused.tiling import Tiling

#: set to "1" in the environment before ``triton`` is imported: kernels run on CPU
#: tensors in Triton's interpreter
INTERPRET_ENV = "TRITON_INTERPRET"


def interpreting() -> bool:
    """Does Triton run its kernels in the interpreter (on CPU tensors)?"""
    return os.environ.get(INTERPRET_ENV, "0") not in ("", "0")


@dataclass(frozen=True)
class Blocks:
    """Block sizes of the launches (``triton_kernels.py``): ``rows`` and ``vocab``
    of the row kernels (extract, apply: rows per program, logits per chunk),
    ``rows_j`` and ``width`` of the gather and scatter kernels, and the warps per
    program."""

    rows: int
    vocab: int
    rows_j: int
    width: int
    warps: int


#: in the interpreter: tiny blocks, so that the tests' small tiles run every path of
#: the kernels (several chunks of the vocabulary, a partial last chunk, several row
#: blocks, a partial last one) quickly
INTERPRETER_BLOCKS = Blocks(rows=2, vocab=4, rows_j=2, width=4, warps=1)

#: forced for every launch (tests only), or None
BLOCKS_OVERRIDE: Optional[Blocks] = None


def _pow2_at_least(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def gpu_blocks(V: int, J: int, itemsize: int) -> Blocks:
    """A GPU's blocks: 8 KiB of the tile per program and 4 warps (16 float32 or 8
    float64 values a thread: registers to spare; bigger blocks made ptxas spill,
    ``test/helpers/triton_sm90.py``): chunks of up to 1024 logits, as many rows as
    fill the 8 KiB (more for a small vocabulary); for the gather and the scatter up
    to 128 columns of the joint width and the rows that fill the 8 KiB."""
    per_program = 8192 // itemsize
    vocab = min(1024, per_program, _pow2_at_least(max(V, 1)))
    width = min(128, _pow2_at_least(max(J, 1)))
    rows = max(1, min(32, per_program // vocab))
    return Blocks(rows, vocab, max(1, per_program // width), width, 4)


def blocks_for(V: int, J: int, itemsize: int) -> Blocks:
    """The blocks of a tile of V token logits, J joint width and ``itemsize``-byte
    values: the override, the interpreter's tiny ones, or :func:`gpu_blocks`."""
    if BLOCKS_OVERRIDE is not None:
        return BLOCKS_OVERRIDE
    if interpreting():
        return INTERPRETER_BLOCKS
    return gpu_blocks(V, J, itemsize)


def packed_rows(
    act_lens: torch.Tensor, label_lens: torch.Tensor, tiling: Tiling
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(erow, prow): (N,) int64 tensors on the lengths' device, ``erow[i] = b T + t``
    and ``prow[i] = b U + u`` of packed row i (``tiling.py``'s order), computed there
    (a dozen operations per batch; the sizes come from the host's tiling, so nothing
    waits for the device).

    Args:
        act_lens, label_lens: (B,) int64 tensors (validated); tiling: their tiling.
    """
    dev = act_lens.device
    B = act_lens.shape[0]
    F = tiling.frame_b.shape[0]
    N = tiling.num_rows
    frame_b = torch.repeat_interleave(
        torch.arange(B, device=dev), act_lens, output_size=F
    )
    first = torch.cumsum(act_lens, 0) - act_lens
    frame_enc = frame_b * tiling.T + (torch.arange(F, device=dev) - first[frame_b])
    width = label_lens[frame_b] + 1
    frame = torch.repeat_interleave(torch.arange(F, device=dev), width, output_size=N)
    u = torch.arange(N, device=dev) - (torch.cumsum(width, 0) - width)[frame]
    return frame_enc[frame], frame_b[frame] * tiling.U + u


@functools.lru_cache(maxsize=64)
def device_ids(step_ids: Tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The layout's ``step_ids`` as an int64 tensor on ``device``, made once (a
    host-to-device copy synchronises the stream)."""
    return torch.tensor(step_ids, dtype=torch.int64, device=device)


def _launch_context(device: torch.device):
    """Launches on ``device`` (Triton launches on the current CUDA device)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


class TritonTileOps(TileOps):
    """The tile stages as Triton kernels
    (:class:`~espnet_multiblank.fused.tile_ops.TileOps`)."""

    def prepare(self, labels, act_lens, label_lens, vocab_size: int) -> None:
        from espnet_multiblank.fused import triton_kernels  # imports triton

        self.kernels = triton_kernels
        layout, tiling = self.layout, self.tiling
        B = label_lens.shape[0]
        if labels.shape[1] == 0:  # a column to point at (never read)
            labels = torch.zeros((B, 1), dtype=torch.int64, device=self.device)
        self.labels = labels.contiguous()
        self.label_lens = label_lens.contiguous()
        self.Vp = vocab_size
        self.ids = device_ids(tuple(layout.step_ids), self.device)
        self.erow = self.prow = None
        if tiling.num_rows:
            self.erow, self.prow = packed_rows(act_lens, label_lens, tiling)
        self._layout_args = dict(
            S=layout.num_token_steps,
            D=layout.num_durations,
            W=layout.width,
            P=layout.num_parts,
        )

    def index(self, r0: int, r1: int):
        """Tile [r0, r1)'s (erow, prow): views, no launch."""
        return self.erow[r0:r1], self.prow[r0:r1]

    def _blocks(self, x: torch.Tensor) -> Blocks:
        """The blocks of a launch on the tile tensor ``x`` ((R, V') or (R, J))."""
        return blocks_for(self.V, x.shape[1], x.element_size())

    def _rows_args(self, z: torch.Tensor, index):
        """The arguments the row kernels share, up to ``ids``."""
        t = self.tiling
        return (
            z,
            z.shape[0],
            self.Vp,
            self.V,
            index[0],
            index[1],
            t.T,
            t.U,
            self.Tp,
            self.Up,
            self.labels,
            self.labels.shape[1],
            self.label_lens,
            self.ids,
        )

    def gather(self, enc2d, pred2d, index, out: torch.Tensor):
        """pre (R, J) = enc2d[erow] + pred2d[prow], into ``out[:R]``."""
        R, J = index[0].shape[0], enc2d.shape[1]
        pre = out[:R]
        bl = self._blocks(pre)
        grid = (-(-R // bl.rows_j), -(-J // bl.width))
        with _launch_context(self.device):
            self.kernels.gather_pre[grid](
                enc2d,
                pred2d,
                index[0],
                index[1],
                pre,
                R,
                J,
                BLOCK_R=bl.rows_j,
                BLOCK_J=bl.width,
                num_warps=bl.warps,
            )
        return pre

    def extract(self, z: torch.Tensor, index, planes: Planes) -> None:
        """Forward: the tile's logits z (R, V') to the planes."""
        bl = self._blocks(z)
        grid = (-(-z.shape[0] // bl.rows),)
        with _launch_context(self.device):
            self.kernels.extract_rows[grid](
                *self._rows_args(z, index),
                float(self.opts.sigma),
                planes.rows,
                planes.lse,
                planes.bad,
                **self._layout_args,
                ACCURATE_EXP=not interpreting(),
                BLOCK_R=bl.rows,
                BLOCK_V=bl.vocab,
                BLOCK_D=_pow2_at_least(max(self.layout.num_durations, 1)),
                num_warps=bl.warps,
            )

    def apply(self, z: torch.Tensor, index, planes: Planes, factors):
        """Backward: the tile's recomputed logits z (R, V') become the gradient of
        the reduced loss w.r.t. them, in place. factors: (B,) float64 tensor on the
        device (0 for an impossible utterance)."""
        o = self.opts
        bl = self._blocks(z)
        grid = (-(-z.shape[0] // bl.rows),)
        with _launch_context(self.device):
            self.kernels.apply_rows[grid](
                *self._rows_args(z, index),
                planes.rows,
                planes.lse,
                factors,
                float(o.fastemit_lambda),
                float(o.clamp),
                float(GRADIENT_FLUSH_BELOW),
                **self._layout_args,
                CLAMP=o.clamp > 0,
                ACCURATE_EXP=not interpreting(),
                BLOCK_R=bl.rows,
                BLOCK_V=bl.vocab,
                BLOCK_D=_pow2_at_least(max(self.layout.num_durations, 1)),
                num_warps=bl.warps,
            )

    def scatter(self, d_pre, index, d_enc, d_pred) -> None:
        """d_enc[erow] += d_pre, d_pred[prow] += d_pre (atomic adds)."""
        d_pre = d_pre.contiguous()
        R, J = d_pre.shape
        bl = self._blocks(d_pre)
        grid = (-(-R // bl.rows_j), -(-J // bl.width))
        with _launch_context(self.device):
            self.kernels.scatter_pre_grad[grid](
                d_pre,
                index[0],
                index[1],
                d_enc,
                d_pred,
                R,
                J,
                BLOCK_R=bl.rows_j,
                BLOCK_J=bl.width,
                num_warps=bl.warps,
            )
