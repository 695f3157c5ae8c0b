"""Vectorisable primitives of the fused log-softmax kernels (Numba, CPU).

Numba has no SVML here, so ``math.exp`` / ``math.log`` in a loop are scalar libm calls
that stop vectorisation. The functions below evaluate them with polynomials that LLVM
vectorises (AVX-512: 16 float32 or 8 float64 lanes), and do the bit manipulations with
scalar bit casts (``f32_bits`` & co., LLVM ``bitcast`` instructions: Numba has none):

* :func:`exp32` (float32, 8e-8 relative), :func:`exp64` and :func:`log64` (float64,
  about 1 ulp); each compiled with its own fast-math flags (no "reassoc": the
  rounding tricks and the Cody-Waite reductions rely on evaluation order), which LLVM
  keeps when it inlines them into a caller compiled with other flags;
* range primitives over a flat array and a ``[lo, hi)`` range of np.uint64 indices,
  used by ``kernels.py`` and ``tdt_kernels.py``: :func:`max_and_check` (max and
  NaN/+inf detection with integer operations: LLVM vectorises integer max reductions
  but not float ones), :func:`exp_sum`, :func:`exp_range`, :func:`sum_range`,
  :func:`scale_flush_range`, :func:`zero_range`, :func:`clamp_range`; and
  :func:`flush_limit`, :func:`flushed` (the gradient's tiny values set to 0).
  Unsigned indices need no negative-index wraparound (which stops vectorisation), and
  ranges of one flat array create no array views (each view costs two atomic
  reference-count updates).
"""

import math

import numpy as np
from llvmlite import ir as _ir
from numba import njit, types
from numba.extending import intrinsic, overload

from espnet_multiblank.loss.flush import GRADIENT_FLUSH_BELOW

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_LO = np.float32(-87.0)  # exp(-87) ~ 1.6e-38: smallest normal float32 range


# --------------------------------------------------------------------------------------
# Scalar exp / log that LLVM vectorises (inlined into the callers' loops).
#
# Bit casts between floats and integers are LLVM ``bitcast`` instructions (Numba has no
# scalar bit cast), so ``2**n`` and the exponent of a float cost one integer operation
# and the loops around these functions vectorise. The round-to-integer steps use the
# "add 1.5 * 2**mantissa_bits" trick, which needs the default rounding mode and no
# fastmath "reassoc" on these functions (it would fold ``(a + S) - S`` into ``a``); the
# callers' flags do not matter: LLVM keeps each inlined instruction's own flags.
# --------------------------------------------------------------------------------------


def _bitcast(name, src, dst, dst_ir):
    def typer(typingctx, x):
        if x != src:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], dst_ir)

        return dst(src), codegen

    typer.__name__ = name
    return intrinsic(typer)


f32_bits = _bitcast("f32_bits", types.float32, types.int32, _ir.IntType(32))
bits_f32 = _bitcast("bits_f32", types.int32, types.float32, _ir.FloatType())
f64_bits = _bitcast("f64_bits", types.float64, types.int64, _ir.IntType(64))
bits_f64 = _bitcast("bits_f64", types.int64, types.float64, _ir.DoubleType())

_F32_SHIFT = np.float32(12582912.0)  # 1.5 * 2**23
_F64_SHIFT = 6755399441055744.0  # 1.5 * 2**52
_LOG2E64 = 1.4426950408889634
_LN2_HI64 = 6.93147180369123816490e-01  # 21 trailing zero bits: n * hi is exact
_LN2_LO64 = 1.90821492927058770002e-10
_EXP64_LO = -708.3964185322641  # exp(_EXP64_LO) = smallest normal float64
_DBL_MIN = 2.2250738585072014e-308


# e**r on |r| <= ln(2)/2: 1 + r (E1 + r (E2 + ...)), a degree-6 least-squares fit of
# the relative error on Chebyshev nodes (2e-9; float32 evaluation: 8e-8 measured)
_E1 = np.float32(1.0000000360921264)
_E2 = np.float32(0.4999999535099424)
_E3 = np.float32(0.16666420945132104)
_E4 = np.float32(0.04166772432091987)
_E5 = np.float32(0.008374763974941298)
_E6 = np.float32(0.0013859291077473954)


@njit(fastmath={"nsz", "contract"}, error_model="numpy", cache=True)
def exp32(z):
    """exp(z) for float32 ``z <= 88`` (Cody-Waite reduction, degree-6 polynomial, 2**n
    added to the result's exponent bits: < 1e-7 relative); exactly 0 for
    ``z < -87`` (-inf included)."""
    kd = z * _LOG2E + _F32_SHIFT
    fn = kd - _F32_SHIFT
    r = z - fn * _LN2_HI
    r = r - fn * _LN2_LO
    p = _E6
    p = p * r + _E5
    p = p * r + _E4
    p = p * r + _E3
    p = p * r + _E2
    p = p * r + _E1
    p = p * r + np.float32(1.0)
    # the low bits of kd hold n = round(z / ln 2): add n to the exponent of p
    e = bits_f32(np.int32(f32_bits(p) + (f32_bits(kd) << np.int32(23))))
    return e if z > _EXP_LO else np.float32(0.0)


@njit(fastmath={"nsz", "contract"}, error_model="numpy", cache=True)
def exp64(z):
    """exp(z) for float64 ``z <= 709`` (degree-13 Taylor polynomial after a Cody-Waite
    reduction to |r| <= ln(2)/2: about 1 ulp); exactly 0 for ``z < -708.39`` (-inf
    included), i.e. results below the smallest normal float64 are flushed."""
    zc = z if z > _EXP64_LO else _EXP64_LO
    kd = zc * _LOG2E64 + _F64_SHIFT
    fn = kd - _F64_SHIFT
    r = zc - fn * _LN2_HI64 - fn * _LN2_LO64
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    two_n = bits_f64((f64_bits(kd) + np.int64(1023)) << np.int64(52))
    return p * two_n if z > _EXP64_LO else 0.0


_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_EXP_BIAS = 4503599627371519.0  # 2**52 + 1023


@njit(fastmath={"nsz", "contract"}, error_model="numpy", cache=True)
def log64(x):
    """log(x) for float64 ``x >= 0`` (fdlibm's ``log`` without its special cases: below
    1 ulp); -inf for ``x`` below the smallest normal float64 (0 and subnormals)."""
    # move the mantissa into [sqrt(2)/2, sqrt(2)) and the exponent into k
    hx = f64_bits(x) + np.int64(0x0009_5F62_0000_0000)  # 0x3ff00000 - 0x3fe6a09e
    kd = bits_f64((hx >> np.int64(52)) | np.int64(0x4330_0000_0000_0000)) - _EXP_BIAS
    m = bits_f64(
        (hx & np.int64(0x000F_FFFF_FFFF_FFFF)) + np.int64(0x3FE6_A09E_0000_0000)
    )
    f = m - 1.0
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = s * (hfsq + t2 + t1) + kd * _LN2_LO64 - hfsq + f + kd * _LN2_HI64
    return r if x >= _DBL_MIN else -np.inf


# --------------------------------------------------------------------------------------
# Range primitives of the fused kernels. They take a flat (1-D) array and an index range
# [lo, hi) as np.uint64: unsigned indices need no negative-index wraparound (which
# stops LLVM's vectoriser), and working on ranges of one flat array creates no array
# views (each view is an atomic reference-count increment and decrement: a large cost
# per row, and contended between threads).
# --------------------------------------------------------------------------------------
_EXP_FLAGS = {"nsz", "contract"}  # no "reassoc" (rounding trick), no "ninf"
_U0 = np.uint64(0)
_U1 = np.uint64(1)


def max_and_check(x, lo, hi):  # pragma: no cover - replaced by overload
    """(max(x[lo:hi]), bad): ``bad`` is True when the range holds NaN or +inf (then the
    max is meaningless); -inf entries are legal. Integer operations on the IEEE bits
    only: LLVM vectorises integer max reductions, but no float ones without
    function-level fast-math attributes."""
    raise NotImplementedError


# per element width: (integer type, float -> bits, bits -> float, sign-bit shift,
# bits of +inf)
_INT_VIEWS = {
    32: (np.int32, f32_bits, bits_f32, 31, 0x7F80_0000),
    64: (np.int64, f64_bits, bits_f64, 63, 0x7FF0_0000_0000_0000),
}


@overload(max_and_check, jit_options={"error_model": "numpy"})
def _max_and_check_overload(x, lo, hi):
    I, bits, value, top, inf_bits = _INT_VIEWS[x.dtype.bitwidth]
    shift = I(top)
    sign_off = I(np.iinfo(I).max)  # all bits but the sign
    pinf = I(inf_bits)
    lowest = I(np.iinfo(I).min)

    def impl(x, lo, hi):
        # key(b) orders like the float b; every op cast back to I (Numba widens int32
        # arithmetic to int64, which halves the lanes; a no-op for int64)
        mkey = lowest
        amax = I(0)
        for k in range(lo, hi):
            b = bits(x[k])
            key = I(b ^ I(I(b >> shift) & sign_off))
            mkey = key if key > mkey else mkey
            a = I(b & sign_off)
            amax = a if a > amax else amax
        bad = amax > pinf or mkey == pinf  # NaN of either sign, or +inf
        mb = I(mkey ^ I(I(mkey >> shift) & sign_off))
        return value(mb), bad

    return impl


def _exp_of(dtype):
    """(cast of the shift, exp, zero) of the exp loops for arrays of ``dtype``: the
    vectorised :func:`exp32` for float32, the exact ``math.exp`` for float64."""
    if dtype == types.float32:
        return np.float32, exp32, np.float32(0.0)
    return np.float64, _exp_exact, 0.0


def exp_sum(x, lo, hi, shift, out, olo):  # pragma: no cover - replaced by overload
    """out[olo + k] = exp(x[lo + k] - shift) for k < hi - lo (1-D arrays, uint64
    indices), and the sum of these exps (in x's dtype). 0 where x - shift < -87
    (float32: :func:`exp32`) or is -inf (float64: ``math.exp``, exact)."""
    raise NotImplementedError


# fastmath=True for the sum (reassociation lets it vectorise); exp32 is compiled on its
# own with its own flags, which LLVM keeps when it inlines it
@overload(exp_sum, jit_options={"fastmath": True, "error_model": "numpy"})
def _exp_sum_overload(x, lo, hi, shift, out, olo):
    cast, exp, zero = _exp_of(x.dtype)

    def impl(x, lo, hi, shift, out, olo):
        sh = cast(shift)
        s = zero
        for k in range(hi - lo):
            e = exp(x[lo + k] - sh)
            out[olo + k] = e
            s += e
        return s

    return impl


def exp_range(x, lo, hi, shift, out, olo):  # pragma: no cover - replaced by overload
    """out[olo + k] = exp(x[lo + k] - shift) for k < hi - lo, as :func:`exp_sum`
    without the sum (one long loop over several rows: no per-row loop overhead)."""
    raise NotImplementedError


@overload(exp_range, jit_options={"fastmath": True, "error_model": "numpy"})
def _exp_range_overload(x, lo, hi, shift, out, olo):
    cast, exp, _ = _exp_of(x.dtype)

    def impl(x, lo, hi, shift, out, olo):
        sh = cast(shift)
        for k in range(hi - lo):
            out[olo + k] = exp(x[lo + k] - sh)

    return impl


@njit(fastmath=True, error_model="numpy", cache=True)
def sum_range(x, lo, hi):
    """sum(x[lo:hi]) in x's dtype, vectorised (x finite or +-0 / exps)."""
    s = x.dtype.type(0.0)
    for k in range(lo, hi):
        s += x[k]
    return s


@njit(error_model="numpy", cache=True)
def _exp_exact(z):
    """math.exp, compiled apart so that the caller's fast-math flags do not reach it."""
    return math.exp(z)


@njit(fastmath=True, error_model="numpy", cache=True)
def flush_limit(f, like):
    """The magnitude below which a gradient value of an utterance with factor ``f``
    is set to 0: ``|f| * GRADIENT_FLUSH_BELOW`` (2**-80), at least the smallest normal
    number of the dtype of array ``like`` (why: :mod:`espnet_multiblank.loss.flush`)."""
    return max(abs(f) * GRADIENT_FLUSH_BELOW, np.finfo(like.dtype).tiny)


@njit(fastmath=True, error_model="numpy", cache=True)
def scale_flush_range(g, lo, hi, c, limit):
    """g[lo:hi] *= c, then values with |g| < limit set to 0 (c and limit rounded to
    g's dtype first; a NaN stays NaN)."""
    s = g.dtype.type(c)
    lim = g.dtype.type(limit)
    zero = g.dtype.type(0.0)
    for k in range(lo, hi):
        v = g[k] * s
        g[k] = zero if abs(v) < lim else v


@njit(fastmath=True, error_model="numpy", cache=True)
def flushed(v, like, limit):
    """``v`` (float64) rounded to the dtype of array ``like``, 0 below ``limit``."""
    x = like.dtype.type(v)
    return like.dtype.type(0.0) if abs(x) < limit else x


@njit(fastmath=True, error_model="numpy", cache=True)
def zero_range(g, lo, hi):
    """g[lo:hi] = 0."""
    z = g.dtype.type(0.0)
    for k in range(lo, hi):
        g[k] = z


@njit(fastmath=True, error_model="numpy", cache=True)
def clamp_range(g, lo, hi, c):
    """g[lo:hi] = clip(g[lo:hi], -c, c) (c rounded to g's dtype first)."""
    cc = g.dtype.type(c)
    for k in range(lo, hi):
        v = g[k]
        v = v if v < cc else cc
        g[k] = v if v > -cc else -cc
