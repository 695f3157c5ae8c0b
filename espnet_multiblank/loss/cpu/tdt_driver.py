"""Host-side driver of the CPU TDT kernels (workspaces, threads, the kernel contract).

The TDT kernel family behind :class:`espnet_multiblank.loss.cpu.driver.KernelDriver`,
the same contract as the multi-blank kernels: ``tdt_compute`` (costs and gradients),
``tdt_begin`` (passes 1 and 2) and ``tdt_finish`` (pass 3 in place, in backward).
Logits are (B, T, U, V + D): V token logits, then D duration logits.
"""

import functools

import numba
import numpy as np

from espnet_multiblank.loss.cpu import driver, tdt_kernels
from espnet_multiblank.loss.tdt_options import TDTOptions


@functools.lru_cache(maxsize=256)
def _durations(opts: TDTOptions) -> np.ndarray:
    d = np.asarray(opts.durations, dtype=np.int64)
    d.setflags(write=False)
    return d


# pass 2 sweeps the anti-diagonals of several utterances in one vector loop: about
# this many columns (nodes of an anti-diagonal) per group of utterances
GROUP_COLUMNS = 512


def _groups(B: int, U: int, parallel: bool) -> int:
    """Number of groups of utterances of pass 2 (at least one per thread)."""
    groups = -(-B * (U + 1) // GROUP_COLUMNS)
    if parallel:
        groups = max(groups, numba.get_num_threads())
    return max(1, min(B, groups))


# rows per node: W_blank, W_label, W_dur(0..D-1) and the two softmax coefficients;
# the kernels take the number V of token logits (the D duration logits follow them)
tdt_compute = driver.KernelDriver(
    (
        tdt_kernels.tdt_rows_forward,
        tdt_kernels.tdt_lattice,
        tdt_kernels.tdt_rows_backward,
    ),
    width=lambda opts: opts.num_durations + 4,
    symbols=lambda opts, shape: shape[3] - opts.num_durations,
    durations=_durations,
    lattice_extra=lambda opts, B, U, parallel: (_groups(B, U, parallel),),
)
tdt_begin = tdt_compute.begin
tdt_finish = tdt_compute.finish
