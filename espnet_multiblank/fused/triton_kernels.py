"""Triton kernels of the fused joint + loss's tile stages (CUDA; Triton's interpreter,
``TRITON_INTERPRET=1``, runs them on CPU tensors for the tests).

Four kernels, one launch each per tile; the launches, their grids and blocks are in
``triton_tile_ops.py``. A tile is ``R`` consecutive packed rows (``tiling.py``); row
``r`` is lattice node (b, t, u), given by ``erow[r] = b T + t`` (its row of
``enc2d``) and ``prow[r] = b U + u`` (its row of ``pred2d``), from which every kernel
derives ``b = prow // U``, ``u = prow - b U``, ``t = erow - b T`` and the node's
index on the planes' (B, T', U') grid, ``node = (b T' + t) U' + u``.

* :func:`gather_pre`: ``pre[r] = enc2d[erow[r]] + pred2d[prow[r]]`` (R, J);
* :func:`extract_rows` (forward, after ``z = act(pre) W^T + c``): per row of ``z``
  (R, V'), the log-softmax normaliser of the token part (and of the duration part
  for a TDT) and the log-probabilities the lattice reads, written to the node's row
  of the planes::

      lse   = max_k z_k + log sum_k exp(z_k - max)     (exps in z's dtype, sum float64)
      lp_s  = z[sym_s] - lse - sigma                   (each token step s; the label's
                                                        -inf on the row u = L_b)
      dur_j = z[V + j] - lse_dur                       (TDT)

  and flags utterance b in ``bad`` when lse is not finite (a NaN / +inf logit, or a
  row of only -inf);
* :func:`apply_rows` (backward, on the recomputed ``z``): ``z`` becomes, in place,
  the gradient of the reduced loss w.r.t. the tile's logits (``docs/lattice.md``
  3.3), with ``f = factors[b]`` and the occupancies the lattice left in the row::

      gamma = sum of the token steps' W
      G_k   = f (gamma + lambda W_label) exp(z_k - lse)
              - f W_blank [k = blank] - f (1 + lambda) W_label [k = y_u]
              - f W_big_i [k = big_i]                            (k < V)
      G_V+j = f gamma exp(z_V+j - lse_dur) - f W_dur_j           (TDT)

  then clipped to ``clamp |f|`` (when clamp > 0), 0 for f = 0, and values below
  ``max(|f| flush, tiny)`` set to 0 (see ``planes.GRADIENT_FLUSH_BELOW``). The
  softmax is ``exp(z - l32) * exp(l32 - lse)`` with ``l32`` = lse rounded to z's
  dtype, as in the torch and CPU tile stages;
* :func:`scatter_pre_grad`: ``d_enc[erow[r]] += d_pre[r]``, ``d_pred[prow[r]] +=
  d_pre[r]`` (atomic adds: the order of the additions, and so the last bits of the
  two gradients, may vary between runs, as with torch's ``index_add_``).

The row layout (``espnet_multiblank.loss.rows``) is given by constexprs: ``S`` token
steps (slot 0 the blank, slot 1 the label, slots 2.. the other blanks of
``step_ids``), ``D`` duration slots, ``W`` slots in all, ``P`` softmax parts; one
compiled kernel per layout serves every lattice. ``ids`` holds the layout's
``step_ids`` (int64, on the device). Every tensor is C-contiguous; the tile's
``z`` (R, V') and ``pre`` / ``d_pre`` (R, J) in the compute dtype (float32 or
float64), planes float64.

``ACCURATE_EXP``: float32 exps through libdevice's ``expf`` (as CUDA C's and the
torch ops' ``exp``) rather than ``tl.exp``'s ``ex2.approx`` (a few ulps off, more for
large arguments); off in the interpreter, whose ``tl.exp`` is numpy's.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _exp(x, ACCURATE_EXP: tl.constexpr):
    if ACCURATE_EXP:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _not_finite(x):
    return (x != x) | (tl.abs(x) == float("inf"))


@triton.jit
def _f64(x):
    """A float64 scalar argument as a float64 value (the interpreter would round a
    Python float to float32 in arithmetic; compiled, the annotation makes it
    float64)."""
    return tl.full([1], x, tl.float64)


@triton.jit
def _tile_rows(
    erow_ptr,
    prow_ptr,
    labels_ptr,
    L,
    label_lens_ptr,
    ids_ptr,
    R,
    T,
    U,
    Tp,
    Up,
    BLOCK_R: tl.constexpr,
):
    """The rows of this program of a row kernel: (r, rmask, blank, b, node,
    has_label, label), int64 vectors but ``blank`` (the layout's blank id, a scalar)
    and ``rmask`` (r < R)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < R
    blank = tl.load(ids_ptr)
    er = tl.load(erow_ptr + r, mask=rmask, other=0)
    pr = tl.load(prow_ptr + r, mask=rmask, other=0)
    b = pr // U
    u = pr - b * U
    t = er - b * T
    node = (b * Tp + t) * Up + u
    L_b = tl.load(label_lens_ptr + b, mask=rmask, other=0)
    has_label = u < L_b
    lab = tl.load(
        labels_ptr + b * L + tl.minimum(u, L - 1), mask=rmask & has_label, other=0
    )
    label = tl.where(has_label, lab, blank)
    return r, rmask, blank, b, node, has_label, label


@triton.jit
def _finish_grad(g, live, cap, limit, CLAMP: tl.constexpr):
    """A block of gradient values (rows x columns) clipped to +-cap (with CLAMP),
    0 on rows that are not ``live`` (factor 0) and where |g| < limit."""
    if CLAMP:
        g = tl.minimum(tl.maximum(g, -cap[:, None]), cap[:, None])
    g = tl.where(live[:, None], g, 0.0)
    return tl.where((g < limit[:, None]) & (g > -limit[:, None]), 0.0, g)


@triton.jit
def _row_block(erow_ptr, prow_ptr, R, J, BLOCK_R: tl.constexpr, BLOCK_J: tl.constexpr):
    """The block of this program of the gather and scatter kernels: (r, j, m, er,
    pr), its rows ``r`` (int64) and columns ``j`` of the (R, J) tile, the mask ``m``
    (rows x columns inside the tile) and the rows' enc and pred rows (int64; 0 past
    the tile)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    rmask = r < R
    m = rmask[:, None] & (j < J)[None, :]
    er = tl.load(erow_ptr + r, mask=rmask, other=0)
    pr = tl.load(prow_ptr + r, mask=rmask, other=0)
    return r, j, m, er, pr


#: the sizes that change from batch to batch (tile rows, frames, label positions):
#: not specialised on (Triton compiles a kernel per value class of a specialised
#: integer, 1 or a multiple of 16, which would recompile as the batches' shapes vary)
_BATCH_SIZES = ["R", "T", "U", "Tp", "Up", "L"]


@triton.jit(do_not_specialize=["R"])
def gather_pre(
    enc_ptr,
    pred_ptr,
    erow_ptr,
    prow_ptr,
    out_ptr,
    R,
    J,
    BLOCK_R: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    r, j, m, er, pr = _row_block(erow_ptr, prow_ptr, R, J, BLOCK_R, BLOCK_J)
    x = tl.load(enc_ptr + er[:, None] * J + j[None, :], mask=m, other=0.0)
    y = tl.load(pred_ptr + pr[:, None] * J + j[None, :], mask=m, other=0.0)
    tl.store(out_ptr + r[:, None] * J + j[None, :], x + y, mask=m)


@triton.jit(do_not_specialize=["R"])
def scatter_pre_grad(
    d_pre_ptr,
    erow_ptr,
    prow_ptr,
    d_enc_ptr,
    d_pred_ptr,
    R,
    J,
    BLOCK_R: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    r, j, m, er, pr = _row_block(erow_ptr, prow_ptr, R, J, BLOCK_R, BLOCK_J)
    d = tl.load(d_pre_ptr + r[:, None] * J + j[None, :], mask=m, other=0.0)
    tl.atomic_add(d_enc_ptr + er[:, None] * J + j[None, :], d, mask=m)
    tl.atomic_add(d_pred_ptr + pr[:, None] * J + j[None, :], d, mask=m)


@triton.jit(do_not_specialize=_BATCH_SIZES)
def extract_rows(
    z_ptr,
    R,
    Vp,
    V,
    erow_ptr,
    prow_ptr,
    T,
    U,
    Tp,
    Up,
    labels_ptr,
    L,
    label_lens_ptr,
    ids_ptr,
    sigma: tl.float64,
    rows_ptr,
    lse_ptr,
    bad_ptr,
    S: tl.constexpr,
    D: tl.constexpr,
    W: tl.constexpr,
    P: tl.constexpr,
    ACCURATE_EXP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r, rmask, blank, b, node, has_label, label = _tile_rows(
        erow_ptr,
        prow_ptr,
        labels_ptr,
        L,
        label_lens_ptr,
        ids_ptr,
        R,
        T,
        U,
        Tp,
        Up,
        BLOCK_R,
    )
    zrow = z_ptr + r * Vp
    cols = tl.arange(0, BLOCK_V)
    # the token part's normaliser: max, then the sum of exps (two reads of the row;
    # the second from the caches)
    m = tl.full([BLOCK_R], float("-inf"), z_ptr.dtype.element_ty)
    for v0 in range(0, V, BLOCK_V):
        mk = rmask[:, None] & ((v0 + cols) < V)[None, :]
        x = tl.load(zrow[:, None] + v0 + cols[None, :], mask=mk, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, 1))
    m = tl.where(rmask, m, 0.0)  # rows past the tile: no -inf - -inf
    s = tl.zeros([BLOCK_R], tl.float64)
    for v0 in range(0, V, BLOCK_V):
        mk = rmask[:, None] & ((v0 + cols) < V)[None, :]
        x = tl.load(zrow[:, None] + v0 + cols[None, :], mask=mk, other=float("-inf"))
        e = _exp(x - m[:, None], ACCURATE_EXP)
        s += tl.sum(e.to(tl.float64), 1)
    lse = m.to(tl.float64) + tl.log(tl.where(rmask, s, 1.0))
    out = rows_ptr + node * W
    shift = lse + _f64(sigma)
    z_blank = tl.load(zrow + blank, mask=rmask, other=0.0)
    tl.store(out, z_blank.to(tl.float64) - shift, mask=rmask)
    z_label = tl.load(zrow + label, mask=rmask, other=0.0)
    lp_label = tl.where(has_label, z_label.to(tl.float64) - shift, float("-inf"))
    tl.store(out + 1, lp_label, mask=rmask)
    for s_ in tl.static_range(2, S):
        sym = tl.load(ids_ptr + (s_ - 1))
        z_s = tl.load(zrow + sym, mask=rmask, other=0.0)
        tl.store(out + s_, z_s.to(tl.float64) - shift, mask=rmask)
    bad = _not_finite(lse)
    if D > 0:
        dcols = tl.arange(0, BLOCK_D)
        dm = rmask[:, None] & (dcols < D)[None, :]
        xd = tl.load(zrow[:, None] + V + dcols[None, :], mask=dm, other=float("-inf"))
        md = tl.where(rmask, tl.max(xd, 1), 0.0)
        ed = _exp(xd - md[:, None], ACCURATE_EXP)
        sd = tl.where(rmask, tl.sum(ed.to(tl.float64), 1), 1.0)
        lse_d = md.to(tl.float64) + tl.log(sd)
        lp_d = xd.to(tl.float64) - lse_d[:, None]
        tl.store(out[:, None] + S + dcols[None, :], lp_d, mask=dm)
        tl.store(lse_ptr + node * 2, lse, mask=rmask)
        tl.store(lse_ptr + node * 2 + 1, lse_d, mask=rmask)
        bad = bad | _not_finite(lse_d)
    else:
        tl.store(lse_ptr + node, lse, mask=rmask)
    # the coefficient slots: r = 1 (the fused path's convention, loss/rows.py)
    for p in tl.static_range(P):
        tl.store(out + (S + D + p), tl.full([BLOCK_R], 1.0, tl.float64), mask=rmask)
    # every flagging program writes the same value: no atomics needed
    flag = tl.full([BLOCK_R], 1, bad_ptr.dtype.element_ty)
    tl.store(bad_ptr + b, flag, mask=rmask & bad)


@triton.jit(do_not_specialize=_BATCH_SIZES)
def apply_rows(
    z_ptr,
    R,
    Vp,
    V,
    erow_ptr,
    prow_ptr,
    T,
    U,
    Tp,
    Up,
    labels_ptr,
    L,
    label_lens_ptr,
    ids_ptr,
    rows_ptr,
    lse_ptr,
    factors_ptr,
    fastemit_lambda: tl.float64,
    clamp: tl.float64,
    flush: tl.float64,
    S: tl.constexpr,
    D: tl.constexpr,
    W: tl.constexpr,
    P: tl.constexpr,
    CLAMP: tl.constexpr,
    ACCURATE_EXP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    r, rmask, blank, b, node, has_label, label = _tile_rows(
        erow_ptr,
        prow_ptr,
        labels_ptr,
        L,
        label_lens_ptr,
        ids_ptr,
        R,
        T,
        U,
        Tp,
        Up,
        BLOCK_R,
    )
    zty = z_ptr.dtype.element_ty
    f = tl.load(factors_ptr + b, mask=rmask, other=0.0)
    live = f != 0.0
    occ = rows_ptr + node * W
    # rows of utterances with factor 0 may hold anything (an impossible utterance
    # keeps its log-probs): their occupancies read as 0, their gradient is 0
    w_blank = tl.where(live, tl.load(occ, mask=rmask, other=0.0), 0.0)
    w_label = tl.where(live, tl.load(occ + 1, mask=rmask, other=0.0), 0.0)
    gamma = w_blank + w_label
    for s_ in tl.static_range(2, S):
        gamma += tl.where(live, tl.load(occ + s_, mask=rmask, other=0.0), 0.0)
    lam = _f64(fastemit_lambda)
    coef = (gamma + lam * w_label) * f
    lse = tl.load(lse_ptr + node * P, mask=rmask, other=0.0)
    l32 = lse.to(zty)
    scale = (coef * tl.exp(l32.to(tl.float64) - lse)).to(zty)
    step_blank = (w_blank * f).to(zty)
    step_label = ((w_label * f) * (1.0 + lam)).to(zty)
    af = tl.abs(f)
    if zty == tl.float64:
        tiny = tl.full([1], 2.2250738585072014e-308, tl.float64)
    else:
        tiny = tl.full([1], 1.1754943508222875e-38, tl.float64)
    limit = tl.maximum(af * _f64(flush), tiny).to(zty)
    cap = (_f64(clamp) * af).to(zty)
    zrow = z_ptr + r * Vp
    cols = tl.arange(0, BLOCK_V)
    for v0 in range(0, V, BLOCK_V):
        k = v0 + cols
        mk = rmask[:, None] & (k < V)[None, :]
        x = tl.load(zrow[:, None] + k[None, :], mask=mk, other=0.0)
        g = _exp(x - l32[:, None], ACCURATE_EXP) * scale[:, None]
        g = tl.where(k[None, :] == blank, g - step_blank[:, None], g)
        g = tl.where(k[None, :] == label[:, None], g - step_label[:, None], g)
        for s_ in tl.static_range(2, S):
            sym = tl.load(ids_ptr + (s_ - 1))
            w_s = tl.where(live, tl.load(occ + s_, mask=rmask, other=0.0), 0.0)
            g = tl.where(k[None, :] == sym, g - (w_s * f).to(zty)[:, None], g)
        g = _finish_grad(g, live, cap, limit, CLAMP)
        tl.store(zrow[:, None] + k[None, :], g, mask=mk)
    if D > 0:
        dcols = tl.arange(0, BLOCK_D)
        dm = rmask[:, None] & (dcols < D)[None, :]
        xd = tl.load(zrow[:, None] + V + dcols[None, :], mask=dm, other=0.0)
        lse_d = tl.load(lse_ptr + node * 2 + 1, mask=rmask, other=0.0)
        l32d = lse_d.to(zty)
        scale_d = (gamma * f * tl.exp(l32d.to(tl.float64) - lse_d)).to(zty)
        gd = _exp(xd - l32d[:, None], ACCURATE_EXP) * scale_d[:, None]
        w_d = tl.load(occ[:, None] + S + dcols[None, :], mask=dm, other=0.0)
        w_d = tl.where(live[:, None], w_d, 0.0)
        gd = gd - (w_d * f[:, None]).to(zty)
        gd = _finish_grad(gd, live, cap, limit, CLAMP)
        tl.store(zrow[:, None] + V + dcols[None, :], gd, mask=dm)
