"""Numba CUDA kernels of the multi-blank RNN-T loss (see ``docs/lattice.md``).

This module imports ``numba.cuda`` at import time: import it lazily (the package's
``compute`` does), so that a CPU-only install never needs numba-cuda. Under
``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) the same kernels run in
Numba's CUDA simulator on numpy arrays; that is how CI tests them without a GPU.

Notation: B batch, T max frames, U max labels + 1, V vocabulary, N = number of big
blanks with durations d_0..d_{N-1}; big blank i has index ``k_i`` (the lattice's
``big_blank_ids``, compile-time constants like the durations).
For utterance b: T_b = act_lens[b], U_b = label_lens[b] + 1, y_u = labels[b, u].

Precision. The logits are read in their own dtype (float64, float32, float16, or
bfloat16 as its int16 bits: :mod:`~espnet_multiblank.loss.cuda.device_ops`). The two
passes over the rows (kernels 1 and 4, which read or write every logit) compute in
``CT`` = float32 for 32- and 16-bit logits (float64 for float64 ones); everything per
row or per lattice cell (the row's log-sum-exp ``m + log(s)``, the log-probs of the
N + 2 symbols the lattice uses, alpha, beta, the transition weights) is float64, so
that the sums over T + U cells of long utterances add no float32 rounding.

Row layout of kernels 1 and 4: a *team* of ``team`` consecutive threads (a power of
two) per row (b, t, u), ``block // team`` rows per block; each thread reads the
logits ``k = lane + j * team`` in chunks of ``unroll`` loads issued together (several
loads in flight per thread, no branch or store between them).

Four launches, all on the same stream:

1. :func:`row_stats_kernel` (rows with t < T_b, u < U_b): fused log-softmax. The team
   reduces the row to (max m, sum s of exp(x - m)) (online update per chunk, tree in
   shared memory), and lane 0 stores the row's log-sum-exp
   ``denom(b,t,u) = m + log(s)`` (float64) and the N + 2 emission log-probs the DP
   needs, ``lp(t,u,k) = acts[b,t,u,k] - denom - sigma``:

       lpw[b,t,u,0]     = lp(t,u,blank)
       lpw[b,t,u,1]     = lp(t,u,y_u)            (-inf for u = U_b - 1)
       lpw[b,t,u,2 + i] = lp(t,u,k_i)            (big blank i)

   (lane 0 loads those N + 2 logits before the row loop, so their latency overlaps
   it). No (B,T,U,V) log-prob tensor is ever made.

2. :func:`alpha_beta_kernel` (grid (B, 2): block (b, 0) computes alpha, block (b, 1)
   beta, concurrently), float64. Cells are processed one anti-diagonal n = t + u at a
   time (a cell depends on diagonals n - 1 and n - d_i only), the threads of the block
   striding over the cells of the diagonal, one ``syncthreads`` per diagonal, so any
   T and any U work (no 1023-label limit)::

       alpha(0,0) = 0
       alpha(t,u) = LSE( alpha(t-1,u)   + lp(t-1,u,blank),
                         alpha(t,u-1)   + lp(t,u-1,y_{u-1})       [u >= 1],
                         alpha(t-d_i,u) + lp(t-d_i,u,blank-1-i)   [t >= d_i] )
       log P = LSE( alpha(T_b-1,U_b-1) + lp(T_b-1,U_b-1,blank),
                    alpha(T_b-d_i,U_b-1) + lp(T_b-d_i,U_b-1,blank-1-i) [T_b >= d_i] )

       beta(t,u) = LSE( lp(t,u,blank) + beta(t+1,u),
                        lp(t,u,y_u) + beta(t,u+1)                 [u < U_b-1],
                        lp(t,u,blank-1-i) + beta(t+d_i,u) )
   with beta(T_b, U_b - 1) = 0 (the end) and every other destination with t >= T_b
   impossible. The alpha block also writes ``logp[b]`` and
   ``costs[b] = -(1 + lambda) log P`` (+inf for an impossible utterance, +0.0 for
   T_b = 0 = L_b).

3. the weights kernel (``device_ops.make_weights_kernel``; one thread per cell,
   float64): the transition weights out of each valid cell (t, u), written over its
   ``lpw`` entries (log P from the alpha readout)::

       w_blank   = exp(alpha(t,u) + lp(t,u,blank) + beta(t+1,u) - log P)
       w_label   = exp(alpha(t,u) + lp(t,u,y_u) + beta(t,u+1) - log P)   [u < U_b-1]
       w_big_i   = exp(alpha(t,u) + lp(t,u,blank-1-i) + beta(t+d_i,u) - log P)

   with beta(T_b, U_b - 1) = 0 and weight 0 for a transition that overshoots T_b or
   reaches it with labels left.

4. the gradient kernel (``device_ops.make_grad_kernel``; every row, padding
   included; may run long after 1-3, in the autograd backward, with the incoming
   gradient in ``factors``): with the occupancy gamma = w_blank + w_label + sum_i
   w_big_i (= exp(alpha + beta - log P)), the gradient of cost_b with respect to
   acts[b,t,u,k] is::

       g_k = (gamma + lambda * w_label) * exp(acts[b,t,u,k] - denom)
             - w_blank [k = blank] - (1 + lambda) w_label [k = y_u]
             - w_big_i [k = k_i]

   (FastEmit with ESPnet/NeMo semantics), then clamped to [-clamp, clamp] when
   clamp > 0, then multiplied by ``factors[b]``, and stored in the logits' dtype.
   Rows with t >= T_b or u >= U_b, and every row of an utterance whose log P is not
   finite, get exactly 0. Each chunk's loads are all issued before its stores, so the
   possible aliasing of ``acts`` and ``grads`` never serialises a load behind a store.
   ``exp(x - denom)`` is computed as ``exp((x - hi) - lo)`` with denom = hi + lo
   split into float32s, so the float32 rounding of denom does not enter.
"""

import math

from numba import cuda

from espnet_multiblank.loss.cuda.device_ops import (
    NEG_INF,
    kernel_getters,
    log_add,
    log_sum_exp,
    make_alpha_beta,
    make_grad_kernel,
    make_weights_kernel,
    row_denominator,
    row_parts,
    store_step_lps,
)


def _make_row_kernels(storage, big_ids, durations, team, block, unroll):
    parts = row_parts(storage, team, block, unroll)
    CT, load, row_lse, row_begin = parts.CT, parts.load, parts.row_lse, parts.row_begin
    denom_split = parts.denom_split
    N = len(durations)
    NB1 = max(N, 1)  # local array sizes must be >= 1
    BIG = tuple(int(k) for k in big_ids) + (0,)  # (0,): never empty (typing BIG[i])

    @cuda.jit(device=True, inline=True)
    def row_constants(
        wts, denom, b, t, u, V, blank, lab, gamma, w_label, c_blank, c_label, lam, wbig
    ):
        """The constants of row (b, t, u) that :func:`grad_of` reads (``wbig``: the
        big blanks' weights)."""
        for i in range(N):
            w = wts[b, t, u, 2 + i]
            gamma += w
            wbig[i] = CT(w)
        c_p = CT(gamma + lam * w_label)
        d_hi, d_lo = denom_split(denom[b, t, u])
        return (c_p, d_hi, d_lo, blank, lab, c_blank, c_label, wbig)

    @cuda.jit(device=True, inline=True)
    def grad_of(k, x, p):
        """g_k of the module docstring (before the clamp and the factor)."""
        c_p, d_hi, d_lo, blank, lab, c_blank, c_label, wbig = p
        g = c_p * math.exp((x - d_hi) - d_lo)
        if k == blank:
            g -= c_blank
        elif k == lab:
            g -= c_label
        else:
            for i in range(N):
                if k == BIG[i]:
                    g -= wbig[i]
        return g

    @cuda.jit
    def row_stats_kernel(acts, labels, act_lens, label_lens, blank, sigma, denom, lpw):
        """Fused log-softmax statistics, one team of TS threads per row.

        Args:
            acts: (B, T, U, V) logits in their storage dtype, C-contiguous.
            labels: (B, L) int64 (L >= 1; entries >= L_b unused).
            act_lens, label_lens: (B,) int64.
            blank: int, index of the standard blank.
            sigma: float, logit under-normalisation.
            denom: (B, T, U) float64 out: row log-sum-exp (NaN for NaN / +inf rows).
            lpw: (B, T, U, N + 2) float64 out: lp of blank, label, big blanks.
        Grid: ceil(B*T*U / (block / TS)) blocks of ``block`` threads; rows outside
        (T_b, U_b) do nothing (their threads still take part in the block's
        ``syncthreads``).
        """
        V = acts.shape[3]
        # lane 0 fetches the N + 2 logits the lattice needs now: in flight during
        # the row loop instead of after it
        tid, lane, b, t, u, Ub, active, lead, x_blank, x_label = row_begin(
            acts, labels, act_lens, label_lens, blank
        )
        xbig = cuda.local.array(NB1, CT)
        if lead:
            for i in range(N):
                xbig[i] = load(acts[b, t, u, BIG[i]])
        m, s = row_lse(acts, b, t, u, V, lane, active, tid)
        if lead:
            d = row_denominator(m, s)
            denom[b, t, u] = d
            off = d + sigma
            store_step_lps(lpw, b, t, u, x_blank, x_label, off, xbig, N, off)

    # grads: (B, T, U, V); denom: (B, T, U) float64; wts: (B, T, U, N + 2)
    grad_kernel = make_grad_kernel(parts, team, unroll, NB1, row_constants, grad_of)
    return row_stats_kernel, grad_kernel


def _make_dp_kernels(durations):
    N = len(durations)
    NW = N + 2  # workspace columns: blank, label, big blanks
    DUR = tuple(int(d) for d in durations) + (0,)  # (0,): never empty (typing DUR[i])

    @cuda.jit(device=True, inline=True)
    def alpha_of(lpw, alphas, b, t, u, terms):
        """alpha(t, u) of a cell with t + u >= 1: the LSE of its N + 2 incoming
        transitions (module docstring)."""
        # fixed slots (registers once unrolled); -inf = no edge
        terms[0] = NEG_INF
        terms[1] = NEG_INF
        if t > 0:
            terms[0] = alphas[b, t - 1, u] + lpw[b, t - 1, u, 0]
        if u > 0:
            terms[1] = alphas[b, t, u - 1] + lpw[b, t, u - 1, 1]
        for i in range(N):
            d = DUR[i]
            terms[2 + i] = NEG_INF
            if t >= d:
                terms[2 + i] = alphas[b, t - d, u] + lpw[b, t - d, u, 2 + i]
        return log_sum_exp(terms, NW)

    @cuda.jit(device=True, inline=True)
    def beta_of(lpw, betas, b, t, u, Tb, Ub, terms):
        """beta(t, u) of a valid cell (module docstring)."""
        last_row = u == Ub - 1
        # standard blank -> (t + 1, u)
        x = lpw[b, t, u, 0]
        if t + 1 < Tb:
            terms[0] = x + betas[b, t + 1, u]
        elif last_row:
            terms[0] = x
        else:
            terms[0] = NEG_INF
        # label y_u -> (t, u + 1)
        terms[1] = NEG_INF
        if not last_row:
            terms[1] = lpw[b, t, u, 1] + betas[b, t, u + 1]
        # big blank i -> (t + d_i, u)
        for i in range(N):
            d = DUR[i]
            terms[2 + i] = NEG_INF
            if t + d < Tb:
                terms[2 + i] = lpw[b, t, u, 2 + i] + betas[b, t + d, u]
            elif t + d == Tb and last_row:
                terms[2 + i] = lpw[b, t, u, 2 + i]
        return log_sum_exp(terms, NW)

    @cuda.jit(device=True, inline=True)
    def log_p_of(lpw, alphas, terms, b, Tb, Ub, flags):
        """log P from alpha (module docstring; ``flags`` unused)."""
        u = Ub - 1
        lp = alphas[b, Tb - 1, u] + lpw[b, Tb - 1, u, 0]
        for i in range(N):
            d = DUR[i]
            if Tb >= d:
                lp = log_add(lp, alphas[b, Tb - d, u] + lpw[b, Tb - d, u, 2 + i])
        return lp

    alpha_beta = make_alpha_beta(alpha_of, beta_of, log_p_of, NW)

    @cuda.jit
    def alpha_beta_kernel(
        lpw, act_lens, label_lens, fastemit_lambda, do_beta, alphas, betas, logp, costs
    ):
        """Forward (block y = 0) and backward (block y = 1) variables, by anti-diagonal.

        Args:
            lpw: (B, T, U, N + 2) float64 emission log-probs from row_stats_kernel.
            act_lens, label_lens: (B,) int64.
            fastemit_lambda: float.
            do_beta: int, 0 when only the costs are needed (grid (B, 1)).
            alphas, betas: (B, T, U) float64 out (valid cells only).
            logp: (B,) float64 out: log P (alpha readout).
            costs: (B,) float32 or float64 out: -(1 + lambda) * log P.
        Grid: (B, 1 + do_beta) blocks of any number of threads (they stride).
        """
        alpha_beta(
            lpw, act_lens, label_lens, fastemit_lambda, alphas, betas, logp, costs, 0
        )

    @cuda.jit(device=True, inline=True)
    def cell_weights(lpw, alphas, betas, b, t, u, Tb, Ub, lp_tot):
        """The weights [w_blank, w_label, w_big_0, ..., w_big_{N-1}] of a valid
        cell (module docstring) over its ``lpw`` entries."""
        base = alphas[b, t, u] - lp_tot
        last_row = u == Ub - 1
        x = base + lpw[b, t, u, 0]
        if t + 1 < Tb:
            w = math.exp(x + betas[b, t + 1, u])
        elif last_row:
            w = math.exp(x)
        else:
            w = 0.0
        lpw[b, t, u, 0] = w
        w = 0.0
        if not last_row:
            w = math.exp(base + lpw[b, t, u, 1] + betas[b, t, u + 1])
        lpw[b, t, u, 1] = w
        for i in range(N):
            d = DUR[i]
            x = base + lpw[b, t, u, 2 + i]
            if t + d < Tb:
                w = math.exp(x + betas[b, t + d, u])
            elif t + d == Tb and last_row:
                w = math.exp(x)
            else:
                w = 0.0
            lpw[b, t, u, 2 + i] = w

    # lpw: (B, T, U, N + 2), the weights of [blank, label, big blanks] out
    return alpha_beta_kernel, make_weights_kernel(cell_weights)


#: ``get_kernels(storage, lattice, row_cfg) -> (row_stats_kernel, alpha_beta_kernel,
#: weights kernel, gradient kernel)`` (module docstring; the big blanks' indices and
#: durations are compile-time constants) and ``get_dp_kernels(lattice) ->
#: (alpha_beta_kernel, weights kernel)``, as ``device_ops.kernel_getters`` says
get_kernels, get_dp_kernels = kernel_getters(
    _make_row_kernels,
    _make_dp_kernels,
    lambda lattice: (lattice.big_blank_ids, lattice.big_blank_durations),
    lambda lattice: lattice.big_blank_durations,
)
