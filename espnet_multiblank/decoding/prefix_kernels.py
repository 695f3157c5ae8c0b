"""Numba kernels of the label-synchronous beam search: the forward sums over the frames
of one label-sequence prefix, and the best alignment of a complete label sequence.

Both run on the host on NumPy arrays (the search copies its few (rows, frames) arrays
there when it runs on another device). Notation: A rows (hypotheses), T frames, NB
blank arcs (a standard blank and big blanks, or a TDT blank with each duration >= 1),
NL label arcs (one per duration: 1 on a standard or multi-blank lattice, whose labels
stay at their frame; D on a TDT), U labels.

Lattice of one prefix y (u labels) on frames 0 .. T_a - 1 (``docs/decoding.md``,
"Label-synchronous rule")::

    alpha(t) = LSE( entry(t),  alpha(t - d_j) + blank(t - d_j, j)  [t >= d_j] )
    end      = LSE_j alpha(T_a - d_j) + blank(T_a - d_j, j)        [T_a >= d_j]
    entry_{y+l}(t') = LSE_i alpha_y(t' - e_i) + label(t' - e_i, l, i) [t' >= e_i]

``entry(t)`` is the probability of the paths whose u-th label arc lands on frame t;
``alpha(t)`` of the paths that stand on (t, u); ``end`` of the complete paths of y
(the last arc a blank that lands on T_a exactly, as in the losses).
"""

import math

import numpy as np

from espnet_multiblank.loss.cpu import numba_cache

numba_cache.install()

from numba import njit  # noqa: E402

_OPTS = dict(cache=True, error_model="numpy")
NEG_INF = -np.inf


@njit(**_OPTS)
def _arc_sum(first, alpha, a, weight, w, durations, t):
    """log( exp(first) + sum_i exp(alpha[a, t - d_i] + weight[w, t - d_i, i]) ) over
    the arcs i with t - d_i >= 0, max-shifted: one exponential per term and one
    logarithm, where a chain of pairwise log-adds takes one of each per term."""
    top = first
    for i in range(durations.shape[0]):
        s = t - durations[i]
        if s >= 0:
            top = max(top, alpha[a, s] + weight[w, s, i])
    if top == NEG_INF:
        return NEG_INF
    acc = math.exp(first - top)
    for i in range(durations.shape[0]):
        s = t - durations[i]
        if s >= 0:
            acc += math.exp(alpha[a, s] + weight[w, s, i] - top)
    return top + math.log(acc)


@njit(**_OPTS)
def level_forward(entry, blank_w, blank_d, lens, alpha, end):
    """Forward sums of A prefixes over their frames (each sum max-shifted,
    :func:`_arc_sum`).

    Args:
        entry: (A, T) float64, log-probability of the paths whose last label arc
            lands on each frame (the root: 0 at frame 0).
        blank_w: (A, T, NB) float32, log-probability of blank arc j taken at frame t.
        blank_d: (NB,) int64, frames blank arc j covers (>= 1).
        lens: (A,) int64, T_a.
        alpha: (A, T) float64, out: ``alpha(t)`` (-inf from T_a on).
        end: (A,) float64, out: log-probability of the complete paths.
    """
    A, T = entry.shape
    for a in range(A):
        Ta = lens[a]
        for t in range(T):
            if t >= Ta:
                alpha[a, t] = NEG_INF
            else:
                alpha[a, t] = _arc_sum(entry[a, t], alpha, a, blank_w, a, blank_d, t)
        end[a] = _arc_sum(NEG_INF, alpha, a, blank_w, a, blank_d, Ta)


@njit(**_OPTS)
def child_entries(alpha, parent, label_w, label_d, lens, entry):
    """Entries of C children, each its parent's prefix extended by one label
    (max-shifted sums, :func:`_arc_sum`).

    Args:
        alpha: (A, T) float64, the parents' forward sums (:func:`level_forward`).
        parent: (C,) int64, each child's parent row in ``alpha``.
        label_w: (C, T, NL) float32, log-probability of the child's label arc with
            duration i taken at frame t (from its parent's state).
        label_d: (NL,) int64, frames label arc i covers (>= 0).
        lens: (C,) int64, T of each child's utterance.
        entry: (C, T) float64, out: the children's entries.
    """
    C, T = entry.shape
    for c in range(C):
        p = parent[c]
        for t in range(T):
            if t >= lens[c]:
                entry[c, t] = NEG_INF
            else:
                entry[c, t] = _arc_sum(NEG_INF, alpha, p, label_w, c, label_d, t)


@njit(**_OPTS)
def best_alignments(blank_w, blank_d, label_w, label_d, lens, ulens, arcs, stats):
    """The most probable alignment of each of H complete label sequences.

    Args:
        blank_w: (H, T, U + 1, NB) float32, blank arc j at (t, u).
        blank_d: (NB,) int64.
        label_w: (H, T, U, NL) float32, the arc of label u + 1 with duration i at
            (t, u).
        label_d: (NL,) int64.
        lens: (H,) int64, T_h.
        ulens: (H,) int64, U_h labels.
        arcs: (H, U, 3) float64, out: per label, the frame its arc starts on, the
            frames it covers and its log-probability.
        stats: (H, 3) float64, out: the alignment's log-probability (-inf: none),
            blank arcs over more than one frame, frames skipped (d - 1 summed over
            the arcs that cover d > 1 frames).
    """
    H, T, U1, NB = blank_w.shape
    NL = label_d.shape[0]
    best = np.empty((T + 1, U1), np.float64)
    back = np.empty((T + 1, U1), np.int64)  # j >= 0: blank j; -1 - i: label arc i
    for h in range(H):
        Th, Uh = lens[h], ulens[h]
        for t in range(Th + 1):
            for u in range(Uh + 1):
                v = 0.0 if (t == 0 and u == 0) else NEG_INF
                k = 0
                for j in range(NB):
                    s = t - blank_d[j]
                    if s >= 0 and s < Th:
                        w = best[s, u] + blank_w[h, s, u, j]
                        if w > v:
                            v, k = w, j
                if u > 0 and t < Th:
                    for i in range(NL):
                        s = t - label_d[i]
                        if s >= 0:
                            w = best[s, u - 1] + label_w[h, s, u - 1, i]
                            if w > v:
                                v, k = w, -1 - i
                if t == Th and u < Uh:
                    v = NEG_INF  # frame T is only reached by the last blank
                best[t, u] = v
                back[t, u] = k
        stats[h, 0] = best[Th, Uh]
        stats[h, 1] = 0.0
        stats[h, 2] = 0.0
        if best[Th, Uh] == NEG_INF:
            continue
        t, u = Th, Uh
        while t > 0 or u > 0:
            k = back[t, u]
            if k >= 0:
                d = blank_d[k]
                if d > 1:
                    stats[h, 1] += 1.0
                    stats[h, 2] += d - 1
                t -= d
            else:
                i = -1 - k
                e = label_d[i]
                s = t - e
                arcs[h, u - 1, 0] = s
                arcs[h, u - 1, 1] = e
                arcs[h, u - 1, 2] = label_w[h, s, u - 1, i]
                if e > 1:
                    stats[h, 2] += e - 1
                t, u = s, u - 1


def prepare() -> None:
    """Compile the kernels now (or load them from Numba's on-disk cache) for the
    argument types the search passes (C-contiguous arrays of the dtypes above), by
    running each once on a one-frame case: a search built with the label rule calls
    this, so that the compilation (seconds, on a fresh checkout) is paid while the
    model loads and not by the first decoded batch."""
    i64 = np.int64
    one = np.ones(1, i64)
    level_forward(
        np.zeros((1, 1)),
        np.zeros((1, 1, 1), np.float32),
        one,
        one,
        np.zeros((1, 1)),
        np.zeros(1),
    )
    child_entries(
        np.zeros((1, 1)),
        np.zeros(1, i64),
        np.zeros((1, 1, 1), np.float32),
        np.zeros(1, i64),
        one,
        np.zeros((1, 1)),
    )
    best_alignments(
        np.zeros((1, 1, 1, 1), np.float32),
        one,
        np.zeros((1, 1, 1, 1), np.float32),
        np.zeros(1, i64),
        one,
        np.zeros(1, i64),
        np.zeros((1, 1, 3)),
        np.zeros((1, 3)),
    )
