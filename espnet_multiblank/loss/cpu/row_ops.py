"""Vectorisable per-row primitives of the fused log-softmax (Numba, CPU).

Numba on these machines has no SVML, so ``math.exp`` in a loop is a scalar libm call
(~2.5 ns/element, as slow as a whole ``torch.log_softmax``). :func:`row_exp` instead
evaluates ``exp`` with a Cody-Waite range reduction and a degree-7 polynomial (Cephes'
``expf``), which LLVM vectorises; its relative error is below 3e-7, i.e. float32
rounding. ``2**n`` is built from its IEEE bits in an int32 scratch row (numba cannot
bit-cast scalars), hence the ``ibuf`` argument. float64 rows use ``math.exp`` (exactness
first; the float64 path is for tests and references).

Fastmath flags are chosen per function on purpose:
- ``row_max`` / ``row_sum_fast``: all flags (vectorised reductions; no NaN semantics).
- ``row_sum_checked``: only reassociation, so a NaN or +-inf in the row survives into
  the result; this is how NaN logits are detected without a separate pass over memory.
- ``row_exp``: everything but reassociation, which would merge the two-constant ln 2
  reduction and cost accuracy.
"""

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

_ALL = True
_NO_REASSOC = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
_ONLY_REASSOC = {"reassoc", "contract"}

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_LO = np.float32(-87.0)  # exp(-87) ~ 1.6e-38: smallest normal float32 range


@njit(fastmath=_ALL, cache=True)
def row_max(x):
    """max(x) for a 1-D row (undefined if x holds NaN: check with row_sum_checked)."""
    m = x[0]
    for k in range(1, x.size):
        m = max(m, x[k])
    return m


@njit(fastmath=_ONLY_REASSOC, cache=True)
def row_sum_checked(x):
    """sum(x) that stays non-finite when x holds NaN or +-inf."""
    s = x.dtype.type(0.0)
    for k in range(x.size):
        s += x[k]
    return s


@njit(fastmath=_ALL, cache=True)
def row_sum_fast(x):
    """sum(x), vectorised (x must be finite)."""
    s = x.dtype.type(0.0)
    for k in range(x.size):
        s += x[k]
    return s


@njit(cache=True)
def row_has_nan_or_posinf(x):
    """Exact scalar check, only run on rows whose checked sum is not finite."""
    for k in range(x.size):
        v = x[k]
        if v != v or v == np.inf:
            return True
    return False


def row_exp(x, shift, scale, out, ibuf):  # pragma: no cover - replaced by overload
    """out[k] = scale * exp(x[k] - shift) for a 1-D row; shift >= max(x) expected."""
    raise NotImplementedError


@overload(row_exp, jit_options={"fastmath": _NO_REASSOC})
def _row_exp_overload(x, shift, scale, out, ibuf):
    if x.dtype == types.float32:

        def impl(x, shift, scale, out, ibuf):
            sh = np.float32(shift)
            fbuf = ibuf.view(np.float32)
            n = x.size
            for k in range(n):
                z = x[k] - sh
                z = z if z > _EXP_LO else _EXP_LO
                fi = np.floor(z * _LOG2E + np.float32(0.5))
                r = z - fi * _LN2_HI - fi * _LN2_LO
                p = np.float32(1.9875691500e-4)
                p = p * r + np.float32(1.3981999507e-3)
                p = p * r + np.float32(8.3334519073e-3)
                p = p * r + np.float32(4.1665795894e-2)
                p = p * r + np.float32(1.6666665459e-1)
                p = p * r + np.float32(5.0000001201e-1)
                p = p * r * r + r + np.float32(1.0)
                ibuf[k] = (np.int32(fi) + np.int32(127)) << np.int32(23)
                out[k] = p
            sc = np.float32(scale)
            for k in range(n):
                out[k] = out[k] * fbuf[k] * sc

        return impl

    def impl64(x, shift, scale, out, ibuf):
        for k in range(x.size):
            out[k] = scale * math.exp(x[k] - shift)

    return impl64


@njit(fastmath=_ALL, cache=True)
def row_clamp(g, c):
    """g <- clip(g, -c, c) in place."""
    for k in range(g.size):
        v = g[k]
        v = v if v < c else c
        g[k] = v if v > -c else -c
