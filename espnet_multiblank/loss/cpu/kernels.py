"""Numba CPU kernels of the multi-blank RNN-T loss: three passes, fused log-softmax.

The recursions are those of ``docs/lattice.md`` section 2. Per utterance b (T_b frames,
U_b = L_b + 1 label positions, K = N + 2 transitions per node: slot 0 the blank, slot 1
the label y_u, slot 2 + i big blank i):

Pass 1, :func:`rows_forward` (frames (b, t) over threads) reads the logits once. For
the valid rows of frame t (u < U_b) it finds one shift ``c`` (the largest logit of the
frame; a row whose exps all fall below 2**-60 with it is redone with its own maximum),
writes ``e = exp(x - c)`` into the gradient buffer (or a scratch row when no gradient
is wanted) and keeps, per node, in a row-major (B, T, U, K + 1) float64 array, the K
log-probs ``lp_k = x_k - c - log S - sigma`` (S = sum(e)) and 1 / S. Padding rows of
the buffer are zeroed here.

Pass 2, :func:`lattice` (utterances over threads) copies each utterance to private
arrays by anti-diagonal n = t + u and sweeps them, vectorised over u (a node's
predecessors lie on earlier anti-diagonals only), in float64 with the polynomial
``exp64`` / ``log64`` of ``row_ops``:

    alpha(dest) = LSE over the transitions into dest of alpha(src) + lp
    log P       = LSE over the transitions into the end
    q(arc)      = exp(alpha(src) + lp(arc) - alpha(dest))     (forward; sum to 1)
    gamma(end)  = 1,  W(arc) = gamma(dest) q(arc),  gamma(node) = sum of its W
                                                              (backward)

W is the probability that a path takes the transition, gamma that it visits the
node (docs/lattice.md's ``W_e`` and ``gamma``, without beta: the backward sweep is
multiply-adds of numbers in [0, 1], no exp or log). The node's row gets back the
occupancies W_k of its K transitions and the softmax coefficient
``(gamma + lambda W_label) / S``.

Pass 3, :func:`rows_backward` (frames over threads) turns the buffer into the gradient
in place: with f_b the utterance's factor (reduction weight times incoming gradient),

    grad(t,u,k) = f_b [ coef e_k - sum_{transitions e with symbol k} (1 + lambda
                        [e is the label]) W_e ]

with values below ``|f_b| 2**-80`` set to 0 (``row_ops.flush_limit``: they are far
below any resolution of the sums they enter, but subnormal numbers in the gradient make
the next matmuls slow), clipped to [-clamp |f_b|, clamp |f_b|] (= the clamp applied
before the factor). Pass 3 runs when autograd's backward provides f_b, so an incoming
gradient other than 1 costs nothing extra. Padding rows and impossible utterances get
exactly 0.

Pass 2's anti-diagonal arrays are indexed ``[n, j]`` for node (t = n - u, u = j - 1);
columns 0 and U + 1 .. U + COLUMN_PAD - 1 are never valid nodes and may hold anything.

Performance rules the code follows (each measured to matter; the figures are in
bench/RESULTS.md, "Moved from code comments"):
arrays are indexed flat with np.uint64 offsets (no views: a view costs two atomic
reference-count updates, contended between threads; unsigned indices need no
negative-index wraparound, which stops vectorisation); a vectorised loop does not
read one row of an array and write another row of it (LLVM cannot prove the symbolic
distance safe), hence separately allocated scratch rows; no exp/log call, load or
inner loop (even of zero trips) under a condition inside a vector loop (selects of
values instead); loops over an anti-diagonal run over a multiple of 8 columns (a
scalar remainder iteration costs a whole scalar exp64 + log64); per-node values travel
between the passes row-major (scattered stores into anti-diagonal arrays while
streaming the logits slow pass 1 down).
"""

import math

import numpy as np
from numba import njit, prange

from espnet_multiblank.loss.cpu.common import (
    CHUNKS,
    FRAME_WIDE_BELOW_V,
    KERNEL_OPTS,
    LANES,
    MIN_ROW_SUM,
    NEG_INF,
    U0,
    U1,
    U2,
    chunk,
    diag_range,
    rows_to_planes,
)
from espnet_multiblank.loss.cpu.row_ops import (
    clamp_range,
    exp64,
    exp_range,
    exp_sum,
    flush_limit,
    flushed,
    log64,
    max_and_check,
    scale_flush_range,
    sum_range,
    zero_range,
)

#: spare columns of the workspaces: column 0, column U + 1 and the tail of the last
#: LANES-wide group of an anti-diagonal
COLUMN_PAD = LANES + 2


@njit(parallel=True, **KERNEL_OPTS)
def rows_forward(
    acts,
    labels,
    act_lens,
    label_lens,
    blank,
    big_ids,
    sigma,
    store,
    exps,
    ST,
    bad,
):
    """Pass 1.

    acts: (B, T, U, V) float32/64 C-contiguous; labels: (B, L) int64 (L >= U_b - 1);
    act_lens, label_lens: (B,) int64; big_ids: (N,) int64.
    store: write the exps into ``exps`` (B, T, U, V) (acts dtype; the gradient buffer),
        padding rows zeroed; else ``exps`` is not touched.
    ST: (B, T, U, K + 1) float64 out, valid rows only: the log-probs (minus sigma) of
        blank, label (-inf on the last row: no label left), big blanks, then
        1 / (sum of the row's exps).
    bad: (B,) uint8 out: 1 when a valid row holds NaN / +inf or only -inf.
    """
    B, T, U, V = acts.shape
    K1 = ST.shape[3]
    N = big_ids.size
    xf = acts.reshape(B * T * U * V)
    ef = exps.reshape(exps.size)
    STf = ST.reshape(ST.size)
    uV = np.uint64(V)
    uU = np.uint64(U)
    uK1 = np.uint64(K1)
    total = B * T
    nch = min(total, CHUNKS)
    frame_wide = V < FRAME_WIDE_BELOW_V
    for ch in prange(nch):
        lo, hi = chunk(ch, nch, total)
        scratch = np.empty(1 if store else U * V, acts.dtype)
        # per row of a frame: sum of exps, then its log; padded for the vector loop
        sums = np.ones(U + LANES)
        shifts = np.zeros(U + LANES)
        inv = np.empty(U + LANES)
        for bt in range(lo, hi):
            b = bt // T
            t = bt - b * T
            Tb = act_lens[b]
            Ub = label_lens[b] + 1
            f0 = np.uint64(bt) * uU * uV  # frame start
            f1 = f0 + uU * uV
            if t >= Tb:
                if store:
                    zero_range(ef, f0, f1)
                continue
            fe = f0 + np.uint64(Ub) * uV
            if store:
                zero_range(ef, fe, f1)
                out = ef
                o0 = f0
            else:
                out = scratch
                o0 = U0
            c, isbad = max_and_check(xf, f0, fe)
            if isbad or c == NEG_INF:
                bad[b] = 1
                continue
            if frame_wide:
                exp_range(xf, f0, fe, c, out, o0)
            for u in range(Ub):
                uu = np.uint64(u)
                r0 = f0 + uu * uV
                q0 = o0 + uu * uV
                if frame_wide:
                    s = np.float64(sum_range(out, q0, q0 + uV))
                else:
                    s = exp_sum(xf, r0, r0 + uV, c, out, q0)
                shifts[u] = c
                if s < MIN_ROW_SUM:
                    m, _ = max_and_check(xf, r0, r0 + uV)
                    if m == NEG_INF:
                        bad[b] = 1
                        break
                    s = exp_sum(xf, r0, r0 + uV, m, out, q0)
                    shifts[u] = m
                sums[u] = s
            if bad[b]:
                continue
            for u in range(((Ub + LANES - 1) // LANES) * LANES):  # vectorised
                s = sums[u]
                inv[u] = 1.0 / s
                sums[u] = shifts[u] + log64(s) + sigma
            p = np.uint64(bt) * uU * uK1  # row-major: cheap contiguous stores
            for u in range(Ub):
                r0 = f0 + np.uint64(u) * uV
                d = sums[u]
                STf[p] = np.float64(xf[r0 + np.uint64(blank)]) - d
                if u < Ub - 1:
                    STf[p + U1] = np.float64(xf[r0 + np.uint64(labels[b, u])]) - d
                else:
                    STf[p + U1] = NEG_INF
                for i in range(N):
                    STf[p + np.uint64(2 + i)] = (
                        np.float64(xf[r0 + np.uint64(big_ids[i])]) - d
                    )
                STf[p + uK1 - U1] = inv[u]
                p += uK1


@njit(parallel=True, **KERNEL_OPTS)
def lattice(ST, act_lens, label_lens, durations, fastemit_lambda, need_grad, lp):
    """Pass 2: log P per utterance and, when need_grad, the occupancies.

    ST: (B, T, U, K + 1) float64 from pass 1 (log-probs, then 1 / S); when need_grad,
        its valid rows are overwritten with the occupancies W_k of the K transitions
        leaving the node, then the softmax coefficient (gamma + lambda W_label) / S.
    durations: (N,) int64, the big blanks' durations.
    lp: (B,) float64 out: log P (0 for T_b = 0 = L_b, -inf for an impossible
        utterance).

    Per utterance, private arrays by anti-diagonal (``[n, j]``: node (t = n - u,
    u = j - 1)): ``L`` log-probs of the transitions leaving each node, ``A`` alpha,
    ``Q`` per transition (indexed by its destination) q = exp(alpha(src) + lp -
    alpha(dest)), the share of alpha(dest) it brings, ``G`` gamma. The q into a node
    sum to 1, so a transition's occupancy is W = gamma(dest) q and gamma(node) is the
    sum of the W leaving it: the backward sweep is multiply-adds of numbers in [0, 1].
    """
    B, T, U, K1 = ST.shape
    K = K1 - 1
    N = durations.size
    C = U + COLUMN_PAD
    STf = ST.reshape(ST.size)
    uC = np.uint64(C)
    uK1 = np.uint64(K1)
    dmax = 1
    for i in range(N):
        dmax = max(dmax, durations[i])
    for b in prange(B):
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        if Tb == 0:
            lp[b] = 0.0 if Ub == 1 else NEG_INF
            continue
        nd = Tb + Ub - 1  # anti-diagonals of valid nodes: 0 .. nd - 1
        uD = np.uint64(nd * C)  # one plane of nd anti-diagonals
        # Q and G: anti-diagonals up to nd - 1 + dmax (destinations beyond the valid
        # nodes: the end node on nd, overshoots further)
        uDQ = np.uint64((nd + dmax + 1) * C)
        L = np.empty(K * nd * C)
        A = np.empty(nd * C)
        Q = np.empty(K * (nd + dmax + 1) * C)
        a_new = np.empty(C)
        mx = np.empty(C)
        acc = np.empty(C)
        v_blank = np.empty(C)
        v_label = np.empty(C)
        v_big = np.empty(max(N, 1) * C)
        sb = np.uint64(b * T * U) * uK1  # this utterance's rows in ST
        _rows_to_diagonals(STf, sb, U, K1, K, Tb, Ub, L, uD, uC)
        _alpha_sweep(
            A,
            L,
            Q,
            a_new,
            mx,
            acc,
            v_blank,
            v_label,
            v_big,
            durations,
            Tb,
            Ub,
            nd,
            uD,
            uDQ,
            uC,
        )
        lP = _log_p(A, L, durations, Tb, Ub, nd, uD, uC)
        lp[b] = lP
        if lP == NEG_INF or not need_grad:
            continue
        G = np.zeros((nd + dmax + 1) * C)
        _gamma_sweep(G, L, Q, A, mx, durations, Tb, Ub, nd, uD, uDQ, uC, lP)
        _diagonals_to_rows(L, uD, uC, Tb, Ub, fastemit_lambda, STf, sb, U, K1)


@njit(inline="always")
def _alpha_sweep(
    A, L, Q, a_new, mx, acc, v_blank, v_label, v_big, durations, Tb, Ub, nd, uD, uDQ, uC
):
    """The forward sweep of one utterance: alpha(n, j) = LSE of the transitions into
    the node, into ``A``, and the q of each of them, into ``Q`` (by destination).
    Standard RNN-T: two loops per anti-diagonal; with big blanks one loop per step and
    big blank (an inner loop over the big blanks, even one of zero trips, stops LLVM
    from vectorising the loop around it). ``a_new``, ``mx``, ``acc``, ``v_*``: scratch
    rows of C columns (``v_big``: N of them)."""
    N = durations.size
    A[U1] = 0.0
    for n in range(1, nd):
        jlo, jhi, jend = diag_range(n, Tb, Ub)
        un = np.uint64(n)
        rp = (un - U1) * uC  # anti-diagonal n - 1 (blank and label sources)
        rq = un * uC
        if N == 0:
            for j in range(jlo, jend):
                v0 = A[rp + j] + L[rp + j]  # blank from (t - 1, u): needs t >= 1
                v0 = v0 if j <= un else NEG_INF
                v1 = A[rp + j - U1] + L[uD + rp + j - U1]  # label from (t, u-1)
                v1 = v1 if j >= U2 else NEG_INF
                hi = v0 if v0 > v1 else v1
                ok = hi > NEG_INF
                lo = v1 if v0 > v1 else v0
                # LSE = hi + log(1 + e); no call under a condition (LLVM would
                # not if-convert it, and the loop would not vectorise)
                e = exp64(lo - hi if ok else NEG_INF)
                s = 1.0 + e
                a_new[j] = hi + log64(s)  # -inf when hi is
                q_hi = 1.0 / s
                q_hi = q_hi if ok else 0.0
                q_lo = e * q_hi
                Q[rq + j] = q_hi if v0 > v1 else q_lo
                Q[uDQ + rq + j] = q_lo if v0 > v1 else q_hi
            for j in range(jlo, jend):
                A[rq + j] = a_new[j]
            continue
        for j in range(jlo, jend):
            v0 = A[rp + j] + L[rp + j]
            v0 = v0 if j <= un else NEG_INF
            v1 = A[rp + j - U1] + L[uD + rp + j - U1]
            v1 = v1 if j >= U2 else NEG_INF
            v_blank[j] = v0
            v_label[j] = v1
            mx[j] = v0 if v0 > v1 else v1
        for i in range(N):
            d = durations[i]
            vo = np.uint64(i) * uC
            if n < d:
                for j in range(jlo, jend):
                    v_big[vo + j] = NEG_INF
                continue
            rs = np.uint64(n - d) * uC  # big blank from (t - d, u): needs t >= d
            rg = np.uint64(2 + i) * uD + rs
            lim = np.uint64(n - d + 1)
            for j in range(jlo, jend):
                v = A[rs + j] + L[rg + j]
                v = v if j <= lim else NEG_INF
                v_big[vo + j] = v
                mx[j] = v if v > mx[j] else mx[j]
        for j in range(jlo, jend):
            m = mx[j] if mx[j] > NEG_INF else 0.0
            mx[j] = m
            e0 = exp64(v_blank[j] - m)
            e1 = exp64(v_label[j] - m)
            v_blank[j] = e0
            v_label[j] = e1
            acc[j] = e0 + e1
        for i in range(N):
            vo = np.uint64(i) * uC
            for j in range(jlo, jend):
                e = exp64(v_big[vo + j] - mx[j])
                v_big[vo + j] = e
                acc[j] += e
        for j in range(jlo, jend):
            s = acc[j]
            A[rq + j] = mx[j] + log64(s)  # -inf when s = 0
            r = 1.0 / s
            r = r if s > 0.0 else 0.0
            mx[j] = r
            Q[rq + j] = v_blank[j] * r
            Q[uDQ + rq + j] = v_label[j] * r
        for i in range(N):
            vo = np.uint64(i) * uC
            rg = np.uint64(2 + i) * uDQ + rq
            for j in range(jlo, jend):
                Q[rg + j] = v_big[vo + j] * mx[j]


@njit(inline="always")
def _log_p(A, L, durations, Tb, Ub, nd, uD, uC):
    """log P of one utterance from its alpha: the blank from (T_b - 1, L_b) and the
    big blanks landing exactly on T_b (-inf when no path completes)."""
    N = durations.size
    jl = np.uint64(Ub)
    r_end = np.uint64(nd - 1) * uC + jl
    v_end = A[r_end] + L[r_end]
    m = v_end
    for i in range(N):
        d = durations[i]
        if Tb >= d:
            r = np.uint64(nd - d) * uC + jl
            m = max(m, A[r] + L[np.uint64(2 + i) * uD + r])
    if m == NEG_INF:
        return NEG_INF
    s = math.exp(v_end - m)
    for i in range(N):
        d = durations[i]
        if Tb >= d:
            r = np.uint64(nd - d) * uC + jl
            s += math.exp(A[r] + L[np.uint64(2 + i) * uD + r] - m)
    return m + math.log(s)


@njit(inline="always")
def _gamma_sweep(G, L, Q, A, mx, durations, Tb, Ub, nd, uD, uDQ, uC, lP):
    """The backward sweep of one utterance: gamma by anti-diagonal into ``G`` (zeros
    on entry: 0 beyond the valid nodes except 1 at the end node), the occupancy W =
    gamma(dest) q of every transition over its log-prob in ``L``. The selects drop
    transitions into nodes with gamma 0 (their q may be anything, even
    uninitialised; loaded anyway: a load under a condition would stop
    vectorisation)."""
    N = durations.size
    jl = np.uint64(Ub)
    r_end = np.uint64(nd - 1) * uC + jl
    v_end = A[r_end] + L[r_end]
    # q of the final transitions: their destination is the end node (T_b, L_b), on
    # anti-diagonal nd
    r_fin = np.uint64(nd) * uC + jl
    Q[r_fin] = math.exp(v_end - lP)
    for i in range(N):
        d = durations[i]
        q = 0.0
        if Tb >= d:
            r = np.uint64(nd - d) * uC + jl
            q = math.exp(A[r] + L[np.uint64(2 + i) * uD + r] - lP)
        Q[np.uint64(2 + i) * uDQ + r_fin] = q
    G[r_fin] = 1.0
    for n in range(nd - 1, -1, -1):
        jlo, jhi, jend = diag_range(n, Tb, Ub)
        un = np.uint64(n)
        rn = (un + U1) * uC  # anti-diagonal n + 1: blank and label destinations
        rc = un * uC
        for j in range(jlo, jend):
            g = G[rn + j]  # blank -> (t + 1, u)
            w = g * Q[rn + j]
            w = w if g > 0.0 else 0.0
            L[rc + j] = w
            gam = w
            g = G[rn + j + U1]  # label -> (t, u + 1)
            w = g * Q[uDQ + rn + j + U1]
            w = w if g > 0.0 else 0.0
            L[uD + rc + j] = w
            mx[j] = gam + w
        for i in range(N):
            rd = (un + np.uint64(durations[i])) * uC  # big blank -> (t + d, u)
            rw = np.uint64(2 + i) * uD + rc
            rq = np.uint64(2 + i) * uDQ + rd
            for j in range(jlo, jend):
                g = G[rd + j]
                w = g * Q[rq + j]
                w = w if g > 0.0 else 0.0
                L[rw + j] = w
                mx[j] += w
        for j in range(jlo, jend):
            mx[j] = mx[j] if j <= jhi else 0.0
        for j in range(jlo, jend):
            G[rc + j] = mx[j]


@njit(**KERNEL_OPTS)
def _rows_to_diagonals(STf, sb, U, K1, K, Tb, Ub, L, uD, uC):
    """Slots 0 .. K - 1 of utterance b's valid rows (row-major, K1 slots per node, from
    ``STf[sb:]``) to the K anti-diagonal planes of ``L`` (exact ranges: the loads
    must stay inside the utterance's rows). With big blanks (K > 2) a node's K slots
    at once (one plane at a time re-reads each row K times, from L2 or beyond);
    standard RNN-T plane by plane (vectorised strided loads beat node by node
    there)."""
    step = np.uint64((U - 1) * K1)
    if K > 2:  # big blanks: a node's K slots at once (contiguous loads)
        for n in range(Tb + Ub - 1):
            jlo, jhi, jend = diag_range(n, Tb, Ub)
            # node (t, u) = (n - j + 1, j - 1) is row t U + u = n U - (j - 1)(U - 1)
            src = sb + np.uint64(n * U) * np.uint64(K1) + step  # j = 0
            dst = np.uint64(n) * uC
            for j in range(jlo, jhi + U1):
                r = src - j * step
                for k in range(K):
                    L[np.uint64(k) * uD + dst + j] = STf[r + np.uint64(k)]
        return
    # one plane at a time (vectorised strided loads)
    rows_to_planes(STf, sb, U, K1, K, Tb, Ub, L, uD, uC, U0)


@njit(**KERNEL_OPTS)
def _diagonals_to_rows(L, uD, uC, Tb, Ub, fastemit_lambda, STf, sb, U, K1):
    """The occupancies in ``L`` back to utterance b's row-major rows (slot k < K), and
    the softmax coefficient (gamma + lambda W_label) / S in slot K, which still holds
    1 / S from pass 1 (strided loads, contiguous stores)."""
    uK1 = np.uint64(K1)
    K = K1 - 1
    for t in range(Tb):
        dst = sb + np.uint64(t * U) * uK1
        cell = np.uint64(t) * uC + U1  # node (t, 0); (t, u) is u (C + 1) further
        for u in range(Ub):
            gam = 0.0
            for k in range(K):
                w = L[np.uint64(k) * uD + cell]
                STf[dst + np.uint64(k)] = w
                gam += w
            coef = gam + fastemit_lambda * L[uD + cell]
            STf[dst + uK1 - U1] = coef * STf[dst + uK1 - U1]
            dst += uK1
            cell += uC + U1


@njit(parallel=True, **KERNEL_OPTS)
def rows_backward(
    labels,
    act_lens,
    label_lens,
    blank,
    big_ids,
    ST,
    lp,
    fastemit_lambda,
    clamp,
    factors,
    grads,
):
    """Pass 3: ``grads`` (B, T, U, V), holding the exps of pass 1, becomes
    ``factors[b] * clip(d cost_b / d acts_b, -clamp, clamp)`` in place.

    ST: (B, T, U, K + 1) occupancies and softmax coefficient of :func:`lattice`;
    lp: (B,) log P; factors: (B,) float64 (reduction weight times incoming gradient).
    """
    B, T, U, V = grads.shape
    K1 = ST.shape[3]
    N = big_ids.size
    gf = grads.reshape(B * T * U * V)
    STf = ST.reshape(ST.size)
    uV = np.uint64(V)
    uU = np.uint64(U)
    uK1 = np.uint64(K1)
    lam1 = 1.0 + fastemit_lambda
    total = B * T
    nch = min(total, CHUNKS)
    for ch in prange(nch):
        lo, hi = chunk(ch, nch, total)
        # the symbols' exps are read before the row is scaled and written after it: a
        # scalar load right after the vector stores to the same line would stall
        keep = np.empty(max(N, 1), np.float64)
        for bt in range(lo, hi):
            b = bt // T
            t = bt - b * T
            Tb = act_lens[b]
            if t >= Tb:
                continue  # zeroed by pass 1
            Ub = label_lens[b] + 1
            f0 = np.uint64(bt) * uU * uV
            if not math.isfinite(lp[b]):
                zero_range(gf, f0, f0 + np.uint64(Ub) * uV)
                continue
            f = factors[b]
            c_clip = clamp * abs(f)
            lim = flush_limit(f, gf)
            p = np.uint64(bt) * uU * uK1
            for u in range(Ub):
                r0 = f0 + np.uint64(u) * uV
                c = STf[p + uK1 - U1] * f
                kb = r0 + np.uint64(blank)
                g_blank = gf[kb] * c - STf[p] * f
                has_label = u < Ub - 1
                kl = r0 + np.uint64(labels[b, u]) if has_label else kb
                g_label = gf[kl] * c - lam1 * STf[p + U1] * f
                for i in range(N):
                    keep[i] = (
                        gf[r0 + np.uint64(big_ids[i])] * c
                        - STf[p + np.uint64(2 + i)] * f
                    )
                scale_flush_range(gf, r0, r0 + uV, c, lim)
                gf[kb] = flushed(g_blank, gf, lim)
                if has_label:
                    gf[kl] = flushed(g_label, gf, lim)
                for i in range(N):
                    gf[r0 + np.uint64(big_ids[i])] = flushed(keep[i], gf, lim)
                if clamp > 0.0:
                    clamp_range(gf, r0, r0 + uV, c_clip)
                p += uK1
