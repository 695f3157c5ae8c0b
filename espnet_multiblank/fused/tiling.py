"""The valid lattice nodes packed frame-major, and their tiles.

Node (b, t, u) with t < T_b and u <= L_b is a row of the joint's logits. The rows are
packed without padding, frame by frame (b = 0 first, then t, then u): frame (b, t)
holds the U_b = L_b + 1 rows of its label positions, consecutive. The packed list is
cut into tiles of at most ``tile_rows`` consecutive rows (a tile may end inside a
frame). A tile's rows are described by two index arrays:

* ``enc_rows[i] = b T + t``: the row of ``enc.reshape(B * T, J)`` the node adds;
* ``pred_rows[i] = b U + u``: the row of ``pred.reshape(B * U, J)``.

Forward and backward walk the same tiles in the same order, so that each tile's
logits are recomputed by the same operations on the same rows.
"""

from dataclasses import dataclass
from typing import Iterator, Tuple

import numpy as np


@dataclass(frozen=True)
class Tiling:
    """The packed nodes of a batch and their tiles.

    Attributes:
        T, U: enc.shape[1] and pred.shape[1] (the strides of the index arrays).
        frame_enc: (F,) int64, ``b T + t`` of each valid frame (F = sum of T_b).
        frame_b: (F,) int64, the utterance of each frame.
        row0: (F + 1,) int64, the first packed row of each frame (``row0[F]`` = the
            number of nodes).
        tile_rows: rows per tile (>= 1; at most the number of nodes, when there are
            any).
    """

    T: int
    U: int
    frame_enc: np.ndarray
    frame_b: np.ndarray
    row0: np.ndarray
    tile_rows: int

    @classmethod
    def create(
        cls, T: int, U: int, act_lens: np.ndarray, label_lens: np.ndarray, tile_rows
    ) -> "Tiling":
        """Args: act_lens, label_lens (B,) int64 numpy arrays (validated)."""
        B = act_lens.shape[0]
        frame_b = np.repeat(np.arange(B, dtype=np.int64), act_lens)
        first = np.cumsum(act_lens) - act_lens  # first frame of each utterance
        t = np.arange(frame_b.shape[0], dtype=np.int64) - np.repeat(first, act_lens)
        frame_enc = frame_b * T + t
        row0 = np.zeros(frame_b.shape[0] + 1, dtype=np.int64)
        np.cumsum(label_lens[frame_b] + 1, out=row0[1:])
        tile_rows = max(1, min(int(tile_rows), int(row0[-1])))
        return cls(T, U, frame_enc, frame_b, row0, tile_rows)

    @property
    def num_rows(self) -> int:
        return int(self.row0[-1])

    def tiles(self) -> Iterator[Tuple[int, int]]:
        """The tiles ``[r0, r1)`` of packed rows, in order."""
        n, R = self.num_rows, self.tile_rows
        for r0 in range(0, n, R):
            yield r0, min(n, r0 + R)

    def indices(self, r0: int, r1: int, out=None) -> Tuple[np.ndarray, np.ndarray]:
        """(enc_rows, pred_rows) (r1 - r0,) int64 of tile [r0, r1) (module
        docstring); ``out``: two int64 arrays of at least r1 - r0 entries to fill."""
        if out is None:
            out = (np.empty(r1 - r0, np.int64), np.empty(r1 - r0, np.int64))
        from espnet_multiblank.fused.cpu_tile_kernels import fill_tile_indices

        enc_rows, pred_rows = out[0][: r1 - r0], out[1][: r1 - r0]
        fill_tile_indices(
            self.row0, self.frame_enc, self.frame_b, self.U, r0, r1, enc_rows, pred_rows
        )
        return enc_rows, pred_rows
