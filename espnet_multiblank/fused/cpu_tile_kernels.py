"""Numba kernels of one CPU tile of the fused joint + loss.

Every kernel but :func:`fill_tile_indices` is ``parallel=True`` over ``nchunks``
chunks of the tile's rows (of its columns for :func:`scatter_pre_grad`, whose rows
add into shared rows of d_enc / d_pred); ``cpu_tile_ops`` runs them, or their serial
twins with one chunk, as the dense CPU kernels' thread rule says (they run between
the tile's matmuls, never beside them, so the threads are free).

A tile is R packed lattice nodes (``tiling.py``); row i is node (b, t, u) with
``enc_rows[i] = b T + t`` and ``pred_rows[i] = b U + u``. The planes (``rows``,
``lse``) are indexed by node on the (B, T', U') grid of the lattice (T' <= T, U' <= U).

* :func:`fill_tile_indices`: a tile's ``enc_rows`` and ``pred_rows``;
* :func:`gather_pre`: ``pre[i] = enc[enc_rows[i]] + pred[pred_rows[i]]``;
* :func:`extract_rows` (forward): each row of logits ``z`` to its node's log-softmax
  normaliser(s) ``lse`` and the few log-probs the lattice reads (the rows of
  ``espnet_multiblank.loss.rows``), r = 1; standard, multi-blank (big blank ids) and
  TDT (D duration logits after the V token logits) alike;
* :func:`apply_rows` (backward): ``z`` (recomputed exactly as in forward) becomes, in
  place, the gradient of the reduced loss w.r.t. the logits
  (``docs/lattice.md`` sections 2.x and 3.3, FastEmit included), the utterance's factor
  f_b folded in and clipped to ``clamp |f_b|``:

      G[k] = f_b [ (gamma + lambda W_label) softmax(z)_k - sum_steps W_e [k_e = k] ]

  (the label step weighted by 1 + lambda; TDT: token and duration parts apart, the
  duration part ``f_b [gamma softmax(z[V:])_j - W_dur(j)]``); values below
  ``|f_b| 2**-80`` are set to 0 (the dense path's rule, ``row_ops.flush_limit``:
  far below the resolution of any sum they enter, and subnormal or nearly subnormal
  operands slow the matmuls that take G down by more than an order of magnitude on
  CPUs that handle them in microcode);
* :func:`scatter_pre_grad`: ``d_enc[enc_rows[i]] += d_pre[i]``,
  ``d_pred[pred_rows[i]] += d_pre[i]``.

The softmax is ``exp(z - lse)`` with lse from the forward pass: evaluated as
``exp(z - l32) * exp(l32 - lse)`` (l32 = lse rounded to z's dtype) so that the
vectorised float32 exp sees a float32 shift and the rounding of lse does not enter.
The loops use the vectorisable range primitives of the dense CPU kernels
(``loss/cpu/row_ops.py``).
"""

import math

import numpy as np
from numba import njit, prange

from espnet_multiblank.fused.loss_package import cpu_row_ops

ops = cpu_row_ops()
# the dense path's rule for the gradient's tiny values (``row_ops.flush_limit``)
flush_limit = ops.flush_limit
_flush = ops.flushed
_OPTS = dict(cache=True, error_model="numpy", fastmath={"nsz", "contract"})
_PAR = dict(parallel=True, **_OPTS)
_NEG_INF = -np.inf
_U0 = np.uint64(0)


@njit(cache=True)
def fill_tile_indices(row0, frame_enc, frame_b, U, r0, r1, enc_rows, pred_rows):
    """The index arrays of packed rows [r0, r1) (``tiling.py``): ``enc_rows``,
    ``pred_rows`` (>= r1 - r0,) int64 out; row0, frame_enc, frame_b: the tiling's."""
    f = np.searchsorted(row0, r0, side="right") - 1
    for i in range(r1 - r0):
        r = r0 + i
        while r >= row0[f + 1]:
            f += 1
        enc_rows[i] = frame_enc[f]
        pred_rows[i] = frame_b[f] * U + (r - row0[f])


@njit(**_OPTS)
def _chunk(c, nchunks, n):
    """[lo, hi) of chunk c of range(n)."""
    return c * n // nchunks, (c + 1) * n // nchunks


@njit(parallel=True, fastmath=True, error_model="numpy", cache=True)
def gather_pre(enc, pred, enc_rows, pred_rows, out, nchunks):
    """out (R, J) <- enc[enc_rows] + pred[pred_rows]; enc (B T, J), pred (B U, J) of
    out's dtype, C-contiguous."""
    R, J = out.shape
    for ch in prange(nchunks):
        i0, i1 = _chunk(ch, nchunks, R)
        for i in range(i0, i1):
            e = enc_rows[i]
            p = pred_rows[i]
            for j in range(J):
                out[i, j] = enc[e, j] + pred[p, j]


@njit(parallel=True, fastmath=True, error_model="numpy", cache=True)
def scatter_pre_grad(d_pre, enc_rows, pred_rows, d_enc, d_pred, nchunks):
    """d_enc[enc_rows[i]] += d_pre[i], d_pred[pred_rows[i]] += d_pre[i] (chunks of
    columns: rows of a tile add into the same rows of d_enc and d_pred)."""
    R, J = d_pre.shape
    for ch in prange(nchunks):
        j0, j1 = _chunk(ch, nchunks, J)
        for i in range(R):
            e = enc_rows[i]
            p = pred_rows[i]
            for j in range(j0, j1):
                g = d_pre[i, j]
                d_enc[e, j] += g
                d_pred[p, j] += g


@njit(**_OPTS)
def _node(enc_rows, pred_rows, i, T, U, Tp, Up, uVD, uV):
    """(b, u, node index on the (B, T', U') grid, lo, mid) of tile row i: its
    token logits are ``zf[lo:mid]``, its duration logits (TDT) ``zf[mid:lo + VD]``
    (``_flat_views``'s zf, uVD = VD and uV = V)."""
    p = pred_rows[i]
    b = p // U
    u = p - b * U
    t = enc_rows[i] - b * T
    lo = np.uint64(i) * uVD
    return b, u, (b * Tp + t) * Up + u, lo, lo + uV


@njit(fastmath=True, error_model="numpy", cache=True)
def _scale_flush_into(e, g, lo, n, c, limit):
    """g[lo + k] = e[k] * c for k < n (c rounded to g's dtype), results below
    ``limit`` set to 0 (e and g separate arrays: a loop that reads and writes one
    array at two offsets does not vectorise)."""
    s = g.dtype.type(c)
    lim = g.dtype.type(limit)
    zero = g.dtype.type(0.0)
    for k in range(n):
        v = e[k] * s
        g[lo + k] = zero if abs(v) < lim else v


@njit(**_OPTS)
def _softmax_scale(zf, lo, hi, lse, e):
    """e[:hi - lo] <- exp(zf[lo:hi] - l32); returns exp(l32 - lse), the factor that
    completes the softmax (l32 = lse rounded to zf's dtype)."""
    l32 = zf.dtype.type(lse)
    ops.exp_range(zf, lo, hi, l32, e, _U0)
    return math.exp(np.float64(l32) - lse)


@njit(**_OPTS)
def _flat_views(z, tile, rows, lse):
    """What both row kernels read first: (R, D, N, Tp, Up, K1, LW, zf, rf, lf, uVD,
    uV) of a tile of logits z (R, V + D) and planes of (B, T', U', K1) rows; the
    arrays flattened (one index per value, as the range primitives take them)."""
    V, big_ids = tile[0], tile[8]
    R, VD = z.shape
    Tp, Up, K1 = rows.shape[1], rows.shape[2], rows.shape[3]
    LW = 2 if VD > V else 1  # normalisers per node
    zf = z.reshape(R * VD)
    rf = rows.reshape(rows.size)
    lf = lse.reshape(lse.size)
    uVD = np.uint64(VD)
    uV = np.uint64(V)
    return R, VD - V, big_ids.size, Tp, Up, K1, LW, zf, rf, lf, uVD, uV


@njit(**_PAR)
def extract_rows(z, tile, sigma, rows, lse, bad, nchunks):
    """Forward: the planes of a tile of logits (standard, multi-blank or TDT).

    z: (R, V + D) logits (float32 / float64), C-contiguous: V token logits (all the
    blanks), then D duration logits (TDT; D = 0 otherwise);
    tile: (V, enc_rows, pred_rows, T, U, labels, label_lens, blank, big_ids): the
    tile's rows ((R,) int64 each), the batch's T and U, labels (B, L) int64,
    label_lens (B,) int64, the blank id and big_ids (N,) int64 (empty for standard
    RNN-T and TDT);
    rows: (B, T', U', width) float64 out: [lp_blank, lp_label (-inf on u = L_b),
        lp_big_i..., dur_j..., r...] with every r = 1 (multi-blank: N + 3 slots; TDT:
        D + 4), sigma in the token log-probs only;
    lse: (B, T', U') float64 out (TDT: (B, T', U', 2), token then duration part);
    bad: (B,) uint8, set to 1 for an utterance with a NaN / +inf logit or a part of
        a row that is -inf throughout;
    nchunks: chunks of rows (threads).
    """
    V, enc_rows, pred_rows, T, U, labels, label_lens, blank, big_ids = tile
    R, D, N, Tp, Up, K1, LW, zf, rf, lf, uVD, uV = _flat_views(z, tile, rows, lse)
    for ch in prange(nchunks):
        scratch = np.empty(V, z.dtype)
        i0, i1 = _chunk(ch, nchunks, R)
        for i in range(i0, i1):
            b, u, node, lo, mid = _node(enc_rows, pred_rows, i, T, U, Tp, Up, uVD, uV)
            m, isbad = ops.max_and_check(zf, lo, mid)
            md, isbad_d = m, False
            if D > 0:
                md, isbad_d = ops.max_and_check(zf, mid, lo + uVD)
            if isbad or isbad_d or m == _NEG_INF or md == _NEG_INF:
                bad[b] = 1
                continue
            s = ops.exp_sum(zf, lo, mid, m, scratch, _U0)
            d = np.float64(m) + math.log(s)
            lf[LW * node] = d
            d += sigma
            p = node * K1
            rf[p] = np.float64(zf[lo + np.uint64(blank)]) - d
            if u < label_lens[b]:
                rf[p + 1] = np.float64(zf[lo + np.uint64(labels[b, u])]) - d
            else:
                rf[p + 1] = _NEG_INF
            for k in range(N):
                rf[p + 2 + k] = np.float64(zf[lo + np.uint64(big_ids[k])]) - d
            if D > 0:
                sd = 0.0
                for j in range(D):
                    sd += math.exp(np.float64(zf[mid + np.uint64(j)]) - np.float64(md))
                dd = np.float64(md) + math.log(sd)
                lf[LW * node + 1] = dd
                for j in range(D):
                    rf[p + 2 + j] = np.float64(zf[mid + np.uint64(j)]) - dd
            for k in range(2 + N + D, K1):
                rf[p + k] = 1.0


@njit(**_PAR)
def apply_rows(z, tile, rows, lse, factors, fastemit_lambda, clamp, nchunks):
    """Backward: z (R, V + D), the tile's logits as in forward, becomes
    ``factors[b] * clip(d cost_b / d z, -clamp, clamp)`` in place (module docstring).

    rows: (B, T', U', width) float64 occupancies of the lattice [W_blank, W_label,
    W_big_i..., W_dur_j..., *]; lse: the forward's normalisers; factors: (B,)
    float64 (reduction weight times incoming gradient; 0 for an impossible
    utterance); tile, nchunks: as :func:`extract_rows`. Values below
    :func:`flush_limit` are set to 0.
    """
    V, enc_rows, pred_rows, T, U, labels, label_lens, blank, big_ids = tile
    R, D, N, Tp, Up, K1, LW, zf, rf, lf, uVD, uV = _flat_views(z, tile, rows, lse)
    lam1 = 1.0 + fastemit_lambda
    for ch in prange(nchunks):
        e = np.empty(V, z.dtype)
        i0, i1 = _chunk(ch, nchunks, R)
        for i in range(i0, i1):
            b, u, node, lo, mid = _node(enc_rows, pred_rows, i, T, U, Tp, Up, uVD, uV)
            hi = lo + uVD
            f = factors[b]
            if f == 0.0:
                ops.zero_range(zf, lo, hi)
                continue
            p = node * K1
            w_blank = rf[p]
            w_label = rf[p + 1]
            gamma = w_blank + w_label  # + the big blanks (a TDT's W_dur are a split)
            for k in range(N):
                gamma += rf[p + 2 + k]
            c = (gamma + fastemit_lambda * w_label) * f
            c *= _softmax_scale(zf, lo, mid, lf[LW * node], e)
            lim = flush_limit(f, zf)
            _scale_flush_into(e, zf, lo, V, c, lim)
            # the steps' symbols (the exps in e are still unscaled)
            zf[lo + np.uint64(blank)] = _flush(e[blank] * c - w_blank * f, zf, lim)
            if u < label_lens[b]:
                k = labels[b, u]
                zf[lo + np.uint64(k)] = _flush(e[k] * c - lam1 * w_label * f, zf, lim)
            for j in range(N):
                k = big_ids[j]
                zf[lo + np.uint64(k)] = _flush(e[k] * c - rf[p + 2 + j] * f, zf, lim)
            if D > 0:  # the duration part: its own softmax, coefficient gamma
                dd = lf[LW * node + 1]
                cd = gamma * f
                for j in range(D):
                    k = mid + np.uint64(j)
                    q = math.exp(np.float64(zf[k]) - dd)
                    zf[k] = _flush(cd * q - rf[p + 2 + j] * f, zf, lim)
            if clamp > 0.0:
                ops.clamp_range(zf, lo, hi, clamp * abs(f))
