"""The per-node planes: what the fused forward pass keeps for the lattice and for
the backward pass (no logits, no hidden activations).

Per lattice node (b, t, u) of the (B, T', U') grid (T' = max T_b, U' = max L_b + 1):

* ``rows`` (B, T', U', width) float64: the lattice stage's rows, laid out by the
  lattice's family record (``espnet_multiblank.loss.rows``). The extract stage
  writes the log-probs, the lattice overwrites them with the occupancies, the apply
  stage reads those;
* ``lse`` (B, T', U') float64 (TDT: (B, T', U', 2), token then duration part): the
  log-softmax normalisers of the node's logits, so that the backward pass turns its
  recomputed logits into the same softmax;
* ``bad`` (B,) uint8 (numpy) or int32 (torch): set by the extract stage for an
  utterance whose logits hold NaN / +inf or a row that is -inf throughout.

Rows of padding (t >= T_b or u > L_b) are never written or read.
"""

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch

from espnet_multiblank.fused.loss_package import RowsLayout, gradient_flush_below

#: the apply stage sets gradient values below |f_b| * GRADIENT_FLUSH_BELOW to 0, as
#: the dense path's last pass does (``loss.cpu.row_ops.flush_limit`` says why)
GRADIENT_FLUSH_BELOW = gradient_flush_below()


@dataclass
class Planes:
    """See the module docstring; ``rows`` and ``lse`` are torch tensors (on the CPU
    path views of numpy arrays: ``rows.numpy()`` is the kernels' array)."""

    rows: torch.Tensor
    lse: torch.Tensor
    bad: torch.Tensor

    @property
    def grid(self) -> Tuple[int, int, int]:
        return tuple(self.rows.shape[:3])

    def first_bad(self) -> int:
        """The first utterance flagged bad, or -1 (one host synchronisation)."""
        flagged = torch.nonzero(self.bad).flatten()
        return int(flagged[0]) if flagged.numel() else -1


def lattice_grid(act_lens: np.ndarray, label_lens: np.ndarray) -> Tuple[int, int]:
    """(T', U') = (max T_b, max L_b + 1) of a batch ((0, 1) for an empty batch)."""
    if act_lens.size == 0:
        return 0, 1
    return int(act_lens.max()), int(label_lens.max()) + 1


def new_planes(
    layout: RowsLayout, B: int, Tp: int, Up: int, device: torch.device
) -> Planes:
    """Uninitialised planes of ``layout``'s rows for a (B, T', U') grid: numpy-backed
    on the CPU (the numpy allocator reuses freed heap blocks and gets transparent huge
    pages for large arrays: fewer page faults than torch's CPU allocations of that
    size), torch tensors elsewhere."""
    width = layout.width
    lse_tail = () if layout.num_parts == 1 else (layout.num_parts,)
    if device.type == "cpu":
        rows = torch.from_numpy(np.empty((B, Tp, Up, width), np.float64))
        lse = torch.from_numpy(np.empty((B, Tp, Up) + lse_tail, np.float64))
        bad = torch.from_numpy(np.zeros(B, np.uint8))
        return Planes(rows, lse, bad)
    ws = dict(dtype=torch.float64, device=device)
    return Planes(
        torch.empty((B, Tp, Up, width), **ws),
        torch.empty((B, Tp, Up) + lse_tail, **ws),
        torch.zeros((B,), dtype=torch.int32, device=device),
    )
