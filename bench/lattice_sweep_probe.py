"""Probe: cost per node of the lattice's forward (alpha) sweep, three ways.

A design probe for the small-shape CPU speed goal (bench/RESULTS.md, "Budget left by
the 1.2x goal"), not a contender of ``loss_cpu.py``. Standard RNN-T alpha over random
transition probabilities at (B, T, U) = (16, 100, 20) by default, float64, 1 thread:

* ``log, per utterance``: the kernels' layout and loop (one anti-diagonal of one
  utterance per vector loop; ``exp64`` + ``log64`` per node, as ``cpu/kernels.py``);
* ``log, batch-wide``: one vector loop over the anti-diagonal n of every utterance at
  once (B * C lanes): is the per-diagonal loop overhead what costs at small U?
* ``probability, per utterance``: alpha as probabilities, each anti-diagonal rescaled
  by its maximum (the log of the scales summed): multiply-adds and no exp/log per node.

All three print log P (they must agree) and the minimum time of ``--runs`` calls.

Usage::

    python bench/lattice_sweep_probe.py [--shape 16,100,20] [--runs 300]
"""

import argparse
import time

import numpy as np
from numba import njit

from espnet_multiblank.loss.cpu.row_ops import exp64, log64

NEG_INF = -np.inf
U1 = np.uint64(1)
U2 = np.uint64(2)
U8 = np.uint64(8)
OPTS = dict(error_model="numpy", fastmath={"nsz", "contract"})


@njit(**OPTS)
def _diagonal(n, T, U, base, C):
    """Anti-diagonal n of an utterance whose (T + U - 1, C) plane starts at ``base``:
    (first column j = u + 1, end column rounded up to 8 lanes (the arrays have spare
    columns for it), offset of anti-diagonal n - 1, offset of anti-diagonal n), all
    np.uint64."""
    jlo = np.uint64(max(0, n - T + 1) + 1)
    jhi = np.uint64(min(n, U - 1) + 1)
    un = np.uint64(n)
    uC = np.uint64(C)
    return (
        jlo,
        jlo + ((jhi - jlo + U8) // U8) * U8,
        base + (un - U1) * uC,
        base + un * uC,
    )


@njit(**OPTS)
def log_per_utterance(Lb, Ll, B, T, U, C, A):
    """Lb, Ll, A: flat (B, T + U - 1, C) log-probs of the blank / label leaving node
    (n, j) and alpha. Returns the sum over b of log P."""
    nd = T + U - 1
    total = 0.0
    for b in range(B):
        base = np.uint64(b * nd * C)
        A[base + U1] = 0.0
        for n in range(1, nd):
            jlo, jend, rp, rq = _diagonal(n, T, U, base, C)
            for j in range(jlo, jend):
                v0 = A[rp + j] + Lb[rp + j]
                v0 = v0 if j <= np.uint64(n) else NEG_INF
                v1 = A[rp + j - U1] + Ll[rp + j - U1]
                v1 = v1 if j >= U2 else NEG_INF
                hi = v0 if v0 > v1 else v1
                lo = v1 if v0 > v1 else v0
                e = exp64(lo - hi if hi > NEG_INF else NEG_INF)
                A[rq + j] = hi + log64(1.0 + e)
        total += A[base + np.uint64((nd - 1) * C + U)]
    return total


@njit(**OPTS)
def log_batch_wide(Lb, Ll, B, T, U, C, A, column):
    """Lb, Ll, A: flat (T + U - 1, B * C); column: (B * C,) float64 j of each lane
    (lanes outside an utterance's nodes carry -inf log-probs)."""
    nd = T + U - 1
    W = np.uint64(B * C)
    for b in range(B):
        A[b * C + 1] = 0.0
    for n in range(1, nd):
        fn = float(n)
        un = np.uint64(n)
        rp = (un - U1) * W
        rq = un * W
        for lane in range(U1, W):
            j = column[lane]
            v0 = A[rp + lane] + Lb[rp + lane]
            v0 = v0 if j <= fn else NEG_INF
            v1 = A[rp + lane - U1] + Ll[rp + lane - U1]
            v1 = v1 if j >= 2.0 else NEG_INF
            hi = v0 if v0 > v1 else v1
            lo = v1 if v0 > v1 else v0
            e = exp64(lo - hi if hi > NEG_INF else NEG_INF)
            A[rq + lane] = hi + log64(1.0 + e)
    total = 0.0
    for b in range(B):
        total += A[(nd - 1) * B * C + b * C + U]
    return total


@njit(**OPTS)
def probability_per_utterance(Pb, Pl, B, T, U, C, A):
    """As :func:`log_per_utterance` with probabilities; each anti-diagonal of alpha is
    divided by its maximum and the logs of the maxima are summed."""
    nd = T + U - 1
    total = 0.0
    for b in range(B):
        base = np.uint64(b * nd * C)
        A[base + U1] = 1.0
        log_scale = 0.0
        for n in range(1, nd):
            jlo, jend, rp, rq = _diagonal(n, T, U, base, C)
            top = 0.0
            for j in range(jlo, jend):
                v0 = A[rp + j] * Pb[rp + j]
                v0 = v0 if j <= np.uint64(n) else 0.0
                v1 = A[rp + j - U1] * Pl[rp + j - U1]
                v1 = v1 if j >= U2 else 0.0
                s = v0 + v1
                A[rq + j] = s
                top = max(top, s)
            inv = 1.0 / top
            for j in range(jlo, jend):
                A[rq + j] *= inv
            log_scale += np.log(top)
        total += np.log(A[base + np.uint64((nd - 1) * C + U)]) + log_scale
    return total


def _best_of(fn, args, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        value = fn(*args)
        times.append(time.perf_counter() - t0)
    return value, min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="16,100,20", help="B,T,U")
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args(argv)
    B, T, U = (int(x) for x in args.shape.split(","))
    nd = T + U - 1
    C = U + 12  # spare columns: column 0 and the rounding to 8 lanes
    rng = np.random.default_rng(0)
    log_blank = np.log(rng.uniform(0.05, 0.9, (B, nd, C)))
    log_label = np.log(rng.uniform(0.01, 0.3, (B, nd, C)))
    # batch-wide layout: C_b columns per utterance, -inf outside its nodes
    Cb = -(-(U + 1) // 8) * 8
    wide_blank = np.ascontiguousarray(
        log_blank[:, :, :Cb].transpose(1, 0, 2).reshape(nd, B * Cb)
    )
    wide_label = np.ascontiguousarray(
        log_label[:, :, :Cb].transpose(1, 0, 2).reshape(nd, B * Cb)
    )
    for b in range(B):
        wide_blank[:, b * Cb] = NEG_INF
        wide_label[:, b * Cb + U : (b + 1) * Cb] = NEG_INF
    column = np.tile(np.arange(Cb, dtype=np.float64), B)
    cases = [
        (
            "log, per utterance",
            log_per_utterance,
            (log_blank.ravel(), log_label.ravel(), B, T, U, C, np.zeros(B * nd * C)),
        ),
        (
            "log, batch-wide",
            log_batch_wide,
            (
                wide_blank.ravel(),
                wide_label.ravel(),
                B,
                T,
                U,
                Cb,
                np.zeros(nd * B * Cb),
                column,
            ),
        ),
        (
            "probability, per utterance",
            probability_per_utterance,
            (
                np.exp(log_blank).ravel(),
                np.exp(log_label).ravel(),
                B,
                T,
                U,
                C,
                np.zeros(B * nd * C),
            ),
        ),
    ]
    nodes = B * T * U
    for name, fn, fn_args in cases:
        fn(*fn_args)  # compile
        value, best = _best_of(fn, fn_args, args.runs)
        print(
            f"{name:28s} sum log P {value:.10f}  {best * 1e6:8.1f} us  "
            f"{best / nodes * 1e9:5.2f} ns/node"
        )


if __name__ == "__main__":
    main()
