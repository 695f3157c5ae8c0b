"""Numba CPU kernels of the multi-blank RNN-T loss: three passes, fused log-softmax.

Notation (per utterance b; ``x = acts[b, t, u, :]``, T_b frames, U_b = L_b + 1):
    denom(t,u) = log sum_k exp(x_k)                  (pass 1, kept as (B,T,U) float64)
    lp(t,u,k)  = x_k - denom(t,u) - sigma            (only k = blank, y_u, big blanks:
                                                      a (B,T,U,N+2) float64 workspace)
    alpha(0,0) = 0
    alpha(t,u) = LSE( alpha(t-1,u)   + lp(t-1,u,blank),
                      alpha(t,u-1)   + lp(t,u-1,y_{u-1})         [u >= 1],
                      alpha(t-d_i,u) + lp(t-d_i,u,blank-1-i)     [t >= d_i] )
    beta(t,u)  = LSE( lp(t,u,blank) + beta(t+1,u),
                      lp(t,u,y_u)   + beta(t,u+1)                [u < U_b-1],
                      lp(t,u,blank-1-i) + beta(t+d_i,u) )
                 with beta(T_b, U_b-1) = 0 (the end) and transitions that overshoot T_b,
                 or reach T_b with labels left, excluded
    log P      = beta(0,0) = LSE over the transitions into the end      (pass 2)
    grad(t,u,k) = w_b * [ (gamma + lambda * W_label) * softmax(x)_k
                          - sum over transitions e leaving (t,u) with symbol k of
                            (1 + lambda [e is the label]) * W_e ]        (pass 3)
                 gamma = exp(alpha + beta - log P), W_e = exp(alpha + lp_e + beta(dest)
                 - log P); clipped to [-clamp, clamp] before the weight w_b.

The logits are read twice (pass 1 and pass 3) and the gradient written once: no
log-probability tensor is materialised. Rows are (b, t) pairs spread over threads with
``prange``; alpha/beta run one utterance per thread in float64.
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


@njit(cache=True, inline="always")
def _log_add(a, b):
    if a == _NEG_INF:
        return b
    if b == _NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(parallel=True, cache=True)
def row_statistics(acts, labels, act_lens, label_lens, blank, big_ids, sigma, lp, denom, bad):
    """Pass 1: per valid row (t < T_b, u < U_b) the log-softmax denominator and the
    log-probs (minus sigma) of blank (slot 0), label y_u (slot 1), big blanks (2 + i).

    acts: (B,T,U,V) float32/64; labels: (B,L) int64; act_lens, label_lens: (B,) int64;
    big_ids: (N,) int64; lp: (B,T,U,N+2) float64 out; denom: (B,T,U) float64 out;
    bad: (B,) uint8 out, set to 1 when a valid row holds NaN or +inf (or only -inf).
    """
    B, T, U, V = acts.shape
    N = big_ids.size
    for bt in prange(B * T):
        b = bt // T
        t = bt - b * T
        if t >= act_lens[b]:
            continue
        Ub = label_lens[b] + 1
        ibuf = np.empty(V, np.int32)
        ebuf = np.empty(V, acts.dtype)
        for u in range(Ub):
            x = acts[b, t, u]
            m = row_max(x)
            if not math.isfinite(row_sum_checked(x)):
                if row_has_nan_or_posinf(x):
                    bad[b] = 1
                    continue
                m = row_max_finite(x)
                if m == _NEG_INF:
                    bad[b] = 1
                    continue
            row_exp(x, m, ebuf, ibuf)
            d = np.float64(m) + math.log(np.float64(row_sum_fast(ebuf)))
            denom[b, t, u] = d
            lp[b, t, u, 0] = x[blank] - d - sigma
            if u < Ub - 1:
                lp[b, t, u, 1] = x[labels[b, u]] - d - sigma
            for i in range(N):
                lp[b, t, u, 2 + i] = x[big_ids[i]] - d - sigma


@njit(cache=True)
def row_max_finite(x):
    """max over the row ignoring -inf entries, -inf if all are -inf (rare path)."""
    m = _NEG_INF
    for k in range(x.size):
        if x[k] > m:
            m = x[k]
    return m


@njit(parallel=True, cache=True)
def alpha_beta(lp, act_lens, label_lens, durations, alpha, beta, log_p, need_beta):
    """Pass 2: alpha (and beta) per utterance, float64, one utterance per thread.

    lp: (B,T,U,N+2) float64; durations: (N,) int64; alpha, beta: (B,T,U) float64 out
    (only cells t < T_b, u < U_b are written); log_p: (B,) float64 out (0 for T_b = 0 =
    L_b, -inf for an impossible utterance).
    """
    B, T, U, _ = lp.shape
    N = durations.size
    for b in prange(B):
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        if Tb == 0:
            log_p[b] = 0.0 if Ub == 1 else _NEG_INF
            continue
        for t in range(Tb):
            for u in range(Ub):
                if t == 0 and u == 0:
                    alpha[b, 0, 0] = 0.0
                    continue
                a = _NEG_INF
                if t > 0:
                    a = alpha[b, t - 1, u] + lp[b, t - 1, u, 0]
                if u > 0:
                    a = _log_add(a, alpha[b, t, u - 1] + lp[b, t, u - 1, 1])
                for i in range(N):
                    d = durations[i]
                    if t >= d:
                        a = _log_add(a, alpha[b, t - d, u] + lp[b, t - d, u, 2 + i])
                alpha[b, t, u] = a
        u = Ub - 1
        ll = alpha[b, Tb - 1, u] + lp[b, Tb - 1, u, 0]
        for i in range(N):
            d = durations[i]
            if Tb >= d:
                ll = _log_add(ll, alpha[b, Tb - d, u] + lp[b, Tb - d, u, 2 + i])
        log_p[b] = ll
        if not need_beta:
            continue
        for t in range(Tb - 1, -1, -1):
            for u in range(Ub - 1, -1, -1):
                last_row = u == Ub - 1
                bb = _NEG_INF
                if t + 1 < Tb:
                    bb = lp[b, t, u, 0] + beta[b, t + 1, u]
                elif last_row:  # t + 1 == Tb: the blank ends the path
                    bb = lp[b, t, u, 0]
                if not last_row:
                    bb = _log_add(bb, lp[b, t, u, 1] + beta[b, t, u + 1])
                for i in range(N):
                    d = durations[i]
                    if t + d < Tb:
                        bb = _log_add(bb, lp[b, t, u, 2 + i] + beta[b, t + d, u])
                    elif t + d == Tb and last_row:
                        bb = _log_add(bb, lp[b, t, u, 2 + i])
                beta[b, t, u] = bb


@njit(parallel=True, cache=True)
def gradients(
    acts,
    labels,
    act_lens,
    label_lens,
    blank,
    big_ids,
    durations,
    lp,
    denom,
    alpha,
    beta,
    log_p,
    fastemit_lambda,
    clamp,
    weights,
    grads,
):
    """Pass 3: grads (B,T,U,V) (acts dtype, out) = weighted, clamped d cost_b / d acts.

    Padding rows (t >= T_b or u >= U_b) and impossible utterances get exactly 0.
    weights: (B,) float64 > 0. The weight is folded into the coefficients (and the clamp
    threshold scaled by it), so each row costs one vectorised exp loop.
    """
    B, T, U, V = acts.shape
    N = big_ids.size
    lam = fastemit_lambda
    for bt in prange(B * T):
        b = bt // T
        t = bt - b * T
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        lP = log_p[b]
        ibuf = np.empty(V, np.int32)
        w = weights[b]
        for u in range(U):
            g = grads[b, t, u]
            if t >= Tb or u >= Ub or not math.isfinite(lP):
                g[:] = 0
                continue
            a = alpha[b, t, u] - lP
            last_row = u == Ub - 1
            w_blank = 0.0
            if t + 1 < Tb:
                w_blank = math.exp(a + lp[b, t, u, 0] + beta[b, t + 1, u])
            elif last_row:
                w_blank = math.exp(a + lp[b, t, u, 0])
            w_label = 0.0
            if not last_row:
                w_label = math.exp(a + lp[b, t, u, 1] + beta[b, t, u + 1])
            coef = (math.exp(a + beta[b, t, u]) + lam * w_label) * w
            x = acts[b, t, u]
            if coef > 0.0:
                # coef * softmax(x)_k = exp(x_k - (denom - log coef))
                row_exp(x, denom[b, t, u] - math.log(coef), g, ibuf)
            else:
                g[:] = 0
            g[blank] -= w_blank * w
            if not last_row:
                g[labels[b, u]] -= (1.0 + lam) * w_label * w
            for i in range(N):
                d = durations[i]
                wi = 0.0
                if t + d < Tb:
                    wi = math.exp(a + lp[b, t, u, 2 + i] + beta[b, t + d, u])
                elif t + d == Tb and last_row:
                    wi = math.exp(a + lp[b, t, u, 2 + i])
                g[big_ids[i]] -= wi * w
            if clamp > 0.0:
                row_clamp(g, g.dtype.type(clamp * w))
