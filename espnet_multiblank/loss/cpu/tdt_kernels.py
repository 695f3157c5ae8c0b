"""Numba CPU kernels of the TDT loss: three passes, both log-softmaxes fused.

Notation (utterance b; ``x = acts[b, t, u, :]`` holds V token logits then D duration
logits; T_b frames, L_b labels, U_b = L_b + 1; the recursions are those of
``docs/lattice.md`` section 3):

    tok(t,u,k) = x_k - LSE(x[:V]) - sigma          dur(t,u,j) = x_{V+j} - LSE(x[V:])

Pass 1, :func:`tdt_row_statistics` (rows (b, t) over threads): for every valid row
(t < T_b, u < U_b) the two log-softmax denominators, and the step log-probs the DP
needs, in a (B, T, U, 2 + D) float64 workspace ``lp``: slot 0 ``tok(blank)``, slot 1
``tok(y_u)`` (u < L_b), slot 2 + j ``dur(j)``. ``exp(x - max)`` of both parts is
written once, into the gradient buffer when the gradient is wanted (pass 3 scales it
instead of reading the logits and exponentiating again), and the reciprocals of the
two sums of exps are kept in ``inv_sums`` (B, T, U, 2).

Pass 2, :func:`tdt_alpha_beta` (utterances over threads, float64): alpha in raster
order (t ascending, u ascending: a label with duration 0 goes from (t, u - 1) to
(t, u)), log P, and when the gradient is wanted beta in the reverse order. The
backward sweep reuses the ``exp(term - max)`` of beta's log-sum-exp to form the step
occupancies ``W = exp(alpha(t,u) + step log-prob + beta(dest) - log P)`` and writes,
over ``lp[b, t, u]`` (no longer needed): slot 0 the blank steps' total W_blank, slot 1
the label steps' total W_label, slot 2 + j the total of the steps with duration j.

Pass 3, :func:`tdt_gradients` (rows over threads), with p = softmax(x[:V]) and
q = softmax(x[V:]), gamma = W_blank + W_label (= exp(alpha + beta - log P)):

    g[k]     = (gamma + lambda W_label) p_k - W_blank [k = blank]
               - (1 + lambda) W_label [k = y_u]                       (k < V)
    g[V + j] = gamma q_j - W_dur(j)

clipped to [-clamp, clamp] (clamp > 0) and multiplied by the utterance's weight.
Padding rows and impossible utterances get exactly 0.

The logits are read once (pass 1); pass 3 streams the buffer of exps once more and
writes the gradient in place. No transcendental function runs per element in pass 3.
"""

import math

import numpy as np
from numba import njit, prange

from espnet_multiblank.loss.cpu.row_ops import (
    row_clamp,
    row_exp,
    row_has_nan_or_posinf,
    row_max,
    row_sum_checked,
    row_sum_fast,
)

_NEG_INF = -np.inf


@njit(cache=True)
def _max_ignoring_neginf(x):
    """max over the row (-inf entries do not count; -inf if all are -inf)."""
    m = _NEG_INF
    for k in range(x.size):
        if x[k] > m:
            m = x[k]
    return m


@njit(fastmath=True, cache=True)
def _row_scale(g, c):
    """g <- c * g in place (vectorised)."""
    s = g.dtype.type(c)
    for k in range(g.size):
        g[k] = g[k] * s


@njit(cache=True)
def _part_log_sum_exp(x, e, ibuf):
    """LSE of the row ``x`` with ``e <- exp(x - max)``; returns (LSE, 1 / sum e).

    Returns NaN for a row with NaN / +inf or only -inf entries (a NaN cost for the
    caller).
    """
    m = row_max(x)
    if not math.isfinite(row_sum_checked(x)):
        if row_has_nan_or_posinf(x):
            return math.nan, math.nan
        m = _max_ignoring_neginf(x)
        if m == _NEG_INF:
            return math.nan, math.nan
    row_exp(x, m, 1.0, e, ibuf)
    s = np.float64(row_sum_fast(e))
    return np.float64(m) + math.log(s), 1.0 / s


@njit(cache=True)
def _short_log_sum_exp(x, e):
    """:func:`_part_log_sum_exp` for the few duration logits: scalar float64 loops
    (a vectorised row pass costs more than it saves on a handful of elements)."""
    m = _NEG_INF
    for k in range(x.size):
        v = np.float64(x[k])
        if v != v or v == np.inf:
            return math.nan, math.nan
        if v > m:
            m = v
    if m == _NEG_INF:
        return math.nan, math.nan
    s = 0.0
    for k in range(x.size):
        ek = math.exp(np.float64(x[k]) - m)
        e[k] = ek
        s += ek
    return m + math.log(s), 1.0 / s


@njit(parallel=True, cache=True)
def tdt_row_statistics(
    acts,
    labels,
    act_lens,
    label_lens,
    blank,
    num_tokens,
    sigma,
    lp,
    inv_sums,
    bad,
    exps,
    keep_exps,
):
    """Pass 1: denominators, step log-probs and exps of every valid row.

    Args:
        acts: (B, T, U, V + D) float32/64 raw logits, C-contiguous.
        labels: (B, L) int64; act_lens, label_lens: (B,) int64.
        blank: blank index (< V); num_tokens: V.  sigma: float.
        lp: (B, T, U, 2 + D) float64 out: tok(blank), tok(y_u), dur(0..D-1).
        inv_sums: (B, T, U, 2) float64 out: 1 / sum exp(x - max) of each part.
        bad: (B,) uint8 out: 1 when a valid row holds NaN / +inf (or a part only -inf).
        exps: (B, T, U, V + D) acts dtype out (the gradient buffer), written with
            exp(x - max) of each part when ``keep_exps``; unused otherwise.
        keep_exps: bool.
    """
    B, T, U, VD = acts.shape
    V = num_tokens
    D = VD - V
    for bt in prange(B * T):
        b = bt // T
        t = bt - b * T
        if t >= act_lens[b]:
            continue
        Ub = label_lens[b] + 1
        ibuf = np.empty(VD, np.int32)
        scratch = np.empty(VD, acts.dtype)
        for u in range(Ub):
            x = acts[b, t, u]
            e = exps[b, t, u] if keep_exps else scratch
            d_tok, inv_tok = _part_log_sum_exp(x[:V], e[:V], ibuf[:V])
            d_dur, inv_dur = _short_log_sum_exp(x[V:], e[V:])
            if math.isnan(d_tok) or math.isnan(d_dur):
                bad[b] = 1
                continue
            inv_sums[b, t, u, 0] = inv_tok
            inv_sums[b, t, u, 1] = inv_dur
            off = d_tok + sigma
            lp[b, t, u, 0] = x[blank] - off
            if u < Ub - 1:
                lp[b, t, u, 1] = x[labels[b, u]] - off
            for j in range(D):
                lp[b, t, u, 2 + j] = x[V + j] - d_dur


@njit(parallel=True, cache=True)
def tdt_alpha_beta(lp, act_lens, label_lens, durations, alpha, beta, log_p, need_grad):
    """Pass 2: alpha, log P and, when need_grad, beta and the step occupancies.

    Args:
        lp: (B, T, U, 2 + D) float64 from pass 1; when need_grad, overwritten at every
            valid cell of a possible utterance with [W_blank, W_label, W_dur(0..D-1)].
        durations: (D,) int64, any order.
        alpha, beta: (B, T, U) float64 out (cells t < T_b, u < U_b only).
        log_p: (B,) float64 out: log P (0 for T_b = 0 = L_b, -inf if impossible).
    """
    B, T, U, K = lp.shape
    D = durations.size
    for b in prange(B):
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        if Tb == 0:
            log_p[b] = 0.0 if Ub == 1 else _NEG_INF
            continue
        buf = np.empty(2 * D, np.float64)
        for t in range(Tb):
            for u in range(Ub):
                if t == 0 and u == 0:
                    alpha[b, 0, 0] = 0.0
                    continue
                n = 0
                m = _NEG_INF
                for j in range(D):
                    e = durations[j]
                    s = t - e
                    if s < 0:
                        continue
                    if e >= 1:  # blank from (s, u)
                        v = alpha[b, s, u] + lp[b, s, u, 0] + lp[b, s, u, 2 + j]
                        buf[n] = v
                        n += 1
                        m = max(m, v)
                    if u >= 1:  # label y_{u-1} from (s, u - 1)
                        v = alpha[b, s, u - 1] + lp[b, s, u - 1, 1]
                        v += lp[b, s, u - 1, 2 + j]
                        buf[n] = v
                        n += 1
                        m = max(m, v)
                if m == _NEG_INF:
                    alpha[b, t, u] = _NEG_INF
                    continue
                acc = 0.0
                for i in range(n):
                    acc += math.exp(buf[i] - m)
                alpha[b, t, u] = m + math.log(acc)
        # the path ends with a blank from row L_b landing exactly on T_b
        L = Ub - 1
        n = 0
        m = _NEG_INF
        for j in range(D):
            e = durations[j]
            s = Tb - e
            if e >= 1 and s >= 0:
                v = alpha[b, s, L] + lp[b, s, L, 0] + lp[b, s, L, 2 + j]
                buf[n] = v
                n += 1
                m = max(m, v)
        if m == _NEG_INF:
            log_p[b] = _NEG_INF
            continue
        acc = 0.0
        for i in range(n):
            acc += math.exp(buf[i] - m)
        lP = m + math.log(acc)
        log_p[b] = lP
        if not need_grad:
            continue
        # buf[j]: blank step with duration j, buf[D + j]: label step with duration j
        for t in range(Tb - 1, -1, -1):
            for u in range(Ub - 1, -1, -1):
                last_row = u == L
                lpb = lp[b, t, u, 0]
                lpl = lp[b, t, u, 1]
                m = _NEG_INF
                for j in range(D):
                    e = durations[j]
                    dest = t + e
                    vb = _NEG_INF
                    if e >= 1:
                        if dest < Tb:
                            vb = lpb + lp[b, t, u, 2 + j] + beta[b, dest, u]
                        elif dest == Tb and last_row:
                            vb = lpb + lp[b, t, u, 2 + j]
                    vl = _NEG_INF
                    if not last_row and dest < Tb:
                        vl = lpl + lp[b, t, u, 2 + j] + beta[b, dest, u + 1]
                    buf[j] = vb
                    buf[D + j] = vl
                    m = max(m, max(vb, vl))
                if m == _NEG_INF:
                    beta[b, t, u] = _NEG_INF
                    for k in range(K):
                        lp[b, t, u, k] = 0.0
                    continue
                acc = 0.0
                for i in range(2 * D):
                    buf[i] = math.exp(buf[i] - m)
                    acc += buf[i]
                beta[b, t, u] = m + math.log(acc)
                c = math.exp(alpha[b, t, u] + m - lP)  # 0 for an unreachable node
                w_blank = 0.0
                w_label = 0.0
                for j in range(D):
                    wb = c * buf[j]
                    wl = c * buf[D + j]
                    w_blank += wb
                    w_label += wl
                    lp[b, t, u, 2 + j] = wb + wl
                lp[b, t, u, 0] = w_blank
                lp[b, t, u, 1] = w_label


@njit(parallel=True, cache=True)
def tdt_gradients(
    labels,
    act_lens,
    label_lens,
    blank,
    num_tokens,
    inv_sums,
    occupancy,
    log_p,
    fastemit_lambda,
    clamp,
    weights,
    grads,
):
    """Pass 3: grads (B, T, U, V + D) = weighted, clamped d cost_b / d acts, in place.

    Args:
        inv_sums: (B, T, U, 2) float64 from pass 1.
        occupancy: (B, T, U, 2 + D) float64 from pass 2 (W_blank, W_label, W_dur).
        log_p: (B,) float64; weights: (B,) float64 per-utterance factors, any sign
            (folded into the coefficients and the clamp threshold |w| * clamp).
        grads: in, exp(x - max) of both parts at the valid rows (pass 1); out, the
            gradient, every element written (0 at padding and impossible utterances).
    """
    B, T, U, VD = grads.shape
    V = num_tokens
    D = VD - V
    lam1 = 1.0 + fastemit_lambda
    for bt in prange(B * T):
        b = bt // T
        t = bt - b * T
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        ok = math.isfinite(log_p[b])
        w = weights[b]
        for u in range(U):
            g = grads[b, t, u]
            if t >= Tb or u >= Ub or not ok:
                g[:] = 0
                continue
            w_blank = occupancy[b, t, u, 0]
            w_label = occupancy[b, t, u, 1]
            gamma = w_blank + w_label
            _row_scale(
                g[:V], (gamma + fastemit_lambda * w_label) * w * inv_sums[b, t, u, 0]
            )
            g[blank] -= w_blank * w
            if u < Ub - 1:
                g[labels[b, u]] -= lam1 * w_label * w
            c_dur = gamma * w * inv_sums[b, t, u, 1]
            for j in range(D):
                g[V + j] = g[V + j] * c_dur - occupancy[b, t, u, 2 + j] * w
            if clamp > 0.0:
                row_clamp(g, g.dtype.type(clamp * abs(w)))  # w may be < 0
