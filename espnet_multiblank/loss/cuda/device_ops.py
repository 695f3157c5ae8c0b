"""What the multi-blank and the TDT CUDA kernels share: element I/O, the row kernels'
start and gradient loop, row reductions, the lattice kernels' cells and their
anti-diagonal sweep, LSE, and the caches of compiled kernels.

The shared pieces are device functions (``inline=True``: inlined into each kernel by
Numba, so the kernels compile as if they were written out in them) and factories of
device functions for what depends on compile-time constants (storage, row layout)
or on a family's own device functions (``make_grad_row``'s ``grad_of``,
``make_diagonal_sweeps``' ``alpha_of`` / ``beta_of``).

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


def family_kernels(cache, key, make_row_kernels, get_dp_kernels, lattice):
    """The four kernels of a family, built on first use and cached in ``cache``.

    Args:
        key: ``(storage, *lattice constants, team, block, unroll)``, the arguments
            of ``make_row_kernels(*key) -> (row_stats, grad)``.
        get_dp_kernels: ``get_dp_kernels(lattice) -> (alpha_beta, weights)``.

    Returns:
        (row_stats, alpha_beta, weights, grad).
    """
    if key not in cache:
        row_stats, grad = make_row_kernels(*key)
        alpha_beta, weights = get_dp_kernels(lattice)
        cache[key] = (row_stats, alpha_beta, weights, grad)
    return cache[key]


def dp_kernels(cache, durations, make_dp_kernels):
    """``make_dp_kernels(durations) -> (alpha_beta, weights)``, cached in ``cache``:
    the lattice kernels depend only on the durations (numba specialises them on the
    costs' dtype by itself), so they are compiled once and shared by every storage
    kind and row layout."""
    key = ("dp", durations)
    if key not in cache:
        cache[key] = make_dp_kernels(durations)
    return cache[key]


class RowParts(NamedTuple):
    """What both families' row kernels (1 and 4) are built from, for one storage kind
    and row layout (:func:`row_parts`)."""

    CT: object  # numba type of the row arithmetic
    load: object  # device fn: element -> CT
    store: object  # device fn: CT -> element
    row_lse: object  # :func:`make_row_lse`
    step_loads: object  # :func:`make_step_loads`
    row_start: object  # :func:`make_row_start`
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
        make_row_lse(load, CT, team, unroll),
        make_step_loads(load, CT),
        row_start,
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


def make_step_loads(load, CT):
    """Device function ``step_loads(acts, labels, b, t, u, Ub, blank) -> (x_blank,
    x_label)``: the logits of the blank and of the label y_u of a row (-inf on the
    last row, u = U_b - 1: no label left), in CT. Row kernels issue these loads
    before their row loop, so that their latency overlaps it."""

    @cuda.jit(device=True, inline=True)
    def step_loads(acts, labels, b, t, u, Ub, blank):
        x_blank = load(acts[b, t, u, blank])
        x_label = CT(NEG_INF)
        if u < Ub - 1:
            x_label = load(acts[b, t, u, labels[b, u]])
        return x_blank, x_label

    return step_loads


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


def make_row_lse(load, CT, team: int, unroll: int):
    """Device function ``row_lse(acts, b, t, u, n, lane, active, sm_m, sm_s, tid)``.

    The log-sum-exp statistics of ``acts[b, t, u, :n]`` computed by a *team* of
    ``team`` consecutive threads (``lane`` = 0..team-1, ``tid`` the thread's index in
    the block, its team's slots ``sm_m[tid - lane : tid - lane + team]`` in shared
    memory). Returns ``(m, s)`` in CT on lane 0 (the row maximum and
    ``sum_k exp(x_k - m)``), garbage on the other lanes.

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

    @cuda.jit(device=True, inline=True)
    def row_lse(acts, b, t, u, n, lane, active, sm_m, sm_s, tid):
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
