"""Numba CPU kernels of the TDT loss: three passes, both log-softmaxes fused.

The same kernel family as the multi-blank kernels (``kernels.py``: read its module
docstring for the design and the performance rules, which hold here too), with the
TDT lattice of ``docs/lattice.md`` section 3. Notation (utterance b; a row ``x =
acts[b, t, u, :]`` holds V token logits then D duration logits; T_b frames, L_b labels,
U_b = L_b + 1):

    tok(t,u,k) = x_k - LSE(x[:V]) - sigma          dur(t,u,j) = x_{V+j} - LSE(x[V:])

Per node, a row-major (B, T, U, D + 4) float64 array carries, between the passes:
slot 0 tok(blank), slot 1 tok(y_u) (-inf on the last row), slot 2 + j dur(j), then
the reciprocals of the two sums of exps (slots D + 2, D + 3).

Pass 1, :func:`tdt_rows_forward` (frames over threads): the logits are read once; one
shift per frame (its largest logit, token or duration; a part whose exps all fall
below 2**-60 with it is redone with its own maximum); ``exp(x - shift)`` of both parts
goes into the gradient buffer (padding rows zeroed), the vectorised float32 exp of
``row_ops``.

Pass 2, :func:`tdt_lattice` (utterances over threads): anti-diagonal sweeps (n = t + u)
vectorised over u in float64 with the polynomial exp / log. Every TDT step goes to a
later anti-diagonal (a blank with duration e >= 1 from n - e, a label with duration e
from n - e - 1), so a whole anti-diagonal depends on earlier ones only. The forward
sweep computes alpha and, per step, ``q = exp(alpha(src) + tok + dur - alpha(dest))``
stored by destination (2 D planes: blank with duration j, label with duration j); the
backward sweep needs no beta: ``gamma(end) = 1``, ``W = gamma(dest) q``, ``gamma(node)
= sum of the W leaving it``. The node's row gets back W_blank, W_label, W_dur(j) and
the softmax coefficients ``(gamma + lambda W_label) / S_tok`` and ``gamma / S_dur``.

Pass 3, :func:`tdt_rows_backward` (frames over threads), with f_b the utterance's factor
(reduction weight times incoming gradient) and e the exps in the buffer:

    g[k]     = f_b [ (gamma + lambda W_label) e_k / S_tok - W_blank [k = blank]
                     - (1 + lambda) W_label [k = y_u] ]                   (k < V)
    g[V + j] = f_b [ gamma e_{V+j} / S_dur - W_dur(j) ]

with values below ``|f_b| 2**-80`` set to 0 (``row_ops.flush_limit``), clipped to
[-clamp |f_b|, clamp |f_b|]. Padding rows and impossible utterances get 0.
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
    chunk,
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


@njit(**KERNEL_OPTS)
def _part_exps(xf, lo, hi, c, out, o0):
    """(sum of exps, shift) of x[lo:hi] written to out[o0:]: with shift ``c`` unless
    the sum falls below MIN_ROW_SUM, then with the part's own maximum (sum 0 when the
    part holds only -inf)."""
    s = exp_sum(xf, lo, hi, c, out, o0)
    if s >= MIN_ROW_SUM:
        return s, c
    m, _ = max_and_check(xf, lo, hi)
    if m == NEG_INF:
        return 0.0, m
    return exp_sum(xf, lo, hi, m, out, o0), m


@njit(parallel=True, **KERNEL_OPTS)
def tdt_rows_forward(
    acts, labels, act_lens, label_lens, blank, V, sigma, store, exps, ST, bad
):
    """Pass 1.

    acts: (B, T, U, V + D) float32/64 C-contiguous; labels: (B, L) int64;
    act_lens, label_lens: (B,) int64; blank < V.
    store: write the exps into ``exps`` (B, T, U, V + D) (acts dtype; the gradient
        buffer), padding rows zeroed; else ``exps`` is not touched.
    ST: (B, T, U, D + 4) float64 out, valid rows only (see the module docstring).
    bad: (B,) uint8 out: 1 when a valid row holds NaN / +inf or a part of only -inf.
    """
    B, T, U, VD = acts.shape
    D = VD - V
    K1 = ST.shape[3]
    xf = acts.reshape(B * T * U * VD)
    ef = exps.reshape(exps.size)
    STf = ST.reshape(ST.size)
    uVD = np.uint64(VD)
    uV = np.uint64(V)
    uU = np.uint64(U)
    uK1 = np.uint64(K1)
    uDs = np.uint64(D + 2)
    total = B * T
    nch = min(total, CHUNKS)
    frame_wide = VD < FRAME_WIDE_BELOW_V
    for ch in prange(nch):
        lo, hi = chunk(ch, nch, total)
        scratch = np.empty(1 if store else U * VD, acts.dtype)
        sums = np.ones(U + LANES)
        shifts = np.zeros(U + LANES)
        dsums = np.ones(U + LANES)
        dshifts = np.zeros(U + LANES)
        inv = np.empty(U + LANES)
        dinv = np.empty(U + LANES)
        dbuf = np.empty(U * D, acts.dtype)
        ebuf = np.empty(U * D, acts.dtype)
        for bt in range(lo, hi):
            b = bt // T
            t = bt - b * T
            Tb = act_lens[b]
            Ub = label_lens[b] + 1
            f0 = np.uint64(bt) * uU * uVD  # frame start
            f1 = f0 + uU * uVD
            if t >= Tb:
                if store:
                    zero_range(ef, f0, f1)
                continue
            fe = f0 + np.uint64(Ub) * uVD
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
            if frame_wide:  # all exps of the frame in one loop (see kernels.py)
                exp_range(xf, f0, fe, c, out, o0)
            else:
                # the duration logits of the frame gathered into one contiguous run,
                # so that their exps vectorise (D exps per row one by one cost more
                # than the V token exps)
                for u in range(Ub):
                    r0 = f0 + np.uint64(u) * uVD + uV
                    for j in range(D):
                        dbuf[u * D + j] = xf[r0 + np.uint64(j)]
                exp_sum(dbuf, U0, np.uint64(Ub * D), c, ebuf, U0)
            for u in range(Ub):
                r0 = f0 + np.uint64(u) * uVD
                q0 = o0 + np.uint64(u) * uVD
                if frame_wide:
                    s = np.float64(sum_range(out, q0, q0 + uV))
                else:
                    s = exp_sum(xf, r0, r0 + uV, c, out, q0)
                sh = c
                if s < MIN_ROW_SUM:
                    s, sh = _part_exps(xf, r0, r0 + uV, c, out, q0)
                ds = 0.0
                for j in range(D):
                    if frame_wide:
                        e = out[q0 + uV + np.uint64(j)]
                    else:
                        e = ebuf[u * D + j]
                        out[q0 + uV + np.uint64(j)] = e
                    ds += e
                dsh = c
                if ds < MIN_ROW_SUM:
                    ds, dsh = _part_exps(xf, r0 + uV, r0 + uVD, c, out, q0 + uV)
                if s == 0.0 or ds == 0.0:
                    bad[b] = 1
                    break
                sums[u] = s
                shifts[u] = sh
                dsums[u] = ds
                dshifts[u] = dsh
            if bad[b]:
                continue
            for u in range(((Ub + LANES - 1) // LANES) * LANES):  # vectorised
                inv[u] = 1.0 / sums[u]
                sums[u] = shifts[u] + log64(sums[u]) + sigma
                dinv[u] = 1.0 / dsums[u]
                dsums[u] = dshifts[u] + log64(dsums[u])
            p = np.uint64(bt) * uU * uK1
            for u in range(Ub):
                r0 = f0 + np.uint64(u) * uVD
                d = sums[u]
                STf[p] = np.float64(xf[r0 + np.uint64(blank)]) - d
                if u < Ub - 1:
                    STf[p + U1] = np.float64(xf[r0 + np.uint64(labels[b, u])]) - d
                else:
                    STf[p + U1] = NEG_INF
                dd = dsums[u]
                for j in range(D):
                    STf[p + np.uint64(2 + j)] = (
                        np.float64(xf[r0 + uV + np.uint64(j)]) - dd
                    )
                STf[p + uDs] = inv[u]
                STf[p + uDs + U1] = dinv[u]
                p += uK1


@njit(parallel=True, **KERNEL_OPTS)
def tdt_lattice(
    ST, act_lens, label_lens, durations, fastemit_lambda, need_grad, groups, lp
):
    """Pass 2: log P per utterance and, when need_grad, the occupancies.

    ST: (B, T, U, D + 4) float64 from pass 1; when need_grad, the valid rows of a
        possible utterance get W_blank, W_label, W_dur(0 .. D-1) in slots 0 .. D + 1,
        and the coefficients (gamma + lambda W_label) / S_tok and gamma / S_dur in
        slots D + 2 and D + 3.
    durations: (D,) int64, distinct, any order.
    groups: number of groups of consecutive utterances swept together (over threads).
    lp: (B,) float64 out: log P (0 for T_b = 0 = L_b, -inf for an impossible
        utterance).

    The utterances of a group sit side by side in private arrays by anti-diagonal
    (``[n, c]``, column c = 1 + i C + j for the group's utterance i and node
    (t = n - j + 1, u = j - 1), C = U + 1): one vector loop covers the anti-diagonal
    of every utterance of the group (short anti-diagonals, one loop per utterance,
    cost more in loop overhead than in arithmetic). ``L`` the D + 2 log-prob planes,
    ``A`` alpha, ``R`` 1 / (sum of the exps of alpha's LSE), ``Q`` the 2 D planes of
    exp(step value - max) by destination (plane j: blank with duration j, plane
    D + j: label with duration j), ``H`` gamma * R. Node (n, c) is valid when
    ``lo[c] <= n <= hi[c]``; the end node (T_b, L_b) is swept like a node into which
    only blanks go: its alpha is log P. Invalid columns hold anything; the selects
    keep it out of the valid ones.
    """
    B, T, U, K1 = ST.shape
    D = durations.size
    K = D + 2
    C = U + 1
    STf = ST.reshape(ST.size)
    dmax = 1
    for k in range(D):
        dmax = max(dmax, durations[k])
    for gi in prange(groups):
        b0 = gi * B // groups
        b1 = (gi + 1) * B // groups
        nb = b1 - b0
        nmax = 0  # last anti-diagonal: the latest end node of the group
        for b in range(b0, b1):
            Tb = act_lens[b]
            Ub = label_lens[b] + 1
            if Tb == 0:
                lp[b] = 0.0 if Ub == 1 else NEG_INF
            else:
                nmax = max(nmax, Tb + Ub - 1)
        if nmax == 0:
            continue
        W = ((nb * C + 2 + LANES - 1) // LANES) * LANES
        cend = np.uint64(W)
        uW = np.uint64(W)
        nq = nmax + dmax + 2  # anti-diagonals of Q and H (destinations beyond nmax)
        uP = np.uint64((nmax + 1) * W)  # one L plane
        uPQ = np.uint64(nq * W)
        L = np.empty(K * (nmax + 1) * W)
        A = np.empty((nmax + 1) * W)
        R = np.empty((nmax + 1) * W)
        Q = np.empty(2 * D * nq * W)
        H = np.zeros(nq * W)
        lo = np.zeros(W)
        hi = np.full(W, -1.0)
        endn = np.full(W, -1.0)
        mx = np.empty(W)
        acc = np.empty(W)
        wl = np.empty(W)
        _tdt_group_to_diagonals(
            STf, act_lens, label_lens, b0, b1, T, U, K1, L, uP, uW, lo, hi, endn, A
        )
        _tdt_alpha_sweep(
            A, R, L, Q, mx, acc, lo, hi, durations, nmax, cend, uW, uP, uPQ
        )
        for b in range(b0, b1):
            Tb = act_lens[b]
            if Tb == 0:
                continue
            Ub = label_lens[b] + 1
            lp[b] = A[np.uint64(Tb + Ub - 1) * uW + np.uint64(1 + (b - b0) * C + Ub)]
        if not need_grad:
            continue
        _tdt_gamma_sweep(
            H, L, Q, R, mx, wl, lo, hi, endn, durations, nmax, cend, uW, uP, uPQ
        )
        _tdt_group_to_rows(
            L, act_lens, label_lens, b0, b1, T, U, K1, uP, uW, fastemit_lambda, STf
        )


@njit(inline="always")
def _tdt_group_to_diagonals(
    STf, act_lens, label_lens, b0, b1, T, U, K1, L, uP, uW, lo, hi, endn, A
):
    """The rows of the group's utterances b0 .. b1 - 1 to their columns of the ``L``
    planes, each column's range of valid anti-diagonals (``lo``, ``hi``; ``endn`` the
    end node's), and alpha(0, 0) = 0."""
    C = U + 1
    K = K1 - 2
    uK1 = np.uint64(K1)
    for b in range(b0, b1):
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        if Tb == 0:
            continue
        c0 = 1 + (b - b0) * C
        for j in range(C):
            lo[c0 + j] = j - 1.0
            if 1 <= j <= Ub:
                hi[c0 + j] = Tb + j - 2.0
        endn[c0 + Ub] = Tb + Ub - 1.0
        _tdt_rows_to_diagonals(
            STf, np.uint64(b * T * U) * uK1, U, K1, K, Tb, Ub, L, uP, uW, c0
        )
    for b in range(b0, b1):  # alpha(0, 0) = 0 (anti-diagonal 0, column j = 1)
        A[np.uint64(1 + (b - b0) * C + 1)] = 0.0


@njit(inline="always")
def _tdt_alpha_sweep(A, R, L, Q, mx, acc, lo, hi, durations, nmax, cend, uW, uP, uPQ):
    """The forward sweep of a group: alpha by anti-diagonal into ``A`` (the end
    node's alpha is log P), the exps of the steps into a node relative to their
    maximum into ``Q`` (by destination) and 1 / their sum into ``R``. ``mx``,
    ``acc``: scratch rows."""
    D = durations.size
    for n in range(1, nmax + 1):
        fn = np.float64(n)
        rq = np.uint64(n) * uW
        for c in range(U0, cend):
            mx[c] = NEG_INF
        for k in range(D):
            e = durations[k]
            rd = np.uint64(2 + k) * uP
            if e >= 1 and n >= e:  # blank from (t - e, u)
                rs = np.uint64(n - e) * uW
                qb = np.uint64(k) * uPQ + rq
                fs = np.float64(n - e)
                for c in range(U0, cend):
                    v = A[rs + c] + L[rs + c] + L[rd + rs + c]
                    v = v if fs >= lo[c] else NEG_INF
                    Q[qb + c] = v
                    mx[c] = v if v > mx[c] else mx[c]
            if n >= e + 1:  # label from (t - e, u - 1); never into the end
                rs = np.uint64(n - e - 1) * uW - U1
                ql = np.uint64(D + k) * uPQ + rq
                fs = np.float64(n - e)
                for c in range(U1, cend):
                    v = A[rs + c] + L[uP + rs + c] + L[rd + rs + c]
                    ok = (lo[c] >= 1.0) & (fs >= lo[c]) & (fn <= hi[c])
                    v = v if ok else NEG_INF
                    Q[ql + c] = v
                    mx[c] = v if v > mx[c] else mx[c]
        for c in range(U0, cend):
            m = mx[c]
            mx[c] = m if m > NEG_INF else 0.0
            acc[c] = 0.0
        for k in range(D):
            e = durations[k]
            if e >= 1 and n >= e:
                qb = np.uint64(k) * uPQ + rq
                for c in range(U0, cend):
                    x = exp64(Q[qb + c] - mx[c])
                    Q[qb + c] = x
                    acc[c] += x
            if n >= e + 1:
                ql = np.uint64(D + k) * uPQ + rq
                for c in range(U1, cend):
                    x = exp64(Q[ql + c] - mx[c])
                    Q[ql + c] = x
                    acc[c] += x
        for c in range(U0, cend):
            s = acc[c]
            A[rq + c] = mx[c] + log64(s)  # -inf when s = 0
            r = 1.0 / s
            R[rq + c] = r if s > 0.0 else 0.0


@njit(inline="always")
def _tdt_gamma_sweep(
    H, L, Q, R, mx, wl, lo, hi, endn, durations, nmax, cend, uW, uP, uPQ
):
    """The backward sweep of a group: H = gamma / S by anti-diagonal (zeros on entry;
    gamma(end) = 1), a step's occupancy W = H(dest) * Q; H is 0 at invalid nodes, the
    selects drop the steps into them (their Q may be anything). W_blank, W_label and
    W_dur(j) of each node go over its log-probs in ``L``. ``mx``, ``wl``: scratch
    rows."""
    D = durations.size
    for n in range(nmax, -1, -1):
        fn = np.float64(n)
        un = np.uint64(n)
        rc = un * uW
        for c in range(U0, cend):
            mx[c] = 0.0  # W_blank
            wl[c] = 0.0  # W_label
        for k in range(D):
            e = np.uint64(durations[k])
            rw = np.uint64(2 + k) * uP + rc
            rl = (un + e + U1) * uW + U1  # label -> (t + e, u + 1)
            ql = np.uint64(D + k) * uPQ + rl
            if e >= U1:
                rb = (un + e) * uW  # blank -> (t + e, u)
                qb = np.uint64(k) * uPQ + rb
                for c in range(U0, cend - U1):
                    h = H[rb + c]
                    w = h * Q[qb + c]
                    w = w if h > 0.0 else 0.0
                    h2 = H[rl + c]
                    w2 = h2 * Q[ql + c]
                    w2 = w2 if h2 > 0.0 else 0.0
                    L[rw + c] = w + w2
                    mx[c] += w
                    wl[c] += w2
            else:
                for c in range(U0, cend - U1):
                    h2 = H[rl + c]
                    w2 = h2 * Q[ql + c]
                    w2 = w2 if h2 > 0.0 else 0.0
                    L[rw + c] = w2
                    wl[c] += w2
        for c in range(U0, cend - U1):
            gam = mx[c] + wl[c]
            ok = (fn >= lo[c]) & (fn <= hi[c])
            g = gam if ok else 0.0
            g = 1.0 if fn == endn[c] else g
            H[rc + c] = g * R[rc + c]
            L[rc + c] = mx[c]
            L[uP + rc + c] = wl[c]


@njit(inline="always")
def _tdt_group_to_rows(
    L, act_lens, label_lens, b0, b1, T, U, K1, uP, uW, fastemit_lambda, STf
):
    """The occupancies of the group's utterances back to their rows."""
    C = U + 1
    D = K1 - 4
    uK1 = np.uint64(K1)
    for b in range(b0, b1):
        Tb = act_lens[b]
        if Tb == 0:
            continue
        Ub = label_lens[b] + 1
        _tdt_diagonals_to_rows(
            L,
            uP,
            uW,
            np.uint64(1 + (b - b0) * C),
            Tb,
            Ub,
            D,
            fastemit_lambda,
            STf,
            np.uint64(b * T * U) * uK1,
            U,
            K1,
        )


@njit(**KERNEL_OPTS)
def _tdt_rows_to_diagonals(STf, sb, U, K1, K, Tb, Ub, L, uP, uW, c0):
    """Slots 0 .. K - 1 of an utterance's valid rows (row-major, from ``STf[sb:]``) to
    the K planes of ``L``, columns c0 + j (``common.rows_to_planes``)."""
    rows_to_planes(STf, sb, U, K1, K, Tb, Ub, L, uP, uW, np.uint64(c0))


@njit(**KERNEL_OPTS)
def _tdt_diagonals_to_rows(L, uP, uW, c0, Tb, Ub, D, fastemit_lambda, STf, sb, U, K1):
    """The occupancies in ``L`` (columns c0 + j) back to an utterance's row-major rows
    (slots 0 .. D + 1) and the two softmax coefficients (slots D + 2, D + 3, which
    hold 1 / S_tok and 1 / S_dur from pass 1)."""
    uK1 = np.uint64(K1)
    uDs = np.uint64(D + 2)
    for t in range(Tb):
        dst = sb + np.uint64(t * U) * uK1
        cell = np.uint64(t) * uW + c0 + U1  # node (t, 0); (t, u) is u (W + 1) further
        for u in range(Ub):
            for k in range(D + 2):
                STf[dst + np.uint64(k)] = L[np.uint64(k) * uP + cell]
            w_blank = L[cell]
            w_label = L[uP + cell]
            gam = w_blank + w_label
            STf[dst + uDs] = (gam + fastemit_lambda * w_label) * STf[dst + uDs]
            STf[dst + uDs + U1] = gam * STf[dst + uDs + U1]
            dst += uK1
            cell += uW + U1


@njit(parallel=True, **KERNEL_OPTS)
def tdt_rows_backward(
    labels,
    act_lens,
    label_lens,
    blank,
    V,
    ST,
    lp,
    fastemit_lambda,
    clamp,
    factors,
    grads,
):
    """Pass 3: ``grads`` (B, T, U, V + D), holding the exps of pass 1, becomes
    ``factors[b] * clip(d cost_b / d acts_b, -clamp, clamp)`` in place.

    ST: (B, T, U, D + 4) occupancies and coefficients of :func:`tdt_lattice`;
    lp: (B,) log P; factors: (B,) float64 (reduction weight times incoming gradient).
    """
    B, T, U, VD = grads.shape
    D = VD - V
    K1 = ST.shape[3]
    gf = grads.reshape(B * T * U * VD)
    STf = ST.reshape(ST.size)
    uVD = np.uint64(VD)
    uV = np.uint64(V)
    uU = np.uint64(U)
    uK1 = np.uint64(K1)
    uDs = np.uint64(D + 2)
    lam1 = 1.0 + fastemit_lambda
    total = B * T
    nch = min(total, CHUNKS)
    for ch in prange(nch):
        lo, hi = chunk(ch, nch, total)
        for bt in range(lo, hi):
            b = bt // T
            t = bt - b * T
            Tb = act_lens[b]
            if t >= Tb:
                continue  # zeroed by pass 1
            Ub = label_lens[b] + 1
            f0 = np.uint64(bt) * uU * uVD
            if not math.isfinite(lp[b]):
                zero_range(gf, f0, f0 + np.uint64(Ub) * uVD)
                continue
            f = factors[b]
            c_clip = clamp * abs(f)
            lim = flush_limit(f, gf)
            p = np.uint64(bt) * uU * uK1
            for u in range(Ub):
                r0 = f0 + np.uint64(u) * uVD
                c = STf[p + uDs] * f
                cd = STf[p + uDs + U1] * f
                kb = r0 + np.uint64(blank)
                g_blank = gf[kb] * c - STf[p] * f
                has_label = u < Ub - 1
                kl = r0 + np.uint64(labels[b, u]) if has_label else kb
                g_label = gf[kl] * c - lam1 * STf[p + U1] * f
                scale_flush_range(gf, r0, r0 + uV, c, lim)
                gf[kb] = flushed(g_blank, gf, lim)
                if has_label:
                    gf[kl] = flushed(g_label, gf, lim)
                for j in range(D):
                    kd = r0 + uV + np.uint64(j)
                    g = gf[kd] * cd - STf[p + np.uint64(2 + j)] * f
                    gf[kd] = flushed(g, gf, lim)
                if clamp > 0.0:
                    clamp_range(gf, r0, r0 + uVD, c_clip)
                p += uK1
