"""What the multi-blank and the TDT CUDA kernels share: element I/O, the row kernels'
start, row reductions and step log-probs, the whole gradient and weights kernels, the
alpha / beta kernels' body (anti-diagonal sweeps, log P and the costs), LSE, and the
caches of compiled kernels.

The shared pieces are device functions (``inline=True``: inlined into each kernel by
Numba, so the kernels compile as if they were written out in them) and factories of
device functions or kernels for what depends on compile-time constants (storage, row
layout) or on a family's own device functions (``make_grad_kernel``'s
``row_constants`` and ``grad_of``, ``make_weights_kernel``'s ``cell_weights``,
``make_alpha_beta``'s ``alpha_of`` / ``beta_of`` / ``log_p_of``).

Imports ``numba.cuda``: import it lazily (the kernels' modules do).

Storage kinds (the logits' dtype as the kernels see it):

==========  ===========================  ==================  =====================
storage     array handed to the kernel   compute dtype (CT)  gradient written as
==========  ===========================  ==================  =====================
float64     float64                      float64             float64
float32     float32                      float32             float32
float16     float16                      float32             float16 (round to
                                                             nearest even)
bfloat16    int16 (the tensor's bits,    float32             bfloat16 bits (round
            ``tensor.view(torch.int16)``)                    to nearest even)
==========  ===========================  ==================  =====================

numba has no bfloat16 type: a bfloat16 is the high half of a float32, so its 16 bits
shifted left by 16 are that float32's bits. The bit moves are ``libdevice``'s
``int_as_float`` / ``float_as_int`` (one ``mov.b32`` each) on a GPU and numpy views
in the simulator (which has no libdevice); the rounding arithmetic around them is the
same code in both.
"""

import math
from typing import NamedTuple

import numba
import numpy as np
from numba import config as _numba_config
from numba import cuda, types

import espnet_multiblank.loss.cuda.numpy_compat  # noqa: F401 (before a compile)

NEG_INF = -math.inf
POS_INF = math.inf

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

STORAGES = ("float64", "float32", "float16", "bfloat16")

if SIMULATOR:

    def _int_as_float(i):
        """float32 whose bits are the low 32 bits of the int ``i``."""
        return np.array([i], np.int64).astype(np.uint32).view(np.float32)[0]

    def _float_as_uint(f):
        """The bits of float32 ``f`` as an int in [0, 2**32)."""
        return np.int64(np.array([f], np.float32).view(np.uint32)[0])

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def _int_as_float(i):
        return libdevice.int_as_float(numba.int32(i))

    @cuda.jit(device=True, inline=True)
    def _float_as_uint(f):
        return numba.int64(libdevice.float_as_int(f)) & 0xFFFFFFFF


@cuda.jit(device=True, inline=True)
def bf16_bits_to_f32(h):
    """float32 value of the bfloat16 whose bits are the int16 ``h``."""
    return _int_as_float((numba.int64(h) & 0xFFFF) << 16)


@cuda.jit(device=True, inline=True)
def f32_to_bf16_bits(g):
    """int16 bits of float32 ``g`` rounded to bfloat16 (nearest even, as torch;
    NaN -> the quiet NaN 0x7FC0, overflow -> inf)."""
    v = _float_as_uint(g)
    if g != g:
        h = 0x7FC0
    else:
        h = (v + 0x7FFF + ((v >> 16) & 1)) >> 16
    if h >= 32768:  # as a signed 16-bit value
        h -= 65536
    return numba.int16(h)


def compute_type(storage: str):
    """The numba type of the row passes' arithmetic for a storage kind."""
    return numba.float64 if storage == "float64" else numba.float32


def make_io(storage: str):
    """(load, store) for a storage kind: ``load(element) -> CT`` and
    ``store(value CT) -> element`` (see the module docstring)."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    if storage == "bfloat16":
        return bf16_bits_to_f32, f32_to_bf16_bits
    CT = compute_type(storage)
    ET = types.float16 if storage == "float16" else CT  # the elements' type

    @cuda.jit(device=True, inline=True)
    def load(x):
        return CT(x)

    @cuda.jit(device=True, inline=True)
    def store(g):
        return ET(g)

    return load, store


def kernel_getters(make_row_kernels, make_dp_kernels, constants, durations):
    """``(get_kernels, get_dp_kernels)`` of a kernel family, each building its
    kernels on first use and caching them (one cache per family).

    * ``get_kernels(storage, lattice, row_cfg) -> (row_stats, alpha_beta, weights,
      grad)``: storage "float64", "float32", "float16" or "bfloat16" (the logits;
      bfloat16 arrays handed over as their int16 bits); the lattice's
      ``constants(lattice)`` (a tuple: its symbols and durations) become
      compile-time constants, the blank stays a launch argument; ``row_cfg =
      (team, block, unroll)`` of the row kernels (1 and 4): threads per row (a power
      of two), threads per block (a multiple of team), loads per chunk. The row
      kernels come from ``make_row_kernels(storage, *constants, team, block,
      unroll) -> (row_stats, grad)``;
    * ``get_dp_kernels(lattice) -> (alpha_beta, weights)``: the lattice kernels,
      ``make_dp_kernels(durations(lattice))``: they depend only on the durations
      (numba specialises them on the costs' dtype by itself), so they are compiled
      once per duration set and shared by every storage kind and row layout.
    """
    cache = {}

    def get_dp_kernels(lattice):
        key = ("dp", durations(lattice))
        if key not in cache:
            cache[key] = make_dp_kernels(key[1])
        return cache[key]

    def get_kernels(storage: str, lattice, row_cfg):
        team, block, unroll = (int(x) for x in row_cfg)
        key = (storage, *constants(lattice), team, block, unroll)
        if key not in cache:
            row_stats, grad = make_row_kernels(*key)
            alpha_beta, weights = get_dp_kernels(lattice)
            cache[key] = (row_stats, alpha_beta, weights, grad)
        return cache[key]

    return get_kernels, get_dp_kernels


class RowParts(NamedTuple):
    """What both families' row kernels (1 and 4) are built from, for one storage kind
    and row layout (:func:`row_parts`)."""

    CT: object  # numba type of the row arithmetic
    load: object  # device fn: element -> CT
    store: object  # device fn: CT -> element
    row_lse: object  # :func:`make_row_lse`
    row_start: object  # :func:`make_row_start`
    row_begin: object  # :func:`make_row_begin`
    grad_start: object  # :func:`make_grad_start`
    token_coefs: object  # :func:`make_token_coefs`
    denom_split: object  # :func:`make_denom_split`


def row_parts(storage: str, team: int, block: int, unroll: int) -> RowParts:
    """The device functions of the row kernels for ``storage`` and the row layout
    ``team`` threads per row, ``block`` threads per block, ``unroll`` loads per
    chunk (``team`` a power of two, ``block`` a multiple of it)."""
    if team < 1 or team & (team - 1) or block % team:
        raise ValueError(f"bad row layout team={team} block={block}")
    CT = compute_type(storage)
    load, store = make_io(storage)
    row_start = make_row_start(team, block // team)
    return RowParts(
        CT,
        load,
        store,
        make_row_lse(load, CT, team, unroll, block),
        row_start,
        make_row_begin(row_start, make_lead_loads(load, CT)),
        make_grad_start(row_start, store, CT, team),
        make_token_coefs(CT),
        make_denom_split(CT),
    )


@cuda.jit(device=True, inline=True)
def row_node(row, T, U, act_lens, label_lens):
    """The lattice node of row ``row = (b T + t) U + u`` of a row kernel's (B, T, U)
    grid (row < B T U): ``(b, t, u, U_b, valid)``, U_b = label_lens[b] + 1, valid =
    ``t < act_lens[b] and u < U_b`` (a row of the lattice, not padding)."""
    u = row % U
    bt = row // U
    t = bt % T
    b = bt // T
    Ub = label_lens[b] + 1
    return b, t, u, Ub, (t < act_lens[b]) & (u < Ub)


def make_row_start(team: int, rows_per_block: int):
    """Device function ``row_start(acts, act_lens, label_lens) -> (tid, lane, inside,
    b, t, u, U_b, valid)`` of a row kernel (``team`` threads per row,
    ``rows_per_block`` rows per block): the thread's index in its block and in its
    team, whether its row ``(b T + t) U + u`` lies inside the (B, T, U) grid, and
    (when it does; else zeros, U_b = 1, valid False) the row's node as
    :func:`row_node` gives it."""
    TS = team
    RPB = rows_per_block

    @cuda.jit(device=True, inline=True)
    def row_start(acts, act_lens, label_lens):
        tid = cuda.threadIdx.x
        lane = tid % TS
        T = acts.shape[1]
        U = acts.shape[2]
        row = cuda.blockIdx.x * RPB + tid // TS
        b = 0
        t = 0
        u = 0
        Ub = 1
        valid = False
        inside = row < acts.shape[0] * T * U
        if inside:
            b, t, u, Ub, valid = row_node(row, T, U, act_lens, label_lens)
        return tid, lane, inside, b, t, u, Ub, valid

    return row_start


def make_row_begin(row_start, lead_loads):
    """Device function ``row_begin(acts, labels, act_lens, label_lens, blank) ->
    (tid, lane, b, t, u, U_b, active, lead, x_blank, x_label)`` of a row-stats
    kernel's thread: :func:`make_row_start`'s values (``active``: its row is valid),
    ``lead``: the thread finishes the row (an active row's lane 0), and the logits of
    the row's blank and label that it loads (:func:`make_lead_loads`)."""

    @cuda.jit(device=True, inline=True)
    def row_begin(acts, labels, act_lens, label_lens, blank):
        tid, lane, _, b, t, u, Ub, active = row_start(acts, act_lens, label_lens)
        lead = active and lane == 0
        x_blank, x_label = lead_loads(acts, labels, b, t, u, Ub, blank, lead)
        return tid, lane, b, t, u, Ub, active, lead, x_blank, x_label

    return row_begin


def make_grad_row(load, store, CT, team: int, unroll: int, grad_of):
    """Device function ``grad_row(acts, grads, b, t, u, n, lane, cl, gw, p)`` of a
    gradient kernel: the ``team`` threads of row (b, t, u) write, for k < n,

        grads[b, t, u, k] = store(clip(grad_of(k, x_k, p), -cl, cl) * gw)

    (x_k = load(acts[b, t, u, k]) in CT; no clip when cl <= 0); ``p`` is the tuple
    of the row's constants that the family's ``grad_of(k, x, p) -> CT`` reads. Each
    thread walks chunks of ``unroll`` elements ``k = k0 + j * team``, all the
    chunk's loads issued (unconditionally, clamped index) before any of its stores,
    so that the possible aliasing of ``acts`` and ``grads`` never serialises a load
    behind a store."""
    UN = unroll
    TS = team
    STEP = team * unroll

    @cuda.jit(device=True, inline=True)
    def grad_row(acts, grads, b, t, u, n, lane, cl, gw, p):
        xs = cuda.local.array(UN, CT)
        k0 = lane
        while k0 < n:
            for j in range(UN):  # all the chunk's loads first, unconditional
                xs[j] = load(acts[b, t, u, min(k0 + j * TS, n - 1)])
            for j in range(UN):
                k = k0 + j * TS
                if k < n:
                    g = grad_of(k, xs[j], p)
                    if cl > 0:
                        g = min(max(g, -cl), cl)
                    grads[b, t, u, k] = store(g * gw)
            k0 += STEP

    return grad_row


def make_grad_start(row_start, store, CT, team: int):
    """Device function ``grad_start(acts, act_lens, label_lens, logp, grads, n) ->
    (go, lane, b, t, u, U_b)`` of a gradient kernel (rows of ``n`` logits,
    ``row_start`` of :func:`make_row_start`): ``go`` True for a valid row of an
    utterance with a finite log P; the other rows of the grid get
    ``grads[b, t, u, :n] = 0`` here."""
    TS = team

    @cuda.jit(device=True, inline=True)
    def grad_start(acts, act_lens, label_lens, logp, grads, n):
        _, lane, inside, b, t, u, Ub, valid = row_start(acts, act_lens, label_lens)
        go = False
        if inside:
            if valid and abs(logp[b]) < POS_INF:
                go = True
            else:
                fill_row(grads, b, t, u, n, lane, TS, store(CT(0.0)))
        return go, lane, b, t, u, Ub

    return grad_start


def make_token_coefs(CT):
    """Device function ``token_coefs(wts, labels, b, t, u, Ub, fastemit_lambda) ->
    (gamma0, w_label, c_blank, c_label, lab)`` of a gradient kernel's row: from the
    row's W_blank = wts[b, t, u, 0] and W_label = wts[b, t, u, 1] (float64),
    ``gamma0 = W_blank + W_label`` and W_label (float64), the terms the blank and the
    label take off their gradient, ``W_blank`` and ``(1 + lambda) W_label`` in CT,
    and the label's index y_u (-1 on the last row: no label left)."""

    @cuda.jit(device=True, inline=True)
    def token_coefs(wts, labels, b, t, u, Ub, fastemit_lambda):
        w_blank = wts[b, t, u, 0]
        w_label = wts[b, t, u, 1]
        c_blank = CT(w_blank)
        c_label = CT((1.0 + fastemit_lambda) * w_label)
        lab = labels[b, u] if u < Ub - 1 else -1
        return w_blank + w_label, w_label, c_blank, c_label, lab

    return token_coefs


@cuda.jit(device=True, inline=True)
def lattice_cell(lpw, act_lens, label_lens, logp):
    """The cell of a thread of a weights kernel (one thread per cell (b, t, u) of the
    (B, T, U) grid of ``lpw``): ``(go, b, t, u, T_b, U_b, log P_b)``, ``go`` False
    for a thread past the grid (then the rest is zeros), a cell outside the lattice
    (t >= T_b or u >= U_b) or an utterance whose log P is not finite."""
    cell = cuda.grid(1)
    T = lpw.shape[1]
    U = lpw.shape[2]
    b = 0
    t = 0
    u = 0
    Tb = 0
    Ub = 0
    lp_tot = 0.0
    go = cell < lpw.shape[0] * T * U
    if go:
        u = cell % U
        bt = cell // U
        t = bt % T
        b = bt // T
        Tb = act_lens[b]
        Ub = label_lens[b] + 1
        lp_tot = logp[b]
        go = t < Tb and u < Ub and abs(lp_tot) < POS_INF
    return go, b, t, u, Tb, Ub, lp_tot


@cuda.jit(device=True, inline=True)
def lattice_block(act_lens, label_lens):
    """``(b, which, tid, nthr, T_b, U_b)`` of a thread of an alpha / beta kernel (grid
    (B, 1 + do_beta): block (b, 0) computes alpha, block (b, 1) beta)."""
    b = cuda.blockIdx.x
    return (
        b,
        cuda.blockIdx.y,
        cuda.threadIdx.x,
        cuda.blockDim.x,
        act_lens[b],
        label_lens[b] + 1,
    )


@cuda.jit(device=True, inline=True)
def write_cost(b, lp, fastemit_lambda, logp, costs):
    """``logp[b] = lp`` and ``costs[b] = -(1 + lambda) lp``, +0.0 (not -0.0) when
    log P is 0, as on the CPU."""
    logp[b] = lp
    costs[b] = -(1.0 + fastemit_lambda) * lp + 0.0


def make_alpha_beta(alpha_of, beta_of, log_p_of, num_terms: int):
    """Device function ``alpha_beta(lpw, act_lens, label_lens, fastemit_lambda,
    alphas, betas, logp, costs, flags)``: the body of a family's alpha / beta kernel
    (grid (B, 1 + do_beta), :func:`lattice_block`).

    Block (b, 0) sweeps alpha (:func:`make_diagonal_sweeps`) and its thread 0 writes
    log P and the cost (:func:`write_cost`), block (b, 1) sweeps beta; an utterance
    with no frames has log P 0 without labels and -inf (impossible) with some. The
    family's device functions: ``alpha_of``, ``beta_of`` (as
    :func:`make_diagonal_sweeps` takes them) and ``log_p_of(lpw, alphas, terms, b,
    Tb, Ub, flags) -> log P`` (the end of the alpha sweep; ``flags``: what the
    family's kernel passes, e.g. its bad rows); ``terms``: a local float64 array of
    ``num_terms`` for their log-sum-exps."""
    alpha_sweep, beta_sweep = make_diagonal_sweeps(alpha_of, beta_of)
    NT = num_terms

    @cuda.jit(device=True, inline=True)
    def alpha_beta(
        lpw, act_lens, label_lens, fastemit_lambda, alphas, betas, logp, costs, flags
    ):
        b, which, tid, nthr, Tb, Ub = lattice_block(act_lens, label_lens)
        if Tb == 0:
            if which == 0 and tid == 0:
                lp0 = 0.0 if Ub == 1 else NEG_INF
                write_cost(b, lp0, fastemit_lambda, logp, costs)
            return
        terms = cuda.local.array(NT, numba.float64)
        if which == 0:
            alpha_sweep(lpw, alphas, terms, b, tid, nthr, Tb, Ub)
            if tid == 0:
                lp = log_p_of(lpw, alphas, terms, b, Tb, Ub, flags)
                write_cost(b, lp, fastemit_lambda, logp, costs)
        else:
            beta_sweep(lpw, betas, terms, b, tid, nthr, Tb, Ub)

    return alpha_beta


def make_weights_kernel(cell_weights):
    """A family's weights kernel ``weights(lpw, act_lens, label_lens, alphas, betas,
    logp)``: one thread per cell (b, t, u) of the (B, T, U) grid (ceil(B T U /
    blockDim) blocks); each valid cell of an utterance with a finite log P
    (:func:`lattice_cell`) gets ``cell_weights(lpw, alphas, betas, b, t, u, Tb, Ub,
    log_p)``, which overwrites the cell's own ``lpw`` entries (float64 (B, T, U,
    steps): in, the step log-probs; out, the steps' occupancies) with its steps'
    occupancies (read and written by the cell's thread only, so in place is safe).
    alphas, betas: (B, T, U) float64; logp: (B,) float64."""

    @cuda.jit
    def weights_kernel(lpw, act_lens, label_lens, alphas, betas, logp):
        go, b, t, u, Tb, Ub, lp_tot = lattice_cell(lpw, act_lens, label_lens, logp)
        if go:
            cell_weights(lpw, alphas, betas, b, t, u, Tb, Ub, lp_tot)

    return weights_kernel


def make_grad_kernel(
    parts: RowParts, team: int, unroll: int, num_local: int, row_constants, grad_of
):
    """A family's gradient kernel (kernel 4), one team of threads per row:

        grad_kernel(acts, labels, act_lens, label_lens, blank, V, fastemit_lambda,
                    clamp, factors, denom, wts, logp, grads)

    acts: (B, T, U, V') logits (storage dtype); labels: (B, L) int64; act_lens,
    label_lens: (B,) int64; blank, V: ints (V the token logits of the V' of a row);
    fastemit_lambda, clamp: floats (clamp 0 = off); factors: (B,) float64 (reduction
    weight times the incoming gradient); denom: the rows' log-sum-exps (float64); wts:
    (B, T, U, steps) float64 occupancies from the weights kernel; logp: (B,) float64;
    grads: (B, T, U, V') out (storage dtype), every element written (0 at padding rows
    and for utterances whose log P is not finite). Grid: ceil(B T U / rows per block)
    blocks of ``block`` threads (a pure streaming pass: no shared memory).

    A valid row's elements are ``store(clip(grad_of(k, x_k, p), -clamp, clamp) *
    factors[b])`` (:func:`make_grad_row`) with the row's constants ``p =
    row_constants(wts, denom, b, t, u, V, blank, lab, gamma0, w_label, c_blank,
    c_label, fastemit_lambda, weights)`` (:func:`make_token_coefs` gives gamma0 ...
    lab; ``weights``: a local CT array of ``num_local`` (>= 1) for the family's
    per-step weights)."""
    CT = parts.CT
    grad_start = parts.grad_start
    token_coefs = parts.token_coefs
    grad_row = make_grad_row(parts.load, parts.store, CT, team, unroll, grad_of)
    NL = num_local

    @cuda.jit
    def grad_kernel(
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
        n = acts.shape[3]
        go, lane, b, t, u, Ub = grad_start(acts, act_lens, label_lens, logp, grads, n)
        if not go:
            return
        gamma, w_label, c_blank, c_label, lab = token_coefs(
            wts, labels, b, t, u, Ub, fastemit_lambda
        )
        weights = cuda.local.array(NL, CT)  # registers: indexed by constants
        p = row_constants(
            wts,
            denom,
            b,
            t,
            u,
            V,
            blank,
            lab,
            gamma,
            w_label,
            c_blank,
            c_label,
            fastemit_lambda,
            weights,
        )
        gw = CT(factors[b])
        cl = CT(clamp)
        grad_row(acts, grads, b, t, u, n, lane, cl, gw, p)

    return grad_kernel


def make_diagonal_sweeps(alpha_of, beta_of):
    """Device functions ``(alpha_sweep, beta_sweep)`` of an alpha / beta kernel, both
    ``(lpw, arr, terms, b, tid, nthr, Tb, Ub)``: block (b, 0) fills ``arr = alphas``
    with the first, block (b, 1) ``arr = betas`` with the second, over the valid
    cells (t < T_b, u < U_b; T_b >= 1), one anti-diagonal n = t + u at a time
    (forwards for alpha, backwards for beta), the ``nthr`` threads of the block
    striding over its cells, one ``syncthreads`` per anti-diagonal: every step of
    both lattices moves to a later anti-diagonal, so the cells of one are
    independent.

    alpha(0, 0) = 0; the family's device functions give the other cells:
    ``alpha_of(lpw, alphas, b, t, u, terms)`` and ``beta_of(lpw, betas, b, t, u, Tb,
    Ub, terms)`` (float64; ``terms``, the kernel's local float64 array for their
    log-sum-exp)."""

    @cuda.jit(device=True, inline=True)
    def alpha_sweep(lpw, alphas, terms, b, tid, nthr, Tb, Ub):
        L = Ub - 1
        for n in range(Tb + L):
            t = max(0, n - L) + tid
            t_hi = min(n, Tb - 1)
            while t <= t_hi:
                u = n - t
                if n == 0:
                    a = 0.0
                else:
                    a = alpha_of(lpw, alphas, b, t, u, terms)
                alphas[b, t, u] = a
                t += nthr
            cuda.syncthreads()

    @cuda.jit(device=True, inline=True)
    def beta_sweep(lpw, betas, terms, b, tid, nthr, Tb, Ub):
        L = Ub - 1
        n_diag = Tb + L
        for m in range(n_diag):
            n = n_diag - 1 - m
            t = max(0, n - L) + tid
            t_hi = min(n, Tb - 1)
            while t <= t_hi:
                u = n - t
                betas[b, t, u] = beta_of(lpw, betas, b, t, u, Tb, Ub, terms)
                t += nthr
            cuda.syncthreads()

    return alpha_sweep, beta_sweep


@cuda.jit(device=True, inline=True)
def fill_row(out, b, t, u, n, lane, team, value):
    """``out[b, t, u, :n] = value``, the ``team`` threads of the row striding."""
    k = lane
    while k < n:
        out[b, t, u, k] = value
        k += team


def make_lead_loads(load, CT):
    """Device function ``lead_loads(acts, labels, b, t, u, Ub, blank, lead) ->
    (x_blank, x_label)``: on the thread that finishes a row (``lead``), the logits of
    the blank and of the label y_u of the row (-inf on the last row, u = U_b - 1: no
    label left), in CT; (0, -inf) on the others. Row kernels issue these loads
    before their row loop, so that their latency overlaps it."""

    @cuda.jit(device=True, inline=True)
    def lead_loads(acts, labels, b, t, u, Ub, blank, lead):
        x_blank = CT(0.0)
        x_label = CT(NEG_INF)
        if lead:
            x_blank = load(acts[b, t, u, blank])
            if u < Ub - 1:
                x_label = load(acts[b, t, u, labels[b, u]])
        return x_blank, x_label

    return lead_loads


@cuda.jit(device=True, inline=True)
def store_step_lps(lpw, b, t, u, x_blank, x_label, tok_off, xs, n, off):
    """A row's step log-probs ``lpw[b, t, u, :2 + n]`` (float64) from their logits
    (CT): the blank's and the label's ``x_blank``, ``x_label`` minus ``tok_off`` (the
    row's log-sum-exp plus sigma), then ``xs[:n]`` minus ``off`` (the big blanks'
    with the same offset; the TDT durations' with their own log-sum-exp)."""
    lpw[b, t, u, 0] = numba.float64(x_blank) - tok_off
    lpw[b, t, u, 1] = numba.float64(x_label) - tok_off
    for i in range(n):
        lpw[b, t, u, 2 + i] = numba.float64(xs[i]) - off


@cuda.jit(device=True, inline=True)
def nan_max(a, b):
    """max(a, b) that returns NaN when either is NaN (so a NaN logit can never be
    dropped by a max and is always seen by the NaN checks)."""
    if a != a or a > b:
        return a
    return b


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


def make_row_lse(load, CT, team: int, unroll: int, block: int):
    """Device function ``row_lse(acts, b, t, u, n, lane, active, tid)``.

    The log-sum-exp statistics of ``acts[b, t, u, :n]`` computed by a *team* of
    ``team`` consecutive threads (``lane`` = 0..team-1, ``tid`` the thread's index in
    the block of ``block`` threads, its team's slots ``tid - lane : tid - lane +
    team`` of two shared memory arrays of ``block`` CT that it declares). Returns
    ``(m, s)`` in CT on lane 0 (the row maximum and ``sum_k exp(x_k - m)``), garbage
    on the other lanes.

    Each thread walks chunks of ``unroll`` elements ``k = k0 + j * team``: the chunk's
    loads are issued together (independent, into registers) before any of them is
    used, then one online (running max, rescaled sum) update per chunk: one extra exp
    per chunk, no branch per element. The per-thread pairs are merged by a tree in
    shared memory, one ``syncthreads`` per level. Every thread of the block must call
    it (it synchronises the block); ``active`` False threads contribute nothing.

    NaN anywhere in the row makes ``s`` NaN; a +inf makes ``m`` +inf (``s`` NaN);
    a row of only -inf gives ``m = -inf, s = 0``.
    """
    UN = unroll
    TS = team
    STEP = team * unroll
    NB = block

    @cuda.jit(device=True, inline=True)
    def row_lse(acts, b, t, u, n, lane, active, tid):
        sm_m = cuda.shared.array(NB, CT)
        sm_s = cuda.shared.array(NB, CT)
        m = CT(NEG_INF)
        s = CT(0.0)
        if active:
            xs = cuda.local.array(UN, CT)
            k0 = lane
            while k0 < n:
                for j in range(UN):
                    # clamped index: every load is unconditional (no branch between
                    # the chunk's loads); slots past the row's end become -inf
                    k = k0 + j * TS
                    x = load(acts[b, t, u, min(k, n - 1)])
                    xs[j] = x if k < n else CT(NEG_INF)
                cm = xs[0]
                for j in range(1, UN):
                    cm = nan_max(cm, xs[j])
                nm = nan_max(m, cm)
                if nm != CT(NEG_INF):  # NaN passes: s becomes NaN
                    acc = s * math.exp(m - nm)
                    for j in range(UN):
                        acc += math.exp(xs[j] - nm)
                    s = acc
                    m = nm
                k0 += STEP
        sm_m[tid] = m
        sm_s[tid] = s
        cuda.syncthreads()
        stride = TS // 2
        while stride > 0:
            if lane < stride:
                m1 = sm_m[tid]
                s1 = sm_s[tid]
                m2 = sm_m[tid + stride]
                s2 = sm_s[tid + stride]
                mm = nan_max(m1, m2)
                if mm != CT(NEG_INF):
                    s1 = s1 * math.exp(m1 - mm) + s2 * math.exp(m2 - mm)
                else:
                    s1 = s1 + s2
                sm_m[tid] = mm
                sm_s[tid] = s1
            cuda.syncthreads()
            stride //= 2
        return sm_m[tid], sm_s[tid]

    return row_lse


@cuda.jit(device=True, inline=True)
def row_denominator(m, s):
    """float64 log-sum-exp ``m + log(s)`` of a row from its (max, sum) pair; NaN for a
    row with a NaN or +inf logit or only -inf (a NaN cost for the caller)."""
    if m == POS_INF or not (s > 0.0):
        return math.nan
    return numba.float64(m) + math.log(numba.float64(s))


def make_denom_split(CT):
    """Device function ``denom_split(d) -> (hi, lo)`` in CT of a float64 row
    log-sum-exp ``d``, for ``exp((x - hi) - lo)`` in CT: ``(d, 0)`` for float64 and
    :func:`split_hi_lo` otherwise."""
    if CT is numba.float64:

        @cuda.jit(device=True, inline=True)
        def denom_split(d):
            return CT(d), CT(0.0)

        return denom_split
    return split_hi_lo


@cuda.jit(device=True, inline=True)
def split_hi_lo(d):
    """float32 (hi, lo) with hi + lo ~= the float64 ``d``: ``(x - hi) - lo`` in float32
    loses only the rounding of ``x - hi`` (relative to the result), not that of d."""
    hi = numba.float32(d)
    lo = numba.float32(d - numba.float64(hi))
    return hi, lo
