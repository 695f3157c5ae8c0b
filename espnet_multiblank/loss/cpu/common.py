"""What the multi-blank and the TDT CPU kernels share: the compile options, the
constants of their layout, the split of the frames into chunks, the ranges of an
anti-diagonal and pass 2's copy of the rows into anti-diagonal planes.

The kernels themselves are in ``kernels.py`` (multi-blank / standard RNN-T, whose
module docstring explains the design and the performance rules) and
``tdt_kernels.py`` (TDT). Their passes 1 and 3 begin each frame with the same few
lines (the frame's rows, padding zeroed, its shift or its factor); those stay written
in each kernel: as a shared helper inlined by Numba they changed the machine code
LLVM makes of the passes (more of the row loops called out of line instead of
inlined, checked with ``inspect_asm``), and the passes are the hot loops.
"""

import numpy as np
from numba import njit

#: compile options of the kernels (on-disk cache; no division checks; fused
#: multiply-adds and sign-of-zero freedom, which the vector loops need)
KERNEL_OPTS = dict(cache=True, error_model="numpy", fastmath={"nsz", "contract"})

NEG_INF = -np.inf
U0 = np.uint64(0)
U1 = np.uint64(1)
U2 = np.uint64(2)
#: the vector loops over an anti-diagonal run over a multiple of LANES columns
LANES = 8
#: a row whose exps (shifted by the frame maximum) sum below this is redone with its
#: own maximum, so that no exp of a row is flushed to 0 while it is above e**-46 of
#: the row's largest one
MIN_ROW_SUM = 2.0**-60
#: frames are handed to threads in this many chunks per call at most (per-chunk
#: scratch)
CHUNKS = 64
#: below this many logits per row, pass 1 computes the exps of a frame's valid rows in
#: one loop and then sums each row (reading back from L1), instead of one fused
#: exp-and-sum loop per row: a short loop's set-up and reduction cost more than the
#: second read from L1 (pass 1 alone is faster so below this width, slower above)
FRAME_WIDE_BELOW_V = 256


@njit(cache=True)
def chunk(c, nchunks, total):
    """Frames [lo, hi) of chunk c."""
    return c * total // nchunks, (c + 1) * total // nchunks


@njit(cache=True)
def diag_range(n, Tb, Ub):
    """(first, last, end) columns j = u + 1 (np.uint64): the valid nodes (t < Tb,
    u < Ub) of anti-diagonal n are first..last; loops run first..end-1 (a multiple of
    LANES columns)."""
    jlo = max(0, n - Tb + 1) + 1
    jhi = min(n, Ub - 1) + 1
    jend = jlo + ((jhi - jlo + LANES) // LANES) * LANES
    return np.uint64(jlo), np.uint64(jhi), np.uint64(jend)


@njit(inline="always")
def rows_to_planes(STf, sb, U, K1, K, Tb, Ub, L, uP, uW, c0):
    """Slots 0 .. K - 1 of an utterance's valid rows (row-major, K1 float64 slots per
    node, from ``STf[sb:]``) to the K anti-diagonal planes of ``L`` (plane k from
    ``k uP``, anti-diagonal n from ``n uW`` in it, node (t, u) = (n - j + 1, j - 1)
    in column c0 + j; all offsets np.uint64): one plane at a time, strided loads,
    contiguous stores; exact ranges (the loads must stay inside the utterance's
    rows)."""
    step = np.uint64((U - 1) * K1)
    for k in range(K):
        for n in range(Tb + Ub - 1):
            jlo, jhi, _ = diag_range(n, Tb, Ub)
            # node (t, u) = (n - j + 1, j - 1) is row t U + u = n U - (j - 1)(U - 1)
            src = sb + np.uint64(n * U) * np.uint64(K1) + step + np.uint64(k)
            dst = np.uint64(k) * uP + np.uint64(n) * uW + c0
            for j in range(jlo, jhi + U1):
                L[dst + j] = STf[src - j * step]
