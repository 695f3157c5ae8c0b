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
   when impossible, 0 for T_b = 0 = L_b, NaN when ``bad[b]``).

3. :func:`tdt_weights_kernel` (one thread per cell, float64): the step occupancies
   ``W = exp(alpha(t,u) + step log-prob + beta(dest) - log P)``, summed per token and
   per duration and written over the cell's own ``lpw`` entries: [W_blank, W_label,
   W_dur(0), ..., W_dur(D-1)].

4. :func:`tdt_grad_kernel` (every row, padding included; may run in the autograd
   backward with the incoming gradient in ``factors``), with gamma = W_blank +
   W_label::

       g[k]     = (gamma + lambda W_label) exp(x_k - denom0) - W_blank [k = blank]
                  - (1 + lambda) W_label [k = y_u]                        (k < V)
       g[V + j] = gamma exp(x_{V+j} - denom1) - W_dur(j)

   clipped to [-clamp, clamp] (clamp > 0), times ``factors[b]``, stored in the
   logits' dtype; exactly 0 at padding rows and for utterances whose log P is not
   finite. Each chunk's loads are issued before its stores.
"""

import math

import numba
from numba import cuda

from espnet_multiblank.lattice import TDTLattice
from espnet_multiblank.loss.cuda.device_ops import (
    NEG_INF,
    POS_INF,
    compute_type,
    fill_row,
    log_sum_exp,
    make_io,
    make_row_lse,
    make_step_loads,
    nan_max,
    row_denominator,
    row_node,
    split_hi_lo,
)

_KERNEL_CACHE = {}


def get_tdt_kernels(storage: str, lattice: TDTLattice, row_cfg):
    """The four TDT kernels specialised (and cached) for one storage kind and lattice.

    Args:
        storage: "float64", "float32", "float16" or "bfloat16" (int16 bits).
        lattice: its durations become compile-time constants (the blank stays a
            launch argument).
        row_cfg: ``(team, block, unroll)`` of the row kernels (see
            :func:`espnet_multiblank.loss.cuda.kernels.get_kernels`).

    Returns:
        (row_stats, alpha_beta, weights, grad) kernels (module docstring).
    """
    team, block, unroll = (int(x) for x in row_cfg)
    key = (storage, lattice.durations, team, block, unroll)
    if key not in _KERNEL_CACHE:
        row_stats, grad = _make_row_kernels(*key)
        alpha_beta, weights = get_tdt_dp_kernels(lattice)
        _KERNEL_CACHE[key] = (row_stats, alpha_beta, weights, grad)
    return _KERNEL_CACHE[key]


def get_tdt_dp_kernels(lattice):
    """The two lattice kernels (alpha_beta, weights) of ``lattice``: they depend
    only on the durations (numba specialises them on the costs' dtype by itself), so
    they are compiled once and shared by every storage kind and row layout."""
    key = ("dp", lattice.durations)
    if key not in _KERNEL_CACHE:
        _KERNEL_CACHE[key] = _make_dp_kernels(lattice.durations)
    return _KERNEL_CACHE[key]


def _make_row_kernels(storage, durations, team, block, unroll):
    if team < 1 or team & (team - 1) or block % team:
        raise ValueError(f"bad row layout team={team} block={block}")
    CT = compute_type(storage)
    load, store = make_io(storage)
    row_lse = make_row_lse(load, CT, team, unroll)
    step_loads = make_step_loads(load, CT)
    D = len(durations)
    TS = team
    NB = block
    RPB = block // team
    UN = unroll
    STEP = team * unroll
    F64 = CT is numba.float64

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
        sm_m = cuda.shared.array(NB, CT)
        sm_s = cuda.shared.array(NB, CT)
        tid = cuda.threadIdx.x
        lane = tid % TS
        T = acts.shape[1]
        U = acts.shape[2]
        row = cuda.blockIdx.x * RPB + tid // TS
        b = 0
        t = 0
        u = 0
        Ub = 1
        active = False
        if row < acts.shape[0] * T * U:
            b, t, u, Ub, active = row_node(row, T, U, act_lens, label_lens)
        lead = active and lane == 0
        x_blank = CT(0.0)
        x_label = CT(NEG_INF)
        xd = cuda.local.array(D, CT)
        if lead:  # in flight during the row loop
            x_blank, x_label = step_loads(acts, labels, b, t, u, Ub, blank)
            for j in range(D):
                xd[j] = load(acts[b, t, u, V + j])
        m, s = row_lse(acts, b, t, u, V, lane, active, sm_m, sm_s, tid)
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
            off = d_tok + sigma
            lpw[b, t, u, 0] = numba.float64(x_blank) - off
            lpw[b, t, u, 1] = numba.float64(x_label) - off
            for j in range(D):
                lpw[b, t, u, 2 + j] = numba.float64(xd[j]) - d_dur

    @cuda.jit
    def tdt_grad_kernel(
        acts,
        labels,
        act_lens,
        label_lens,
        blank,
        V,
        fastemit_lambda,
        clamp,
        factors,
        denom,
        wts,
        logp,
        grads,
    ):
        """d cost_b / d acts (clamped, times factors[b]), one team per row.

        Args:
            acts: (B, T, U, V + D) logits (storage dtype).  labels: (B, L) int64.
            act_lens, label_lens: (B,) int64.  blank, V: ints.
            fastemit_lambda, clamp: floats (clamp 0 = off).
            factors: (B,) float64.  denom: (B, T, U, 2) float64.
            wts: (B, T, U, 2 + D) float64 from the weights kernel.  logp: (B,).
            grads: (B, T, U, V + D) out (storage dtype), every element written.
        Grid: as the row kernel (streaming; no shared memory).
        """
        tid = cuda.threadIdx.x
        lane = tid % TS
        T = acts.shape[1]
        U = acts.shape[2]
        VD = acts.shape[3]
        row = cuda.blockIdx.x * RPB + tid // TS
        if row >= acts.shape[0] * T * U:
            return
        b, t, u, Ub, valid = row_node(row, T, U, act_lens, label_lens)
        if not (valid and abs(logp[b]) < POS_INF):
            fill_row(grads, b, t, u, VD, lane, TS, store(CT(0.0)))
            return
        w_blank = wts[b, t, u, 0]
        w_label = wts[b, t, u, 1]
        gamma = w_blank + w_label
        c_tok = CT(gamma + fastemit_lambda * w_label)
        c_dur = CT(gamma)
        c_blank = CT(w_blank)
        c_label = CT((1.0 + fastemit_lambda) * w_label)
        wdur = cuda.local.array(D, CT)  # registers: indexed by constants below
        for j in range(D):
            wdur[j] = CT(wts[b, t, u, 2 + j])
        if F64:
            t_hi = CT(denom[b, t, u, 0])
            t_lo = CT(0.0)
            e_hi = CT(denom[b, t, u, 1])
            e_lo = CT(0.0)
        else:
            t_hi, t_lo = split_hi_lo(denom[b, t, u, 0])
            e_hi, e_lo = split_hi_lo(denom[b, t, u, 1])
        gw = CT(factors[b])
        cl = CT(clamp)
        lab = labels[b, u] if u < Ub - 1 else -1
        xs = cuda.local.array(UN, CT)
        k0 = lane
        while k0 < VD:
            for j in range(UN):  # all the chunk's loads first, unconditional
                xs[j] = load(acts[b, t, u, min(k0 + j * TS, VD - 1)])
            for j in range(UN):
                k = k0 + j * TS
                if k < VD:
                    if k < V:
                        g = c_tok * math.exp((xs[j] - t_hi) - t_lo)
                        if k == blank:
                            g -= c_blank
                        elif k == lab:
                            g -= c_label
                    else:
                        g = c_dur * math.exp((xs[j] - e_hi) - e_lo)
                        for i in range(D):
                            if k == V + i:
                                g -= wdur[i]
                    if cl > 0:
                        g = min(max(g, -cl), cl)
                    grads[b, t, u, k] = store(g * gw)
            k0 += STEP

    return tdt_row_stats_kernel, tdt_grad_kernel


def _make_dp_kernels(durations):
    D = len(durations)
    DUR = tuple(int(e) for e in durations)
    NT = 2 * D  # terms of one log-sum-exp: a blank and a label step per duration

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
            act_lens, label_lens: (B,) int64.  bad: (B,) int32.
            fastemit_lambda: float.  do_beta: int (0: costs only, grid (B, 1)).
            alphas, betas: (B, T, U) float64 out (valid cells only).
            logp: (B,) float64 out.  costs: (B,) float32 or float64 out.
        Grid: (B, 1 + do_beta) blocks of any number of threads (they stride).
        """
        b = cuda.blockIdx.x
        which = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        nthr = cuda.blockDim.x
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        if Tb == 0:
            if which == 0 and tid == 0:
                lp0 = 0.0 if Ub == 1 else NEG_INF
                logp[b] = lp0
                costs[b] = -(1.0 + fastemit_lambda) * lp0 + 0.0
            return
        L = Ub - 1
        n_diag = Tb + Ub - 1
        terms = cuda.local.array(NT, numba.float64)
        if which == 0:
            for n in range(n_diag):
                t = max(0, n - L) + tid
                t_hi = min(n, Tb - 1)
                while t <= t_hi:
                    u = n - t
                    if n == 0:
                        a = 0.0
                    else:
                        for j in range(D):
                            e = DUR[j]
                            s = t - e
                            terms[j] = NEG_INF
                            terms[D + j] = NEG_INF
                            if s >= 0:
                                if e >= 1:
                                    terms[j] = (
                                        alphas[b, s, u]
                                        + lpw[b, s, u, 0]
                                        + lpw[b, s, u, 2 + j]
                                    )
                                if u >= 1:
                                    terms[D + j] = (
                                        alphas[b, s, u - 1]
                                        + lpw[b, s, u - 1, 1]
                                        + lpw[b, s, u - 1, 2 + j]
                                    )
                        a = log_sum_exp(terms, NT)
                    alphas[b, t, u] = a
                    t += nthr
                cuda.syncthreads()
            if tid == 0:
                for j in range(D):
                    e = DUR[j]
                    s = Tb - e
                    terms[j] = NEG_INF
                    if e >= 1 and s >= 0:
                        terms[j] = (
                            alphas[b, s, L] + lpw[b, s, L, 0] + lpw[b, s, L, 2 + j]
                        )
                lp = log_sum_exp(terms, D)
                if bad[b] != 0:
                    lp = math.nan
                logp[b] = lp
                costs[b] = -(1.0 + fastemit_lambda) * lp
        else:
            for m in range(n_diag):
                n = n_diag - 1 - m
                t = max(0, n - L) + tid
                t_hi = min(n, Tb - 1)
                while t <= t_hi:
                    u = n - t
                    last_row = u == L
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
                    betas[b, t, u] = log_sum_exp(terms, NT)
                    t += nthr
                cuda.syncthreads()

    @cuda.jit
    def tdt_weights_kernel(lpw, act_lens, label_lens, alphas, betas, logp):
        """Step occupancies of every valid cell, written over its ``lpw`` entries.

        Args:
            lpw: (B, T, U, 2 + D) float64: in, the step log-probs; out (valid cells of
                utterances with a finite log P), [W_blank, W_label, W_dur(0..D-1)].
            act_lens, label_lens: (B,) int64.
            alphas, betas: (B, T, U) float64.  logp: (B,) float64.
        Grid: ceil(B*T*U / blockDim) blocks, one thread per cell.
        """
        cell = cuda.grid(1)
        T = lpw.shape[1]
        U = lpw.shape[2]
        if cell >= lpw.shape[0] * T * U:
            return
        u = cell % U
        bt = cell // U
        t = bt % T
        b = bt // T
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        lp_tot = logp[b]
        if t >= Tb or u >= Ub or not (abs(lp_tot) < POS_INF):
            return
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

    return tdt_alpha_beta_kernel, tdt_weights_kernel
