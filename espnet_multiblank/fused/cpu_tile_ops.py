"""The per-tile stages on the CPU: the Numba kernels of ``cpu_tile_kernels`` on numpy
views of torch tensors (the tile's matmuls are torch's, in ``joint_loss``)."""

from typing import Tuple

import numpy as np
import torch

from espnet_multiblank.fused import cpu_tile_kernels as kern
from espnet_multiblank.fused.loss_package import is_tdt
from espnet_multiblank.fused.planes import Planes
from espnet_multiblank.fused.tiling import Tiling

TileIndex = Tuple[np.ndarray, np.ndarray]  # (enc_rows, pred_rows), (R,) int64


class CpuTileOps:
    """Gather, extract, apply and scatter of one tile, for one batch.

    Args:
        opts: the loss options (multi-blank / standard or TDT).
        tiling: the batch's tiles.
        labels: (B, L) int64 CPU tensor, padding replaced by valid ids.
        label_lens: (B,) int64 CPU tensor.
        vocab_size: V' (weight.shape[0]).
    """

    def __init__(self, opts, tiling: Tiling, labels, label_lens, vocab_size: int):
        self.opts = opts
        self.tiling = tiling
        self.tdt = is_tdt(opts)
        self.labels = labels.numpy()
        self.label_lens = label_lens.numpy()
        self.V = vocab_size - opts.num_durations if self.tdt else vocab_size
        ids = () if self.tdt else opts.big_blank_ids
        self.big_ids = np.asarray(ids, dtype=np.int64)
        R = tiling.tile_rows
        self._index = (np.empty(R, np.int64), np.empty(R, np.int64))
        self._scratch = {}
        self._big_scratch = np.empty(max(1, self.big_ids.size), np.float64)

    def index(self, r0: int, r1: int) -> TileIndex:
        return self.tiling.indices(r0, r1, self._index)

    def gather(self, enc2d, pred2d, index: TileIndex, out: torch.Tensor):
        """pre (R, J) = enc2d[enc_rows] + pred2d[pred_rows], into ``out[:R]``."""
        pre = out[: index[0].shape[0]]
        kern.gather_pre(enc2d.numpy(), pred2d.numpy(), index[0], index[1], pre.numpy())
        return pre

    def _row_scratch(self, dtype) -> np.ndarray:
        if dtype not in self._scratch:
            self._scratch[dtype] = np.empty(self.V, dtype)
        return self._scratch[dtype]

    def extract(self, z: torch.Tensor, index: TileIndex, planes: Planes) -> None:
        """Forward: the tile's logits z (R, V') to the planes."""
        o = self.opts
        zn = z.numpy()
        common = (index[0], index[1], self.tiling.T, self.tiling.U)
        common += (self.labels, self.label_lens, o.blank)
        out = (planes.rows.numpy(), planes.lse.numpy(), planes.bad.numpy())
        scratch = self._row_scratch(zn.dtype)
        if self.tdt:
            kern.extract_tdt(zn, self.V, *common, o.sigma, *out, scratch)
        else:
            kern.extract_multiblank(zn, *common, self.big_ids, o.sigma, *out, scratch)

    def apply(self, z: torch.Tensor, index: TileIndex, planes: Planes, factors):
        """Backward: the tile's recomputed logits z (R, V') become the gradient of
        the reduced loss w.r.t. them, in place. factors: (B,) float64 numpy."""
        o = self.opts
        common = (index[0], index[1], self.tiling.T, self.tiling.U)
        common += (self.labels, self.label_lens, o.blank)
        rest = (planes.rows.numpy(), planes.lse.numpy(), factors)
        rest += (o.fastemit_lambda, o.clamp)
        if self.tdt:
            kern.apply_tdt(z.numpy(), self.V, *common, *rest)
        else:
            kern.apply_multiblank(
                z.numpy(), *common, self.big_ids, *rest, self._big_scratch
            )

    def scatter(self, d_pre, index: TileIndex, d_enc, d_pred) -> None:
        """d_enc[enc_rows] += d_pre, d_pred[pred_rows] += d_pre (d_enc (B T, J),
        d_pred (B U, J) tensors of d_pre's dtype)."""
        kern.scatter_pre_grad(
            d_pre.numpy(), index[0], index[1], d_enc.numpy(), d_pred.numpy()
        )

    def factors(self, grad_costs: torch.Tensor, log_p) -> np.ndarray:
        """(B,) float64 numpy factors: the incoming gradient of each cost, 0 for
        impossible utterances (whose gradient is exactly 0)."""
        f = grad_costs.detach().to("cpu", torch.float64).numpy().copy()
        f[~np.isfinite(np.asarray(log_p))] = 0.0
        return f
