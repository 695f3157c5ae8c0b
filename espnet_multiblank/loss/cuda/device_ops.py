"""Device functions shared by the CUDA kernels: element I/O, row reductions, LSE.

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
    if storage == "float16":
        F16 = types.float16

        @cuda.jit(device=True, inline=True)
        def load_h(x):
            return CT(x)

        @cuda.jit(device=True, inline=True)
        def store_h(g):
            return F16(g)

        return load_h, store_h

    @cuda.jit(device=True, inline=True)
    def load(x):
        return CT(x)

    @cuda.jit(device=True, inline=True)
    def store(g):
        return CT(g)

    return load, store


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


@cuda.jit(device=True, inline=True)
def split_hi_lo(d):
    """float32 (hi, lo) with hi + lo ~= the float64 ``d``: ``(x - hi) - lo`` in float32
    loses only the rounding of ``x - hi`` (relative to the result), not that of d."""
    hi = numba.float32(d)
    lo = numba.float32(d - numba.float64(hi))
    return hi, lo
