"""Numba CUDA kernels of the TDT loss (``docs/lattice.md`` section 3).

Imports ``numba.cuda`` at import time: import it lazily (the package's ``tdt_compute``
does). Under ``NUMBA_ENABLE_CUDASIM=1`` the kernels run in Numba's CUDA simulator.

Notation: acts (B, T, U, V + D), V token logits (the blank at ``blank``) then D
duration logits; duration j covers ``e_j`` frames (the lattice's ``durations``,
compile-time constants, any order); T_b = act_lens[b], U_b = label_lens[b] + 1,
y_u = labels[b, u]. Precision and row layout as in
:mod:`espnet_multiblank.loss.cuda.kernels`: logits read in their own dtype (bfloat16
as int16 bits), float32 arithmetic over the rows for 32- and 16-bit logits, float64
for everything per row or per cell, a team of threads per row with chunks of loads
in flight.

Four launches on one stream:

1. :func:`tdt_row_stats_kernel` (valid rows): both log-softmax denominators,
   ``denom[b,t,u,0] = LSE(x[:V])`` (the team's online reduction) and
   ``denom[b,t,u,1] = LSE(x[V:])`` (lane 0, whose D duration logits and the two token
   logits the lattice needs are loaded before the row loop), and the step log-probs::

       lpw[b,t,u,0]     = tok(blank) = x[blank] - denom0 - sigma
       lpw[b,t,u,1]     = tok(y_u)   = x[y_u] - denom0 - sigma   (-inf for u = U_b - 1)
       lpw[b,t,u,2 + j] = dur(j)     = x[V + j] - denom1

   A row with NaN / +inf (or a part of only -inf) sets ``bad[b] = 1``.

2. :func:`tdt_alpha_beta_kernel` (grid (B, 2): alpha and beta blocks run
   concurrently, float64), one anti-diagonal n = t + u at a time: every step moves
   to a later diagonal (a label with duration e to n + e + 1, a blank with duration
   e >= 1 to n + e), so the cells of a diagonal are independent (one ``syncthreads``
   each)::

       alpha(t,u) = LSE_j( alpha(t-e_j,u) + tok(t-e_j,u,blank) + dur(t-e_j,u,j)
                                                            [e_j >= 1, t >= e_j],
                           alpha(t-e_j,u-1) + tok(t-e_j,u-1,y_{u-1}) + dur(...,j)
                                                            [u >= 1, t >= e_j] )
       log P = LSE_j alpha(T_b-e_j,L_b) + tok(T_b-e_j,L_b,blank) + dur(T_b-e_j,L_b,j)
               [e_j >= 1, T_b >= e_j]
       beta(t,u) = LSE_j( tok(blank) + dur(j) + beta(t+e_j,u)  [e_j >= 1, t+e_j < T_b],
                          tok(blank) + dur(j)     [e_j >= 1, t+e_j = T_b, u = L_b],
                          tok(y_u) + dur(j) + beta(t+e_j,u+1)  [u < L_b, t+e_j < T_b] )

   The alpha block writes ``logp[b]`` and ``costs[b] = -(1 + lambda) log P`` (+inf
   when impossible, +0.0 for T_b = 0 = L_b, NaN when ``bad[b]``).

3. the weights kernel (``device_ops.make_weights_kernel``; one thread per cell,
   float64): the step occupancies ``W = exp(alpha(t,u) + step log-prob + beta(dest)
   - log P)``, summed per token and per duration and written over the cell's own
   ``lpw`` entries: [W_blank, W_label, W_dur(0), ..., W_dur(D-1)].

4. the gradient kernel (``device_ops.make_grad_kernel``; every row, padding
   included; may run in the autograd backward with the incoming gradient in
   ``factors``), with gamma = W_blank + W_label::

       g[k]     = (gamma + lambda W_label) exp(x_k - denom0) - W_blank [k = blank]
                  - (1 + lambda) W_label [k = y_u]                        (k < V)
       g[V + j] = gamma exp(x_{V+j} - denom1) - W_dur(j)

   clipped to [-clamp, clamp] (clamp > 0), times ``factors[b]``, stored in the
   logits' dtype; exactly 0 at padding rows and for utterances whose log P is not
   finite. Each chunk's loads are issued before its stores.
"""

import math

from numba import cuda

from espnet_multiblank.loss.cuda.device_ops import (
    NEG_INF,
    kernel_getters,
    log_sum_exp,
    make_alpha_beta,
    make_grad_kernel,
    make_weights_kernel,
    nan_max,
    row_denominator,
    row_parts,
    store_step_lps,
)


def _make_row_kernels(storage, durations, team, block, unroll):
    parts = row_parts(storage, team, block, unroll)
    CT, load, row_lse, row_begin = parts.CT, parts.load, parts.row_lse, parts.row_begin
    denom_split = parts.denom_split
    D = len(durations)

    @cuda.jit(device=True, inline=True)
    def row_constants(
        wts, denom, b, t, u, V, blank, lab, gamma, w_label, c_blank, c_label, lam, wdur
    ):
        """The constants of row (b, t, u) that :func:`grad_of` reads (``wdur``: the
        durations' weights)."""
        c_tok = CT(gamma + lam * w_label)
        c_dur = CT(gamma)
        for j in range(D):
            wdur[j] = CT(wts[b, t, u, 2 + j])
        t_hi, t_lo = denom_split(denom[b, t, u, 0])
        e_hi, e_lo = denom_split(denom[b, t, u, 1])
        return (
            V,
            c_tok,
            t_hi,
            t_lo,
            blank,
            lab,
            c_blank,
            c_label,
            c_dur,
            e_hi,
            e_lo,
            wdur,
        )

    @cuda.jit(device=True, inline=True)
    def grad_of(k, x, p):
        """g[k] of the module docstring (before the clamp and the factor)."""
        V, c_tok, t_hi, t_lo, blank, lab, c_blank, c_label, c_dur, e_hi, e_lo, wdur = p
        if k < V:
            g = c_tok * math.exp((x - t_hi) - t_lo)
            if k == blank:
                g -= c_blank
            elif k == lab:
                g -= c_label
        else:
            g = c_dur * math.exp((x - e_hi) - e_lo)
            for i in range(D):
                if k == V + i:
                    g -= wdur[i]
        return g

    @cuda.jit
    def tdt_row_stats_kernel(
        acts, labels, act_lens, label_lens, blank, V, sigma, denom, lpw, bad
    ):
        """Fused log-softmax statistics of both parts, one team per row.

        Args:
            acts: (B, T, U, V + D) logits (storage dtype), C-contiguous.
            labels: (B, L) int64 (L >= 1); act_lens, label_lens: (B,) int64.
            blank, V: ints.  sigma: float.
            denom: (B, T, U, 2) float64 out: LSE of the token / duration part.
            lpw: (B, T, U, 2 + D) float64 out: tok(blank), tok(y_u), dur(0..D-1).
            bad: (B,) int32, set to 1 for a row with NaN / +inf or a part of only
                -inf (zero-initialised by the caller).
        Grid: ceil(B*T*U / (block / TS)) blocks of ``block`` threads.
        """
        # lane 0's loads of the logits the lattice needs: in flight during the row
        # loop
        tid, lane, b, t, u, Ub, active, lead, x_blank, x_label = row_begin(
            acts, labels, act_lens, label_lens, blank
        )
        xd = cuda.local.array(D, CT)
        if lead:
            for j in range(D):
                xd[j] = load(acts[b, t, u, V + j])
        m, s = row_lse(acts, b, t, u, V, lane, active, tid)
        if lead:
            d_tok = row_denominator(m, s)
            # the duration part is short: lane 0, from registers
            md = xd[0]
            for j in range(1, D):
                md = nan_max(md, xd[j])
            sd = CT(0.0)
            if md != CT(NEG_INF):
                for j in range(D):
                    sd += math.exp(xd[j] - md)
            d_dur = row_denominator(md, sd)
            if d_tok != d_tok or d_dur != d_dur:
                bad[b] = 1
            denom[b, t, u, 0] = d_tok
            denom[b, t, u, 1] = d_dur
            store_step_lps(lpw, b, t, u, x_blank, x_label, d_tok + sigma, xd, D, d_dur)

    # grads: (B, T, U, V + D); denom: (B, T, U, 2) float64 (token / duration part);
    # wts: (B, T, U, 2 + D)
    grad_kernel = make_grad_kernel(parts, team, unroll, D, row_constants, grad_of)
    return tdt_row_stats_kernel, grad_kernel


def _make_dp_kernels(durations):
    D = len(durations)
    DUR = tuple(int(e) for e in durations)
    NT = 2 * D  # terms of one log-sum-exp: a blank and a label step per duration

    @cuda.jit(device=True, inline=True)
    def alpha_of(lpw, alphas, b, t, u, terms):
        """alpha(t, u) of a cell with t + u >= 1: the LSE of the blank and the label
        step of every duration into it (module docstring)."""
        for j in range(D):
            e = DUR[j]
            s = t - e
            terms[j] = NEG_INF
            terms[D + j] = NEG_INF
            if s >= 0:
                if e >= 1:
                    terms[j] = alphas[b, s, u] + lpw[b, s, u, 0] + lpw[b, s, u, 2 + j]
                if u >= 1:
                    terms[D + j] = (
                        alphas[b, s, u - 1]
                        + lpw[b, s, u - 1, 1]
                        + lpw[b, s, u - 1, 2 + j]
                    )
        return log_sum_exp(terms, NT)

    @cuda.jit(device=True, inline=True)
    def beta_of(lpw, betas, b, t, u, Tb, Ub, terms):
        """beta(t, u) of a valid cell (module docstring)."""
        last_row = u == Ub - 1
        lpb = lpw[b, t, u, 0]
        lpl = lpw[b, t, u, 1]
        for j in range(D):
            e = DUR[j]
            dest = t + e
            dj = lpw[b, t, u, 2 + j]
            terms[j] = NEG_INF
            if e >= 1:
                if dest < Tb:
                    terms[j] = lpb + dj + betas[b, dest, u]
                elif dest == Tb and last_row:
                    terms[j] = lpb + dj
            terms[D + j] = NEG_INF
            if not last_row and dest < Tb:
                terms[D + j] = lpl + dj + betas[b, dest, u + 1]
        return log_sum_exp(terms, NT)

    @cuda.jit(device=True, inline=True)
    def log_p_of(lpw, alphas, terms, b, Tb, Ub, bad):
        """log P from alpha (module docstring), NaN when ``bad[b]``."""
        L = Ub - 1
        for j in range(D):
            e = DUR[j]
            s = Tb - e
            terms[j] = NEG_INF
            if e >= 1 and s >= 0:
                terms[j] = alphas[b, s, L] + lpw[b, s, L, 0] + lpw[b, s, L, 2 + j]
        lp = log_sum_exp(terms, D)
        if bad[b] != 0:
            lp = math.nan
        return lp

    alpha_beta = make_alpha_beta(alpha_of, beta_of, log_p_of, NT)

    @cuda.jit
    def tdt_alpha_beta_kernel(
        lpw,
        act_lens,
        label_lens,
        bad,
        fastemit_lambda,
        do_beta,
        alphas,
        betas,
        logp,
        costs,
    ):
        """alpha (block y = 0) and beta (block y = 1), by anti-diagonal.

        Args:
            lpw: (B, T, U, 2 + D) float64 from the row kernel.
            bad: (B,) int32 (rows of the utterance with NaN / +inf logits).
            The others as the multi-blank ``alpha_beta_kernel``'s.
        """
        alpha_beta(
            lpw, act_lens, label_lens, fastemit_lambda, alphas, betas, logp, costs, bad
        )

    @cuda.jit(device=True, inline=True)
    def cell_weights(lpw, alphas, betas, b, t, u, Tb, Ub, lp_tot):
        """The step occupancies [W_blank, W_label, W_dur(0..D-1)] of a valid cell
        (module docstring) over its ``lpw`` entries."""
        last_row = u == Ub - 1
        base = alphas[b, t, u] - lp_tot
        lpb = lpw[b, t, u, 0]
        lpl = lpw[b, t, u, 1]
        w_blank = 0.0
        w_label = 0.0
        for j in range(D):
            e = DUR[j]
            dest = t + e
            x = base + lpw[b, t, u, 2 + j]
            wb = 0.0
            if e >= 1:
                if dest < Tb:
                    wb = math.exp(x + lpb + betas[b, dest, u])
                elif dest == Tb and last_row:
                    wb = math.exp(x + lpb)
            wl = 0.0
            if not last_row and dest < Tb:
                wl = math.exp(x + lpl + betas[b, dest, u + 1])
            w_blank += wb
            w_label += wl
            lpw[b, t, u, 2 + j] = wb + wl
        lpw[b, t, u, 0] = w_blank
        lpw[b, t, u, 1] = w_label

    # lpw: (B, T, U, 2 + D), [W_blank, W_label, W_dur(0..D-1)] out
    return tdt_alpha_beta_kernel, make_weights_kernel(cell_weights)


#: ``get_tdt_kernels(storage, lattice, row_cfg) -> (tdt_row_stats_kernel,
#: tdt_alpha_beta_kernel, weights kernel, gradient kernel)`` (module docstring; the
#: durations are compile-time constants) and ``get_tdt_dp_kernels(lattice)``, as
#: ``device_ops.kernel_getters`` says
get_tdt_kernels, get_tdt_dp_kernels = kernel_getters(
    _make_row_kernels,
    _make_dp_kernels,
    lambda lattice: (lattice.durations,),
    lambda lattice: lattice.durations,
)
