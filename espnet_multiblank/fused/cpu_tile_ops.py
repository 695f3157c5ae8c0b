"""The per-tile stages on the CPU: the Numba kernels of ``cpu_tile_kernels`` on numpy
views of torch tensors (the tile's matmuls are torch's, in ``joint_loss``).

Each kernel runs in parallel over chunks of the tile (as many Numba threads as torch
has) or as its serial twin, by the dense CPU kernels' rule
(:func:`~espnet_multiblank.fused.loss_package.cpu_threads`): the kernels run between
the tile's matmuls, so the threads the matmuls use are free then.
"""

from typing import Tuple

import numba
import numpy as np
import torch

from espnet_multiblank.fused import cpu_tile_kernels as kern
from espnet_multiblank.fused.loss_package import cpu_serial_twin, cpu_threads
from espnet_multiblank.fused.planes import Planes
from espnet_multiblank.fused.tile_ops import TileOps

TileIndex = Tuple[np.ndarray, np.ndarray]  # (enc_rows, pred_rows), (R,) int64

_PARALLEL = {
    k.py_func.__name__: k
    for k in (
        kern.gather_pre,
        kern.scatter_pre_grad,
        kern.extract_rows,
        kern.apply_rows,
    )
}
_SERIAL = {name: cpu_serial_twin(k) for name, k in _PARALLEL.items()}


def _run(name: str, work: int, *args) -> None:
    """Kernel ``name`` over ``work`` values: parallel chunks or the serial twin."""
    parallel, prev = cpu_threads(work)
    try:
        if parallel:
            _PARALLEL[name](*args, numba.get_num_threads())
        else:
            _SERIAL[name](*args, 1)
    finally:
        if prev is not None:
            numba.set_num_threads(prev)


class CpuTileOps(TileOps):
    """The tile stages as Numba kernels on numpy views of CPU tensors
    (:class:`~espnet_multiblank.fused.tile_ops.TileOps`; ``act_lens`` and ``grid``
    are unused here: the tiling and the planes have them)."""

    def prepare(self, labels, act_lens, label_lens, vocab_size: int) -> None:
        self.labels = labels.numpy()
        self.label_lens = label_lens.numpy()
        # the blanks of the token steps after the standard blank (big blanks)
        self.big_ids = np.asarray(self.layout.step_ids[1:], dtype=np.int64)
        R = self.tiling.tile_rows
        self._index = (np.empty(R, np.int64), np.empty(R, np.int64))

    def index(self, r0: int, r1: int) -> TileIndex:
        return self.tiling.indices(r0, r1, self._index)

    def gather(self, enc2d, pred2d, index: TileIndex, out: torch.Tensor):
        """pre (R, J) = enc2d[enc_rows] + pred2d[pred_rows], into ``out[:R]``."""
        pre = out[: index[0].shape[0]]
        args = (enc2d.numpy(), pred2d.numpy(), index[0], index[1], pre.numpy())
        _run("gather_pre", pre.numel(), *args)
        return pre

    def _tile(self, index: TileIndex):
        """The row kernels' ``tile`` argument (``cpu_tile_kernels.extract_rows``)."""
        o = self.opts
        tile = (self.V, index[0], index[1], self.tiling.T, self.tiling.U)
        return tile + (self.labels, self.label_lens, o.blank, self.big_ids)

    def extract(self, z: torch.Tensor, index: TileIndex, planes: Planes) -> None:
        """Forward: the tile's logits z (R, V') to the planes."""
        out = (planes.rows.numpy(), planes.lse.numpy(), planes.bad.numpy())
        args = (z.numpy(), self._tile(index), self.opts.sigma, *out)
        _run("extract_rows", z.numel(), *args)

    def apply(self, z: torch.Tensor, index: TileIndex, planes: Planes, factors):
        """Backward: the tile's recomputed logits z (R, V') become the gradient of
        the reduced loss w.r.t. them, in place. factors: (B,) float64 numpy."""
        o = self.opts
        args = (z.numpy(), self._tile(index), planes.rows.numpy())
        args += (planes.lse.numpy(), factors, o.fastemit_lambda, o.clamp)
        _run("apply_rows", z.numel(), *args)

    def scatter(self, d_pre, index: TileIndex, d_enc, d_pred) -> None:
        """d_enc[enc_rows] += d_pre, d_pred[pred_rows] += d_pre (d_enc (B T, J),
        d_pred (B U, J) tensors of d_pre's dtype)."""
        args = (d_pre.numpy(), index[0], index[1], d_enc.numpy(), d_pred.numpy())
        _run("scatter_pre_grad", d_pre.numel(), *args)

    def factors(self, grad_costs: torch.Tensor, log_p) -> np.ndarray:
        """(B,) float64 numpy factors: the incoming gradient of each cost, 0 for
        impossible utterances (whose gradient is exactly 0)."""
        f = grad_costs.detach().to("cpu", torch.float64).numpy().copy()
        f[~np.isfinite(np.asarray(log_p))] = 0.0
        return f
