"""Numba kernels of one CPU tile of the fused joint + loss (serial: the tile's matmuls
take the threads).

A tile is R packed lattice nodes (``tiling.py``); row i is node (b, t, u) with
``enc_rows[i] = b T + t`` and ``pred_rows[i] = b U + u``. The planes (``rows``,
``lse``) are indexed by node on the (B, T', U') grid of the lattice (T' <= T, U' <= U).

* :func:`fill_tile_indices`: a tile's ``enc_rows`` and ``pred_rows``;
* :func:`gather_pre`: ``pre[i] = enc[enc_rows[i]] + pred[pred_rows[i]]``;
* :func:`extract_multiblank` / :func:`extract_tdt` (forward): each row of logits
  ``z`` to its node's log-softmax normaliser(s) ``lse`` and the few log-probs the
  lattice reads (``loss_package`` describes the rows), r = 1;
* :func:`apply_multiblank` / :func:`apply_tdt` (backward): ``z`` (recomputed exactly as
  in forward) becomes, in place, the gradient of the reduced loss w.r.t. the logits
  (``docs/lattice.md`` sections 2.x and 3.3, FastEmit included), the utterance's factor
  f_b folded in and clipped to ``clamp |f_b|``:

      G[k] = f_b [ (gamma + lambda W_label) softmax(z)_k - sum_steps W_e [k_e = k] ]

  (the label step weighted by 1 + lambda; TDT: token and duration parts apart, the
  duration part ``f_b [gamma softmax(z[V:])_j - W_dur(j)]``); values below the
  smallest normal number are flushed to 0 (they would slow the matmuls that take
  G about 100-fold, and are far below float32 resolution of any sum);
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
from numba import njit

from espnet_multiblank.fused.loss_package import cpu_row_ops

ops = cpu_row_ops()
_OPTS = dict(cache=True, error_model="numpy", fastmath={"nsz", "contract"})
_NEG_INF = -np.inf


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


@njit(fastmath=True, error_model="numpy", cache=True)
def gather_pre(enc, pred, enc_rows, pred_rows, out):
    """out (R, J) <- enc[enc_rows] + pred[pred_rows]; enc (B T, J), pred (B U, J) of
    out's dtype, C-contiguous."""
    R, J = out.shape
    for i in range(R):
        e = enc_rows[i]
        p = pred_rows[i]
        for j in range(J):
            out[i, j] = enc[e, j] + pred[p, j]


@njit(fastmath=True, error_model="numpy", cache=True)
def scatter_pre_grad(d_pre, enc_rows, pred_rows, d_enc, d_pred):
    """d_enc[enc_rows[i]] += d_pre[i], d_pred[pred_rows[i]] += d_pre[i]."""
    R, J = d_pre.shape
    for i in range(R):
        e = enc_rows[i]
        p = pred_rows[i]
        for j in range(J):
            g = d_pre[i, j]
            d_enc[e, j] += g
            d_pred[p, j] += g


@njit(**_OPTS)
def _node(enc_rows, pred_rows, i, T, U, Tp, Up):
    """(b, u, node index on the (B, T', U') grid) of tile row i."""
    p = pred_rows[i]
    b = p // U
    u = p - b * U
    t = enc_rows[i] - b * T
    return b, u, (b * Tp + t) * Up + u


@njit(fastmath=True, error_model="numpy", cache=True)
def _scale_flush_range(g, lo, hi, c):
    """g[lo:hi] *= c (c rounded to g's dtype), results below the smallest normal
    number flushed to 0 (see :func:`_flush`)."""
    s = g.dtype.type(c)
    tiny = np.finfo(g.dtype).tiny
    zero = g.dtype.type(0.0)
    for k in range(lo, hi):
        v = g[k] * s
        g[k] = v if abs(v) >= tiny else zero


@njit(**_OPTS)
def _flush(v, like):
    """``v`` (float64) in the dtype of array ``like``, 0 when below its smallest
    normal number. The gradient of a node that paths almost never visit is
    denormal (occupancies like e**-100); denormal operands make the tile's matmuls
    about 100 times slower (measured: float32 torch.mm on this CPU), and these
    values do not change a float32 sum."""
    x = like.dtype.type(v)
    return x if abs(x) >= np.finfo(like.dtype).tiny else like.dtype.type(0.0)


@njit(**_OPTS)
def _softmax_scale(zf, lo, hi, lse):
    """zf[lo:hi] <- exp(zf[lo:hi] - l32) in place; returns exp(l32 - lse), the
    factor that completes the softmax (l32 = lse rounded to zf's dtype)."""
    l32 = zf.dtype.type(lse)
    ops.exp_range(zf, lo, hi, l32, zf, lo)
    return math.exp(np.float64(l32) - lse)


@njit(**_OPTS)
def extract_multiblank(
    z,
    enc_rows,
    pred_rows,
    T,
    U,
    labels,
    label_lens,
    blank,
    big_ids,
    sigma,
    rows,
    lse,
    bad,
    scratch,
):
    """Forward: the planes of a tile of multi-blank (standard: no big blanks) logits.

    z: (R, V) logits (float32 / float64), C-contiguous; labels (B, L) int64;
    label_lens (B,) int64; big_ids (N,) int64.
    rows: (B, T', U', N + 3) float64 out: [lp_blank, lp_label (-inf on u = L_b),
        lp_big_i..., 1]; lse: (B, T', U') float64 out; bad: (B,) uint8, set to 1 for
        an utterance with a NaN / +inf logit or a row that is -inf throughout.
    scratch: (V,) of z's dtype.
    """
    R, V = z.shape
    Tp, Up, K1 = rows.shape[1], rows.shape[2], rows.shape[3]
    N = big_ids.size
    zf = z.reshape(R * V)
    rf = rows.reshape(rows.size)
    lf = lse.reshape(lse.size)
    uV = np.uint64(V)
    for i in range(R):
        b, u, node = _node(enc_rows, pred_rows, i, T, U, Tp, Up)
        lo = np.uint64(i) * uV
        hi = lo + uV
        m, isbad = ops.max_and_check(zf, lo, hi)
        if isbad or m == _NEG_INF:
            bad[b] = 1
            continue
        s = ops.exp_sum(zf, lo, hi, m, scratch, np.uint64(0))
        d = np.float64(m) + math.log(s)
        lf[node] = d
        d += sigma
        p = node * K1
        rf[p] = np.float64(zf[lo + np.uint64(blank)]) - d
        if u < label_lens[b]:
            rf[p + 1] = np.float64(zf[lo + np.uint64(labels[b, u])]) - d
        else:
            rf[p + 1] = _NEG_INF
        for k in range(N):
            rf[p + 2 + k] = np.float64(zf[lo + np.uint64(big_ids[k])]) - d
        rf[p + K1 - 1] = 1.0


@njit(**_OPTS)
def apply_multiblank(
    z,
    enc_rows,
    pred_rows,
    T,
    U,
    labels,
    label_lens,
    blank,
    big_ids,
    rows,
    lse,
    factors,
    fastemit_lambda,
    clamp,
    scratch,
):
    """Backward: z (R, V), the tile's logits as in forward, becomes
    ``factors[b] * clip(d cost_b / d z, -clamp, clamp)`` in place (module docstring).

    rows: (B, T', U', N + 3) float64 occupancies [W_blank, W_label, W_big_i..., *]
    of the lattice; lse: (B, T', U') float64 from forward; factors: (B,) float64
    (reduction weight times incoming gradient; 0 for an impossible utterance);
    scratch: (>= N,) float64. Values below the smallest normal number of z's dtype
    are flushed to 0 (:func:`_flush`).
    """
    R, V = z.shape
    Tp, Up, K1 = rows.shape[1], rows.shape[2], rows.shape[3]
    N = big_ids.size
    zf = z.reshape(R * V)
    rf = rows.reshape(rows.size)
    lf = lse.reshape(lse.size)
    uV = np.uint64(V)
    lam1 = 1.0 + fastemit_lambda
    for i in range(R):
        b, u, node = _node(enc_rows, pred_rows, i, T, U, Tp, Up)
        lo = np.uint64(i) * uV
        hi = lo + uV
        f = factors[b]
        if f == 0.0:
            ops.zero_range(zf, lo, hi)
            continue
        p = node * K1
        w_blank = rf[p]
        w_label = rf[p + 1]
        gamma = w_blank + w_label
        for k in range(N):
            gamma += rf[p + 2 + k]
        c = (gamma + fastemit_lambda * w_label) * f
        c *= _softmax_scale(zf, lo, hi, lf[node])
        kb = lo + np.uint64(blank)
        g_blank = zf[kb] * c - w_blank * f
        has_label = u < label_lens[b]
        kl = lo + np.uint64(labels[b, u]) if has_label else kb
        g_label = zf[kl] * c - lam1 * w_label * f
        for k in range(N):
            kk = lo + np.uint64(big_ids[k])
            scratch[k] = zf[kk] * c - rf[p + 2 + k] * f
        _scale_flush_range(zf, lo, hi, c)
        for k in range(N):
            zf[lo + np.uint64(big_ids[k])] = _flush(scratch[k], zf)
        zf[kb] = _flush(g_blank, zf)
        if has_label:
            zf[kl] = _flush(g_label, zf)
        if clamp > 0.0:
            ops.clamp_range(zf, lo, hi, clamp * abs(f))


@njit(**_OPTS)
def extract_tdt(
    z,
    V,
    enc_rows,
    pred_rows,
    T,
    U,
    labels,
    label_lens,
    blank,
    sigma,
    rows,
    lse,
    bad,
    scratch,
):
    """Forward: the planes of a tile of TDT logits.

    z: (R, V + D) logits (V token logits, then D duration logits).
    rows: (B, T', U', D + 4) float64 out: [tok_blank, tok_label (-inf on u = L_b),
        dur_j..., 1, 1] (sigma in the token log-probs only); lse: (B, T', U', 2)
        float64 out, the token and the duration normalisers; bad, scratch: as
        :func:`extract_multiblank`.
    """
    R, VD = z.shape
    D = VD - V
    Tp, Up, K1 = rows.shape[1], rows.shape[2], rows.shape[3]
    zf = z.reshape(R * VD)
    rf = rows.reshape(rows.size)
    lf = lse.reshape(lse.size)
    uVD = np.uint64(VD)
    uV = np.uint64(V)
    for i in range(R):
        b, u, node = _node(enc_rows, pred_rows, i, T, U, Tp, Up)
        lo = np.uint64(i) * uVD
        mid = lo + uV
        hi = lo + uVD
        m, isbad = ops.max_and_check(zf, lo, mid)
        md, isbad_d = ops.max_and_check(zf, mid, hi)
        if isbad or isbad_d or m == _NEG_INF or md == _NEG_INF:
            bad[b] = 1
            continue
        s = ops.exp_sum(zf, lo, mid, m, scratch, np.uint64(0))
        d = np.float64(m) + math.log(s)
        sd = 0.0
        for j in range(D):
            sd += math.exp(np.float64(zf[mid + np.uint64(j)]) - np.float64(md))
        dd = np.float64(md) + math.log(sd)
        lf[2 * node] = d
        lf[2 * node + 1] = dd
        d += sigma
        p = node * K1
        rf[p] = np.float64(zf[lo + np.uint64(blank)]) - d
        if u < label_lens[b]:
            rf[p + 1] = np.float64(zf[lo + np.uint64(labels[b, u])]) - d
        else:
            rf[p + 1] = _NEG_INF
        for j in range(D):
            rf[p + 2 + j] = np.float64(zf[mid + np.uint64(j)]) - dd
        rf[p + D + 2] = 1.0
        rf[p + D + 3] = 1.0


@njit(**_OPTS)
def apply_tdt(
    z,
    V,
    enc_rows,
    pred_rows,
    T,
    U,
    labels,
    label_lens,
    blank,
    rows,
    lse,
    factors,
    fastemit_lambda,
    clamp,
):
    """Backward: z (R, V + D), the tile's logits as in forward, becomes
    ``factors[b] * clip(d cost_b / d z, -clamp, clamp)`` in place (module docstring).

    rows: (B, T', U', D + 4) float64 occupancies [W_blank, W_label, W_dur_j..., *, *];
    lse: (B, T', U', 2) float64 from forward; factors and the flush to 0: as
    :func:`apply_multiblank`.
    """
    R, VD = z.shape
    D = VD - V
    Tp, Up, K1 = rows.shape[1], rows.shape[2], rows.shape[3]
    zf = z.reshape(R * VD)
    rf = rows.reshape(rows.size)
    lf = lse.reshape(lse.size)
    uVD = np.uint64(VD)
    uV = np.uint64(V)
    lam1 = 1.0 + fastemit_lambda
    for i in range(R):
        b, u, node = _node(enc_rows, pred_rows, i, T, U, Tp, Up)
        lo = np.uint64(i) * uVD
        mid = lo + uV
        hi = lo + uVD
        f = factors[b]
        if f == 0.0:
            ops.zero_range(zf, lo, hi)
            continue
        p = node * K1
        w_blank = rf[p]
        w_label = rf[p + 1]
        gamma = w_blank + w_label
        c = (gamma + fastemit_lambda * w_label) * f
        c *= _softmax_scale(zf, lo, mid, lf[2 * node])
        kb = lo + np.uint64(blank)
        g_blank = zf[kb] * c - w_blank * f
        has_label = u < label_lens[b]
        kl = lo + np.uint64(labels[b, u]) if has_label else kb
        g_label = zf[kl] * c - lam1 * w_label * f
        _scale_flush_range(zf, lo, mid, c)
        zf[kb] = _flush(g_blank, zf)
        if has_label:
            zf[kl] = _flush(g_label, zf)
        dd = lf[2 * node + 1]
        cd = gamma * f
        for j in range(D):
            k = mid + np.uint64(j)
            q = math.exp(np.float64(zf[k]) - dd)
            zf[k] = _flush(cd * q - rf[p + 2 + j] * f, zf)
        if clamp > 0.0:
            ops.clamp_range(zf, lo, hi, clamp * abs(f))
