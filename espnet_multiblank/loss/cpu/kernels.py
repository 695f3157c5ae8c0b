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


@njit(parallel=True, cache=True)
def row_statistics(
    acts, labels, act_lens, label_lens, blank, big_ids, sigma, lp, denom, bad
):
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
            row_exp(x, m, 1.0, ebuf, ibuf)
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
def alpha_beta(
    lp, act_lens, label_lens, durations, alpha, beta, log_p, fastemit_lambda, need_grad
):
    """Pass 2: alpha, log P and, when need_grad, beta and the gradient coefficients.

    lp: (B,T,U,N+2) float64; durations: (N,) int64; alpha, beta: (B,T,U) float64 out
    (only cells t < T_b, u < U_b are written); log_p: (B,) float64 out (0 for T_b = 0 =
    L_b, -inf for an impossible utterance).

    Each log-sum-exp is taken as ``m + log(sum_i exp(v_i - m))``. When need_grad, the
    backward sweep reuses the ``exp(e_i - m)`` of beta's log-sum-exp to form, with one
    more exp, the transition occupancies W_e = exp(alpha + lp_e + beta(dest) - log P),
    written over ``lp[b,t,u,:]`` (no longer needed), and the softmax coefficient
    ``gamma + lambda * W_label`` written over ``alpha[b,t,u]``: pass 3 then needs no
    transcendental function per cell.
    """
    B, T, U, K = lp.shape
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
                v0 = alpha[b, t - 1, u] + lp[b, t - 1, u, 0] if t > 0 else _NEG_INF
                v1 = alpha[b, t, u - 1] + lp[b, t, u - 1, 1] if u > 0 else _NEG_INF
                m = max(v0, v1)
                for i in range(N):
                    d = durations[i]
                    if t >= d:
                        m = max(m, alpha[b, t - d, u] + lp[b, t - d, u, 2 + i])
                if m == _NEG_INF:
                    alpha[b, t, u] = _NEG_INF
                    continue
                s = math.exp(v0 - m) + math.exp(v1 - m)
                for i in range(N):
                    d = durations[i]
                    if t >= d:
                        s += math.exp(alpha[b, t - d, u] + lp[b, t - d, u, 2 + i] - m)
                alpha[b, t, u] = m + math.log(s)
        u = Ub - 1
        m = alpha[b, Tb - 1, u] + lp[b, Tb - 1, u, 0]
        for i in range(N):
            d = durations[i]
            if Tb >= d:
                m = max(m, alpha[b, Tb - d, u] + lp[b, Tb - d, u, 2 + i])
        if m == _NEG_INF:
            log_p[b] = _NEG_INF
            continue
        s = math.exp(alpha[b, Tb - 1, u] + lp[b, Tb - 1, u, 0] - m)
        for i in range(N):
            d = durations[i]
            if Tb >= d:
                s += math.exp(alpha[b, Tb - d, u] + lp[b, Tb - d, u, 2 + i] - m)
        lP = m + math.log(s)
        log_p[b] = lP
        if not need_grad:
            continue
        e = np.empty(K, np.float64)
        for t in range(Tb - 1, -1, -1):
            for u in range(Ub - 1, -1, -1):
                last_row = u == Ub - 1
                # e_k = lp_k + beta(destination of transition k), -inf if not allowed
                if t + 1 < Tb:
                    e[0] = lp[b, t, u, 0] + beta[b, t + 1, u]
                elif last_row:  # t + 1 == Tb: the blank ends the path
                    e[0] = lp[b, t, u, 0]
                else:
                    e[0] = _NEG_INF
                e[1] = _NEG_INF if last_row else lp[b, t, u, 1] + beta[b, t, u + 1]
                for i in range(N):
                    d = durations[i]
                    if t + d < Tb:
                        e[2 + i] = lp[b, t, u, 2 + i] + beta[b, t + d, u]
                    elif t + d == Tb and last_row:
                        e[2 + i] = lp[b, t, u, 2 + i]
                    else:
                        e[2 + i] = _NEG_INF
                m = e[0]
                for k in range(1, K):
                    m = max(m, e[k])
                if m == _NEG_INF:
                    beta[b, t, u] = _NEG_INF
                    for k in range(K):
                        lp[b, t, u, k] = 0.0
                    alpha[b, t, u] = 0.0
                    continue
                s = 0.0
                for k in range(K):
                    e[k] = math.exp(e[k] - m)
                    s += e[k]
                beta[b, t, u] = m + math.log(s)
                c = math.exp(alpha[b, t, u] + m - lP)  # -inf alpha gives c = 0
                for k in range(K):
                    lp[b, t, u, k] = c * e[k]
                alpha[b, t, u] = c * s + fastemit_lambda * lp[b, t, u, 1]


@njit(parallel=True, cache=True)
def gradients(
    acts,
    labels,
    act_lens,
    label_lens,
    blank,
    big_ids,
    denom,
    occupancy,
    coef,
    log_p,
    fastemit_lambda,
    clamp,
    weights,
    grads,
):
    """Pass 3: grads (B,T,U,V) (acts dtype, out) = weighted, clamped d cost_b / d acts.

    occupancy: (B,T,U,N+2) W of blank, label, big blanks (from alpha_beta);
    coef: (B,T,U) gamma + lambda * W_label (from alpha_beta).
    Padding rows (t >= T_b or u >= U_b) and impossible utterances get exactly 0.
    weights: (B,) float64 > 0, folded into the coefficients (and the clamp threshold).
    """
    B, T, U, V = acts.shape
    N = big_ids.size
    lam1 = 1.0 + fastemit_lambda
    for bt in prange(B * T):
        b = bt // T
        t = bt - b * T
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        ok = math.isfinite(log_p[b])
        ibuf = np.empty(V, np.int32)
        w = weights[b]
        for u in range(U):
            g = grads[b, t, u]
            if t >= Tb or u >= Ub or not ok:
                g[:] = 0
                continue
            c = coef[b, t, u] * w
            if c > 0.0:
                row_exp(acts[b, t, u], denom[b, t, u], c, g, ibuf)
            else:
                g[:] = 0
            g[blank] -= occupancy[b, t, u, 0] * w
            if u < Ub - 1:
                g[labels[b, u]] -= lam1 * occupancy[b, t, u, 1] * w
            for i in range(N):
                g[big_ids[i]] -= occupancy[b, t, u, 2 + i] * w
            if clamp > 0.0:
                row_clamp(g, g.dtype.type(clamp * w))
