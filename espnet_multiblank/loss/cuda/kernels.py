"""Numba CUDA kernels of the multi-blank RNN-T loss (see ``docs/lattice.md``).

This module imports ``numba.cuda`` at import time: import it lazily (the package's
``compute`` does), so that a CPU-only install never needs numba-cuda. Under
``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) the same kernels run in
Numba's CUDA simulator on numpy arrays; that is how CI tests them without a GPU.

Notation: B batch, T max frames, U max labels + 1, V vocabulary, N = number of big
blanks with durations d_0..d_{N-1}; big blank i has index ``k_i`` (the lattice's
``big_blank_ids``, compile-time constants like the durations).
For utterance b: T_b = act_lens[b], U_b = label_lens[b] + 1, y_u = labels[b, u].
``FT`` is the compute dtype (float32 or float64, the logits' dtype); every
workspace below is float64.

Four launches, all on the same stream:

1. :func:`row_stats_kernel` (one block per row (b, t, u) with t < T_b, u < U_b):
   fused log-softmax. Each thread keeps an online (max, sum of exp) pair over a
   strided slice of the row, the pairs are merged in shared memory, and the row's
   log-sum-exp ``denom(b,t,u) = log sum_k exp(acts[b,t,u,k])`` is stored together with
   the N + 2 emission log-probs the DP needs,
   ``lp(t,u,k) = acts[b,t,u,k] - denom - sigma``:

       lpw[b,t,u,0]     = lp(t,u,blank)
       lpw[b,t,u,1]     = lp(t,u,y_u)            (-inf for u = U_b - 1)
       lpw[b,t,u,2 + i] = lp(t,u,k_i)            (big blank i)

   No (B,T,U,V) log-prob tensor is ever made.

2. :func:`alpha_beta_kernel` (grid (B, 2): block (b, 0) computes alpha, block (b, 1)
   beta, concurrently). Cells are processed one anti-diagonal n = t + u at a time
   (a cell depends on diagonals n - 1 and n - d_i only), the threads of the block
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
   ``costs[b] = -(1 + lambda) log P`` (+inf for an impossible utterance, 0 for
   T_b = 0 = L_b).

3. :func:`weights_kernel` (one thread per cell): the transition weights out of each
   valid cell (t, u), written over its ``lpw`` entries (log P from the alpha readout)::

       w_blank   = exp(alpha(t,u) + lp(t,u,blank) + beta(t+1,u) - log P)
       w_label   = exp(alpha(t,u) + lp(t,u,y_u) + beta(t,u+1) - log P)   [u < U_b-1]
       w_big_i   = exp(alpha(t,u) + lp(t,u,blank-1-i) + beta(t+d_i,u) - log P)

   with beta(T_b, U_b - 1) = 0 and weight 0 for a transition that overshoots T_b or
   reaches it with labels left.

4. :func:`grad_kernel` (one block per row (b, t, u), padding rows included): with the
   occupancy gamma = w_blank + w_label + sum_i w_big_i (= exp(alpha + beta - log P)),
   the gradient of cost_b with respect to acts[b,t,u,k] is::

       g_k = (gamma + lambda * w_label) * exp(acts[b,t,u,k] - denom)
             - w_blank [k = blank] - (1 + lambda) w_label [k = y_u]
             - w_big_i [k = k_i]

   (FastEmit with ESPnet/NeMo semantics), then clamped to [-clamp, clamp] when
   clamp > 0, then multiplied by ``grad_weights[b]``. Rows with t >= T_b or u >= U_b,
   and every row of an utterance whose log P is not finite, get exactly 0. This pass
   only streams the logits in and the gradient out (no float64 transcendental).
"""

import math

import numba
from numba import cuda

from espnet_multiblank.lattice import MultiblankLattice

NEG_INF = -math.inf
POS_INF = math.inf

_KERNEL_CACHE = {}


@cuda.jit(device=True, inline=True)
def log_add(a, b):
    """log(exp(a) + exp(b)) for float64 a, b; propagates NaN; -inf is the zero."""
    if a < b:
        hi = b
        lo = a
    else:
        hi = a
        lo = b
    if hi == NEG_INF:
        return lo  # -inf, or NaN when lo is NaN
    return hi + math.log1p(math.exp(lo - hi))


@cuda.jit(device=True, inline=True)
def log_sum_exp(terms, n):
    """log sum_i exp(terms[i]) over terms[:n] (float64); -inf entries add nothing.

    One log and n independent exps (instead of a chain of n - 1 log_add calls, whose
    latency the sequential diagonal sweep would pay). NaN propagates.
    """
    mx = NEG_INF
    for i in range(n):
        if terms[i] > mx:
            mx = terms[i]
    if mx == NEG_INF:
        r = NEG_INF
        for i in range(n):
            if terms[i] != terms[i]:
                r = terms[i]  # NaN
        return r
    s = 0.0
    for i in range(n):
        s += math.exp(terms[i] - mx)
    return mx + math.log(s)


def get_kernels(dtype_name: str, lattice: MultiblankLattice, row_threads: int):
    """The four kernels specialised (and cached) for one dtype and lattice.

    Args:
        dtype_name: "float32" or "float64", the dtype of acts / costs / grads.
        lattice: the big blanks' indices and durations (``big_blank_ids``,
            ``big_blank_durations``) become compile-time constants; the standard
            blank stays a launch argument.
        row_threads: threads per block of the row kernels (a power of two, 32..1024).

    Returns:
        (row_stats_kernel, alpha_beta_kernel, weights_kernel, grad_kernel), see the
        module docstring.
    """
    key = (dtype_name, lattice.big_blank_ids, lattice.big_blank_durations, row_threads)
    if key not in _KERNEL_CACHE:
        row_stats, alpha_beta, weights, grad = _make_kernels(*key)
        # The two DP kernels do not depend on row_threads: share them between block
        # sizes, so that each is compiled (lazily, at its first launch) only once.
        dp_key = (dtype_name, lattice.big_blank_durations)
        if dp_key not in _KERNEL_CACHE:
            _KERNEL_CACHE[dp_key] = (alpha_beta, weights)
        alpha_beta, weights = _KERNEL_CACHE[dp_key]
        _KERNEL_CACHE[key] = (row_stats, alpha_beta, weights, grad)
    return _KERNEL_CACHE[key]


def _make_kernels(dtype_name, big_ids, durations, row_threads):
    FT = getattr(numba, dtype_name)  # compute dtype of the logits' own arithmetic
    N = len(durations)
    NW = N + 2  # workspace columns: blank, label, big blanks
    # (0,) appended: never empty (typing of DUR[i], BIG[i])
    DUR = tuple(int(d) for d in durations) + (0,)
    BIG = tuple(int(k) for k in big_ids) + (0,)
    RT = row_threads

    @cuda.jit
    def row_stats_kernel(acts, labels, act_lens, label_lens, blank, sigma, denom, lpw):
        """Fused log-softmax statistics of one row per block.

        Args:
            acts: (B, T, U, V) FT raw logits, C-contiguous.
            labels: (B, L) int64 (L >= 1; entries >= L_b unused).
            act_lens, label_lens: (B,) int64.
            blank: int, index of the standard blank.
            sigma: float, logit under-normalisation.
            denom: (B, T, U) float64 out: row log-sum-exp (+NaN for NaN / +inf rows).
            lpw: (B, T, U, N + 2) float64 out: lp of blank, label, big blanks.
        Grid: B*T*U blocks of RT threads; rows outside (T_b, U_b) are skipped.
        """
        sm_m = cuda.shared.array(RT, FT)  # running maxima, in the logits' dtype
        sm_s = cuda.shared.array(RT, numba.float64)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        T = acts.shape[1]
        U = acts.shape[2]
        V = acts.shape[3]
        u = row % U
        bt = row // U
        t = bt % T
        b = bt // T
        Ub = label_lens[b] + 1
        if t >= act_lens[b] or u >= Ub:
            return  # uniform over the block: no syncthreads is skipped by half a block
        # online log-sum-exp over the strided slice k = tid, tid + RT, ...
        m = FT(NEG_INF)
        s = 0.0
        k = tid
        while k < V:
            v = acts[b, t, u, k]
            if v > m:
                s = s * math.exp(m - v) + 1.0
                m = v
            elif v != FT(NEG_INF):
                s += math.exp(v - m)  # NaN stays NaN
            k += RT
        sm_m[tid] = m
        sm_s[tid] = s
        cuda.syncthreads()
        stride = RT // 2
        while stride > 0:
            if tid < stride:
                m1 = sm_m[tid]
                s1 = sm_s[tid]
                m2 = sm_m[tid + stride]
                s2 = sm_s[tid + stride]
                if m1 < m2:
                    m1, m2 = m2, m1
                    s1, s2 = s2, s1
                if m1 == FT(NEG_INF):
                    s1 = s1 + s2
                else:
                    s1 = s1 + s2 * math.exp(m2 - m1)  # exp in FT (fast for float32)
                sm_m[tid] = m1
                sm_s[tid] = s1
            cuda.syncthreads()
            stride //= 2
        if tid == 0:
            mx = sm_m[0]
            sm = sm_s[0]
            if mx == POS_INF or not (sm > 0.0):
                d = math.nan  # +inf logit, NaN, or all -inf: a NaN cost for the caller
            else:
                d = mx + math.log(sm)
            denom[b, t, u] = d
            off = d + sigma
            lpw[b, t, u, 0] = acts[b, t, u, blank] - off
            if u < Ub - 1:
                lpw[b, t, u, 1] = acts[b, t, u, labels[b, u]] - off
            else:
                lpw[b, t, u, 1] = NEG_INF
            for i in range(N):
                lpw[b, t, u, 2 + i] = acts[b, t, u, BIG[i]] - off

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
            costs: (B,) FT out: -(1 + lambda) * log P.
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
                costs[b] = -(1.0 + fastemit_lambda) * lp0
            return
        n_diag = Tb + Ub - 1
        terms = cuda.local.array(NW, numba.float64)
        if which == 0:
            for n in range(n_diag):
                t = max(0, n - Ub + 1) + tid
                t_hi = min(n, Tb - 1)
                while t <= t_hi:
                    u = n - t
                    if n == 0:
                        a = 0.0
                    else:
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
                                terms[2 + i] = (
                                    alphas[b, t - d, u] + lpw[b, t - d, u, 2 + i]
                                )
                        a = log_sum_exp(terms, NW)
                    alphas[b, t, u] = a
                    t += nthr
                cuda.syncthreads()
            if tid == 0:
                u = Ub - 1
                lp = alphas[b, Tb - 1, u] + lpw[b, Tb - 1, u, 0]
                for i in range(N):
                    d = DUR[i]
                    if Tb >= d:
                        lp = log_add(
                            lp, alphas[b, Tb - d, u] + lpw[b, Tb - d, u, 2 + i]
                        )
                logp[b] = lp
                costs[b] = -(1.0 + fastemit_lambda) * lp
        else:
            for m in range(n_diag):
                n = n_diag - 1 - m
                t = max(0, n - Ub + 1) + tid
                t_hi = min(n, Tb - 1)
                while t <= t_hi:
                    u = n - t
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
                    bb = log_sum_exp(terms, NW)
                    betas[b, t, u] = bb
                    t += nthr
                cuda.syncthreads()

    @cuda.jit
    def weights_kernel(lpw, act_lens, label_lens, alphas, betas, logp):
        """Transition weights out of every valid cell, written over ``lpw`` in place.

        Args:
            lpw: (B, T, U, N + 2) float64: in, the emission log-probs; out, for cells
                with t < T_b, u < U_b of utterances with a finite log P, the weights
                [w_blank, w_label, w_big_0, ..., w_big_{N-1}] (module docstring).
                Each cell reads only its own lpw entries, so in place is safe.
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

    @cuda.jit
    def grad_kernel(
        acts,
        labels,
        act_lens,
        label_lens,
        blank,
        fastemit_lambda,
        clamp,
        grad_weights,
        denom,
        wts,
        logp,
        grads,
    ):
        """d cost_b / d acts (clamped, times grad_weights[b]) for one row per block.

        Args:
            acts: (B, T, U, V) FT raw logits.
            labels: (B, L) int64.  act_lens, label_lens: (B,) int64.
            blank: int.  fastemit_lambda, clamp: float (clamp 0 = off).
            grad_weights: (B,) FT.
            denom: (B, T, U) float64 row log-sum-exp.
            wts: (B, T, U, N + 2) float64 transition weights from weights_kernel.
            logp: (B,) float64.
            grads: (B, T, U, V) FT out, every element written.
        Grid: B*T*U blocks of RT threads (a pure streaming pass: no shared memory).
        """
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        T = acts.shape[1]
        U = acts.shape[2]
        V = acts.shape[3]
        u = row % U
        bt = row // U
        t = bt % T
        b = bt // T
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        if t >= Tb or u >= Ub or not (abs(logp[b]) < POS_INF):
            k = tid
            while k < V:
                grads[b, t, u, k] = 0
                k += RT
            return
        w_blank = wts[b, t, u, 0]
        w_label = wts[b, t, u, 1]
        gamma = w_blank + w_label
        for i in range(N):
            gamma += wts[b, t, u, 2 + i]
        c_p = FT(gamma + fastemit_lambda * w_label)
        c_blank = FT(w_blank)
        c_label = FT((1.0 + fastemit_lambda) * w_label)
        d_row = FT(denom[b, t, u])
        gw = FT(grad_weights[b])
        cl = FT(clamp)
        lab = labels[b, u] if u < Ub - 1 else -1
        k = tid
        while k < V:
            g = c_p * math.exp(acts[b, t, u, k] - d_row)
            if k == blank:
                g -= c_blank
            elif k == lab:
                g -= c_label
            else:
                for i in range(N):
                    if k == BIG[i]:
                        g -= FT(wts[b, t, u, 2 + i])
            if cl > 0:
                g = min(max(g, -cl), cl)
            grads[b, t, u, k] = g * gw
            k += RT

    return row_stats_kernel, alpha_beta_kernel, weights_kernel, grad_kernel
