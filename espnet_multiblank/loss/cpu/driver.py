"""Host-side driver of the CPU kernels: workspaces, threads, the kernel contract.

One :class:`KernelDriver` per lattice family: ``compute`` (multi-blank / standard
RNN-T, ``kernels.py``) and ``tdt_compute`` (TDT, ``tdt_kernels.py``); logits are
(B, T, U, V) and (B, T, U, V + D).

Two entry points (see ``espnet_multiblank.loss.function`` for how autograd uses them):

* ``begin`` runs passes 1 and 2 (costs; the gradient buffer holds the exps) and
  returns the tensors pass 3 needs; ``finish`` runs pass 3 on them in place with
  the per-utterance factors known only in backward (reduction weight times incoming
  gradient), so any incoming gradient costs no second logits-sized buffer;
* ``compute`` = ``begin`` + ``finish(grad_weights)``: the plain contract
  ``(costs, grads)`` shared with the CUDA backend.

and the lattice stage alone on rows a caller extracted itself (``lattice``, which
``espnet_multiblank.loss.stages.run_lattice`` calls for rows on the CPU).
:class:`KernelDriver` implements them once; the three stages it runs are those of
``espnet_multiblank.loss.stages``, on the rows of ``espnet_multiblank.loss.rows``.
"""

import functools
import os
import types
from typing import Optional, Tuple

import numba
import numpy as np
import torch

from espnet_multiblank.loss.batch import LossBatch
from espnet_multiblank.loss.cpu import kernels, tdt_kernels
from espnet_multiblank.loss.options import LossOptions, TDTOptions
from espnet_multiblank.loss.rows import check_rows, multiblank_rows, tdt_rows


def serial_twin(dispatcher):
    """A single-threaded copy of a ``parallel=True`` kernel (prange runs as range);
    the fused joint + loss's CPU tile kernels use it too.

    It gets its own qualified name so that Numba's on-disk cache keeps both versions.
    """
    f = dispatcher.py_func
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial")
    g.__qualname__ = f.__qualname__ + "_serial"
    opts = {
        k: v
        for k, v in dispatcher.targetoptions.items()
        if k not in ("parallel", "nopython")
    }
    opts.setdefault("cache", True)
    return numba.njit(**opts)(g)


# GNU OpenMP (Numba's default "omp" threading layer here) aborts a forked child that
# starts a parallel region once the parent has used one ("Terminating: fork() called
# from a process already using GNU OpenMP"). Forked children (DataLoader workers,
# multiprocessing pools) therefore run the serial kernels.
_state = {"parallel_used": False, "forked": False}


def _after_fork_in_child():
    _state["forked"] = _state["parallel_used"]


os.register_at_fork(after_in_child=_after_fork_in_child)


# Below this many logits a parallel launch costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 18
# the lattice stage alone (rows extracted by a caller) picks serial or parallel
# kernels as for this many logits per node: about a node's share of the work
LOGITS_PER_NODE = 64


def pick_parallel(num_elements: int):
    """(parallel, previous Numba thread count or None): the serial kernels for one
    torch thread, small problems and forked children; otherwise the parallel ones
    with as many Numba threads as torch may use (restore the returned count
    afterwards). The thread rule of every CPU kernel of the package (the fused
    joint + loss's tile kernels too)."""
    n = min(torch.get_num_threads(), _MAX_THREADS)
    if n <= 1 or _state["forked"] or num_elements < PARALLEL_MIN_ELEMENTS:
        return False, None
    _state["parallel_used"] = True
    prev = numba.get_num_threads()
    if n == prev:
        return True, None
    numba.set_num_threads(n)
    return True, prev


_MAX_THREADS = numba.config.NUMBA_NUM_THREADS

# Gradient buffers come from numpy at every size. (Buffers above 32 MB from
# torch.empty, tried for the page-reporting cost of freed huge pages after idle gaps
# on one virtual machine, made back-to-back dense losses 2x slower on another:
# bench/RESULTS.md, issue 26.)


class KernelDriver:
    """One loss's CPU kernels behind the kernel contract; calling it is ``compute``.

    A kernel family is three ``parallel=True`` Numba kernels with the same calling
    convention (the multi-blank and the TDT family share it):

    * ``rows_forward(acts, labels, act_lens, label_lens, blank, symbols, sigma,
      need_grad, buffer, rows, bad)``: pass 1, one read of the logits, per-node
      values into ``rows`` (B, T, U, width) float64 and the exps into ``buffer``;
    * ``lattice(rows, act_lens, label_lens, durations, fastemit_lambda, need_grad,
      *extra, log_p)``: pass 2, the anti-diagonal sweeps;
    * ``rows_backward(labels, act_lens, label_lens, blank, symbols, rows, log_p,
      fastemit_lambda, clamp, factors, buffer)``: pass 3, the gradient in place.

    ``symbols`` tells the kernels which logits are what (the big blank ids; the
    number of token logits for TDT). The family-specific parts come in as functions
    of the options: ``layout(opts)`` (the rows, ``espnet_multiblank.loss.rows``),
    ``symbols(opts, acts_shape)``, ``durations(opts)`` (an int64 array) and
    ``lattice_extra(opts, B, U, parallel)``.
    """

    #: the kernels run on the host: numpy arrays (or CPU tensors viewed as them)
    device_type = "cpu"

    def __init__(self, parallel, layout, symbols, durations, lattice_extra=None):
        self.parallel = tuple(parallel)
        self.serial = tuple(serial_twin(k) for k in self.parallel)
        self.layout = layout
        self.symbols = symbols
        self.durations = durations
        self.lattice_extra = lattice_extra or (lambda opts, B, U, parallel: ())

    def width(self, opts) -> int:
        """The width of the rows of ``opts``' lattice."""
        return self.layout(opts).width

    def pick(self, num_elements: int):
        """(kernels, Numba thread count to restore or None), by
        :func:`pick_parallel`."""
        parallel, prev = pick_parallel(num_elements)
        return (self.parallel if parallel else self.serial), prev

    def run_stage(self, num_elements: int, stage, *args) -> None:
        """``stage(kernels, *args)`` with the serial or parallel kernels picked for
        ``num_elements`` (Numba's thread count restored afterwards)."""
        kernels, prev = self.pick(num_elements)
        try:
            stage(kernels, *args)
        finally:
            if prev is not None:
                numba.set_num_threads(prev)

    def extract(
        self,
        kernels,
        acts,
        labels,
        act_lens,
        label_lens,
        opts,
        need_grad,
        buffer,
        rows,
        bad,
    ) -> None:
        """Pass 1 (the extract stage) with ``kernels`` (from :meth:`pick`): numpy
        arrays in, ``rows`` / ``buffer`` / ``bad`` filled (see
        ``espnet_multiblank.loss.stages``)."""
        kernels[0](
            acts,
            labels,
            act_lens,
            label_lens,
            opts.blank,
            self.symbols(opts, acts.shape),
            opts.sigma,
            need_grad,
            buffer,
            rows,
            bad,
        )

    def sweep(self, kernels, rows, act_lens, label_lens, opts, need_grad, log_p):
        """Pass 2 (the lattice stage) with ``kernels``: ``log_p`` filled, the valid
        rows overwritten with the occupancies when ``need_grad``."""
        B, _, U, _ = rows.shape
        kernels[1](
            rows,
            act_lens,
            label_lens,
            self.durations(opts),
            opts.fastemit_lambda,
            need_grad,
            *self.lattice_extra(opts, B, U, kernels is self.parallel),
            log_p,
        )

    def lattice(self, opts, rows, act_lens, label_lens, need_grad: bool):
        """The lattice stage on rows extracted by the caller, serial or parallel
        kernels as the size says (Numba's thread count restored afterwards).

        Args:
            rows: (B, T, U, width) float64 C-contiguous (``loss/rows.py``), a numpy
                array or a CPU tensor (viewed as one); the valid rows of the possible
                utterances are overwritten when ``need_grad``.
            act_lens, label_lens: (B,) int64 numpy arrays or CPU tensors.
        Returns:
            log_p (B,) float64, a numpy array for numpy rows, else a tensor.
        Raises:
            TypeError / ValueError when the arrays break the contract.
        """
        as_tensor = isinstance(rows, torch.Tensor)
        if as_tensor:
            rows, act_lens, label_lens = (
                x.numpy() if isinstance(x, torch.Tensor) else x
                for x in (rows, act_lens, label_lens)
            )
        check_rows(self.layout(opts), rows, act_lens, label_lens)
        B, T, U, _ = rows.shape
        log_p = np.empty(B, np.float64)
        args = (rows, act_lens, label_lens, opts, need_grad, log_p)
        self.run_stage(B * T * U * LOGITS_PER_NODE, self.sweep, *args)
        return torch.from_numpy(log_p) if as_tensor else log_p

    def apply(
        self, kernels, labels, act_lens, label_lens, opts, rows, log_p, factors, buffer
    ) -> None:
        """Pass 3 (the dense apply stage) with ``kernels``: ``buffer`` (the exps of
        pass 1) becomes the gradient in place."""
        kernels[2](
            labels,
            act_lens,
            label_lens,
            opts.blank,
            self.symbols(opts, buffer.shape),
            rows,
            log_p,
            opts.fastemit_lambda,
            opts.clamp,
            factors,
            buffer,
        )

    def finish(self, tensors: Tuple[torch.Tensor, ...], opts, factors) -> torch.Tensor:
        """Pass 3 on the tensors :meth:`begin` returned (e.g. as saved by autograd):
        the gradient buffer (the first of them) becomes ``factors[b] * clip(d cost_b
        / d acts_b, -clamp, clamp)`` in place and is returned.

        Args:
            tensors: ``(buffer (B, T, U, V') acts dtype: the exps of pass 1,
                rows (B, T, U, width) float64: per node the occupancies of its
                transitions and the softmax coefficients, log_p (B,) float64,
                labels, act_lens, label_lens)``.
            factors: (B,) per-utterance factor (reduction weight times incoming
                gradient, any sign): a CPU tensor or a numpy array.
        """
        buffer, rows, log_p, labels, act_lens, label_lens = tensors
        self.run_stage(
            buffer.numel(),
            self.apply,
            labels.numpy(),
            act_lens.numpy(),
            label_lens.numpy(),
            opts,
            rows.numpy(),
            log_p.numpy(),
            np.ascontiguousarray(factors, dtype=np.float64),
            buffer.numpy(),
        )
        return buffer

    def begin(
        self, batch: LossBatch, opts, need_grad: bool
    ) -> Tuple[np.ndarray, Optional[Tuple[torch.Tensor, ...]]]:
        """Passes 1 and 2: costs and, when ``need_grad``, what pass 3 needs.

        Args:
            batch: the validated :class:`~espnet_multiblank.loss.batch.LossBatch` on
                the CPU: acts (B, T, U, V') contiguous float32/float64 raw logits,
                labels (B, L) int64 (L <= U - 1, padding replaced by valid ids),
                act_lens, label_lens (B,) int64.
            opts: the loss's options.
            need_grad: whether the gradient will be wanted.
        Returns:
            costs: (B,) float64 numpy array, ``-(1 + lambda) log P`` (+inf if
                impossible, NaN if a valid row holds NaN / +inf logits or a
                distribution of only -inf).
            pending: the tensors :meth:`finish` takes (the gradient buffer first),
                or None (not need_grad, or NaN costs).
        """
        acts, labels, act_lens, label_lens = batch
        B, T, U, _ = acts.shape
        x = acts.numpy()
        if not labels.is_contiguous():
            labels = labels.contiguous()
        # numpy allocates: its large arrays get transparent huge pages (madvise) and
        # glibc reuses freed heap blocks of up to 32 MB, whereas torch's aligned
        # allocations of that size are often fresh 4 kB pages on every call, and
        # page faults are expensive on virtual machines
        rows = np.empty((B, T, U, self.width(opts)), np.float64)
        log_p = np.empty(B, np.float64)
        bad = np.zeros(B, np.uint8)
        buffer = np.empty(acts.shape, x.dtype) if need_grad else x
        al = act_lens.numpy()
        ll = label_lens.numpy()
        kernels, prev = self.pick(acts.numel())
        try:
            self.extract(
                kernels,
                x,
                labels.numpy(),
                al,
                ll,
                opts,
                need_grad,
                buffer,
                rows,
                bad,
            )
            if bad.any():
                costs = np.zeros(B, np.float64)
                costs[bad.astype(bool)] = np.nan
                return costs, None
            self.sweep(kernels, rows, al, ll, opts, need_grad, log_p)
        finally:
            if prev is not None:
                numba.set_num_threads(prev)
        costs = -(1.0 + opts.fastemit_lambda) * log_p + 0.0
        if not need_grad:
            return costs, None
        from_numpy = torch.from_numpy
        pending = (
            from_numpy(buffer),
            from_numpy(rows),
            from_numpy(log_p),
            labels,
            act_lens,
            label_lens,
        )
        return costs, pending

    def __call__(
        self,
        acts: torch.Tensor,
        labels: torch.Tensor,
        act_lens: torch.Tensor,
        label_lens: torch.Tensor,
        opts,
        grad_weights: torch.Tensor,
        need_grad: bool,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Costs and (optionally) gradients on CPU (the CUDA backend's contract).

        Args:
            acts, labels, act_lens, label_lens: the fields of :meth:`begin`'s batch.
            opts, need_grad: as for :meth:`begin`.
            grad_weights: (B,) per-utterance weight applied after the clamp.
        Returns:
            costs: (B,) acts.dtype (see :meth:`begin`).
            grads: acts' shape and dtype, or None; zeros when a cost is NaN.
        """
        batch = LossBatch(acts, labels, act_lens, label_lens)
        costs, pending = self.begin(batch, opts, need_grad)
        costs = torch.from_numpy(costs).to(acts.dtype)
        if not need_grad:
            return costs, None
        if pending is None:  # NaN / +inf logits: the caller raises
            return costs, torch.zeros_like(acts)
        return costs, self.finish(pending, opts, grad_weights.detach())


@functools.lru_cache(maxsize=256)
def _option_arrays(opts: LossOptions) -> Tuple[np.ndarray, np.ndarray]:
    """(big blank ids, durations) as read-only int64 arrays."""
    ids = np.asarray(opts.big_blank_ids, dtype=np.int64)
    durations = np.asarray(opts.big_blank_durations, dtype=np.int64)
    ids.setflags(write=False)
    durations.setflags(write=False)
    return ids, durations


# the multi-blank family; rows per node: the occupancies of its N + 2 transitions
# (standard blank, label, N big blanks) and the softmax coefficient
compute = KernelDriver(
    (kernels.rows_forward, kernels.lattice, kernels.rows_backward),
    layout=multiblank_rows,
    symbols=lambda opts, shape: _option_arrays(opts)[0],
    durations=lambda opts: _option_arrays(opts)[1],
)


@functools.lru_cache(maxsize=256)
def _tdt_durations(opts: TDTOptions) -> np.ndarray:
    d = np.asarray(opts.durations, dtype=np.int64)
    d.setflags(write=False)
    return d


# pass 2 of the TDT sweeps the anti-diagonals of several utterances in one vector
# loop: about this many columns (nodes of an anti-diagonal) per group of utterances
GROUP_COLUMNS = 512


def _tdt_groups(B: int, U: int, parallel: bool) -> int:
    """Number of groups of utterances of the TDT pass 2 (at least one per thread)."""
    groups = -(-B * (U + 1) // GROUP_COLUMNS)
    if parallel:
        groups = max(groups, numba.get_num_threads())
    return max(1, min(B, groups))


# the TDT family; rows per node: W_blank, W_label, W_dur(0..D-1) and the two softmax
# coefficients; the kernels take the number V of token logits (the D duration logits
# follow them)
tdt_compute = KernelDriver(
    (
        tdt_kernels.tdt_rows_forward,
        tdt_kernels.tdt_lattice,
        tdt_kernels.tdt_rows_backward,
    ),
    layout=tdt_rows,
    symbols=lambda opts, shape: shape[3] - opts.num_durations,
    durations=_tdt_durations,
    lattice_extra=lambda opts, B, U, parallel: (_tdt_groups(B, U, parallel),),
)
