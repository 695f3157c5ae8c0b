"""What the multi-blank and the TDT CPU kernels share: the compile options, the
constants of their layout, the split of the frames into chunks, the ranges of an
anti-diagonal, and the per-frame prologues of pass 1 and pass 3.

The kernels themselves are in ``kernels.py`` (multi-blank / standard RNN-T, whose
module docstring explains the design and the performance rules) and
``tdt_kernels.py`` (TDT). The prologues are inlined into the kernels by Numba
(``inline="always"``), so sharing them costs nothing at run time.
"""

import math

import numpy as np
from numba import njit

from espnet_multiblank.loss.cpu.row_ops import flush_limit, max_and_check, zero_range

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
def forward_frame(bt, T, uU, uW, act_lens, label_lens, store, ef, xf, bad):
    """Pass 1's start of frame ``bt = b T + t`` (rows of W logits; ``uU``, ``uW``: U
    and W as np.uint64): the rows of the frame that are padding zeroed in the
    gradient buffer ``ef`` (when ``store``), the frame's shift found (its largest
    valid logit).

    Returns:
        ``(go, b, Ub, f0, fe, c)``: the frame's valid rows are ``xf[f0:fe]``
        (U_b = L_b + 1 of them) with shift ``c``; ``go`` is False when there is
        nothing to compute: a frame of padding (t >= T_b), or one with NaN / +inf
        logits or a valid row of only -inf (then ``bad[b]`` is set).
    """
    b = bt // T
    t = bt - b * T
    Ub = label_lens[b] + 1
    f0 = np.uint64(bt) * uU * uW  # frame start
    fe = f0 + np.uint64(Ub) * uW
    if t >= act_lens[b]:
        fe = f0
    if store:
        zero_range(ef, fe, f0 + uU * uW)
    if fe == f0:
        return False, b, Ub, f0, fe, xf.dtype.type(0.0)
    c, isbad = max_and_check(xf, f0, fe)
    if isbad or c == NEG_INF:
        bad[b] = 1
        return False, b, Ub, f0, fe, c
    return True, b, Ub, f0, fe, c


@njit(inline="always")
def backward_frame(bt, T, uU, uW, uK1, act_lens, label_lens, lp, factors, clamp, gf):
    """Pass 3's start of frame ``bt = b T + t`` (rows of W logits, rows of K1 slots;
    all np.uint64): the frame's gradient zeroed when its utterance is impossible.

    Returns:
        ``(go, b, Ub, f0, p, f, c_clip, lim)``: the frame's valid rows start at
        ``gf[f0]`` and their rows of slots at ``p``; the utterance's factor ``f``,
        the clamp bound ``c_clip = clamp |f|`` and the flush limit ``lim``
        (``row_ops.flush_limit``); ``go`` is False when there is nothing to compute
        (a frame of padding, zeroed by pass 1, or an impossible utterance).
    """
    b = bt // T
    t = bt - b * T
    Ub = label_lens[b] + 1
    f0 = np.uint64(bt) * uU * uW
    p = np.uint64(bt) * uU * uK1
    f = factors[b]
    if t >= act_lens[b]:
        return False, b, Ub, f0, p, f, 0.0, 0.0
    if not math.isfinite(lp[b]):
        zero_range(gf, f0, f0 + np.uint64(Ub) * uW)
        return False, b, Ub, f0, p, f, 0.0, 0.0
    return True, b, Ub, f0, p, f, clamp * abs(f), flush_limit(f, gf)
