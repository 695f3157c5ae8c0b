"""The interface of the per-tile stages (gather, extract, apply, scatter), which
``joint_loss.py`` runs on every tile, and what the three implementations share.

:class:`TileOps` is made once per batch (``tile_ops(opts, layout, tiling, labels,
act_lens, label_lens, vocab_size, grid)``, the class that
:func:`~espnet_multiblank.fused.tile_backends.tile_ops_for` picks) and keeps what the
stages read on every tile. Its subclasses: the Numba CPU kernels
(``cpu_tile_ops.py``), torch operations (``torch_tile_ops.py``) and Triton kernels
(``triton_tile_ops.py``), with the same formulas (``cpu_tile_kernels.py``'s
docstring). A tile's ``index`` is the implementation's own (numpy arrays, tensors);
the joint loss only passes it from :meth:`TileOps.index` to the other stages.
"""

from typing import Tuple

import torch

from espnet_multiblank.fused.loss_package import RowsLayout
from espnet_multiblank.fused.planes import Planes
from espnet_multiblank.fused.tiling import Tiling


class TileOps:
    """Gather, extract, apply and scatter of one tile, for one batch.

    Args:
        opts: The loss options (of any lattice).
        layout: Their rows' layout (``espnet_multiblank.loss.rows``).
        tiling: The batch's tiles.
        labels: (B, L) int64 tensor on the device, padding replaced by valid ids.
        act_lens: (B,) int64 tensor on the device.
        label_lens: (B,) int64 tensor on the device.
        vocab_size: V' (``weight.shape[0]``: V token logits, then a TDT's D
            duration logits).
        grid: (T', U') of the planes.

    Attributes:
        V: The token logits of a row (V' without a TDT's durations).
        Tp, Up: The planes' grid.
        device: The labels' device.
    """

    def __init__(
        self,
        opts,
        layout: RowsLayout,
        tiling: Tiling,
        labels: torch.Tensor,
        act_lens: torch.Tensor,
        label_lens: torch.Tensor,
        vocab_size: int,
        grid: Tuple[int, int],
    ):
        self.opts = opts
        self.layout = layout
        self.tiling = tiling
        self.device = labels.device
        self.V = layout.num_tokens(vocab_size)
        self.Tp, self.Up = grid
        self.prepare(labels, act_lens, label_lens, vocab_size)

    def prepare(self, labels, act_lens, label_lens, vocab_size: int) -> None:
        """The implementation's per-batch state (called by the constructor)."""
        raise NotImplementedError

    def index(self, r0: int, r1: int):
        """Tile [r0, r1)'s rows: their rows of enc2d and pred2d and their nodes."""
        raise NotImplementedError

    def gather(self, enc2d, pred2d, index, out: torch.Tensor) -> torch.Tensor:
        """pre (R, J) = enc2d[enc rows] + pred2d[pred rows], into ``out[:R]``
        (enc2d (B T, J), pred2d (B U, J) of out's dtype); returns pre."""
        raise NotImplementedError

    def extract(self, z: torch.Tensor, index, planes: Planes) -> None:
        """Forward: the tile's logits z (R, V') to the planes (z may be
        overwritten)."""
        raise NotImplementedError

    def apply(self, z: torch.Tensor, index, planes: Planes, factors) -> None:
        """Backward: the tile's recomputed logits z (R, V') become the gradient of
        the reduced loss w.r.t. them, in place; ``factors`` as :meth:`factors`
        gives them."""
        raise NotImplementedError

    def scatter(self, d_pre, index, d_enc, d_pred) -> None:
        """d_enc[enc rows] += d_pre, d_pred[pred rows] += d_pre (d_enc (B T, J),
        d_pred (B U, J) tensors of d_pre's dtype)."""
        raise NotImplementedError

    def factors(self, grad_costs: torch.Tensor, log_p: torch.Tensor):
        """(B,) float64 contiguous factors on the device: the incoming gradient of
        each cost, 0 for impossible utterances (log_p = -inf: their gradient is
        exactly 0)."""
        f = grad_costs.detach().to(self.device, torch.float64)
        return torch.where(torch.isfinite(log_p.to(self.device)), f, 0.0).contiguous()
