"""Everything the fused joint + loss takes from ``espnet_multiblank.loss``, in one
place.

The fused path shares the dense losses' options, input checks, reductions and lattice
kernels; it reaches them only through this module, so that a change of the loss
package's internals is a change here. What it uses:

* the option makers (``make_options``, ``make_tdt_options``, ``check_probability``)
  and the backend names;
* the tensor checks (``check_tensor``: type, rank, dtype, the dense messages) and the
  label / length checks (:func:`check_labels_and_lengths`, with the dense messages'
  ``acts`` renamed to the fused arguments);
* the reduction of per-utterance costs (:func:`reduce_costs`);
* the vectorisable float32 / float64 range primitives of the dense CPU kernels
  (:func:`cpu_row_ops`: exp, max and NaN check, scale, clamp of a row), which the
  fused CPU tile kernels use on a tile's logits, and the dense CPU driver's thread
  rule and serial twins of parallel kernels (:func:`cpu_threads`,
  :func:`cpu_serial_twin`);
* the **lattice stage** on per-node planes, one function per device with the same
  contract, ``run_lattice_*(opts, rows, act_lens, label_lens, need_grad) -> log_p``:

  - ``rows``: (B, T, U, width) float64, C-contiguous, one row per lattice node;
    multi-blank (N big blanks, N = 0: standard), width N + 3:
    ``[lp_blank, lp_label (-inf on row u = L_b), lp_big_0 .. lp_big_{N-1}, r]``;
    TDT (D durations), width D + 4: ``[tok_blank, tok_label (-inf on the last row),
    dur_0 .. dur_{D-1}, r_tok, r_dur]``; the log-probs include ``-sigma`` (tokens
    only for TDT); rows of padding (t >= T_b or u > L_b) are never read;
  - returns ``log_p`` (B,) float64 (0 for T_b = 0 = L_b, -inf for an impossible
    utterance); when ``need_grad`` the valid rows of the possible utterances are
    overwritten with the occupancies: multi-blank ``[W_blank, W_label, W_big_i...,
    (gamma + lambda W_label) r]``, TDT ``[W_blank, W_label, W_dur_j..., (gamma +
    lambda W_label) r_tok, gamma r_dur]`` (``docs/lattice.md``: W the probability
    that a path takes the step, gamma that it visits the node).

  :func:`run_lattice_cpu` is the CPU Numba kernels (numpy rows),
  :func:`run_lattice_cuda` the Numba CUDA alpha / beta / weights kernels (CUDA
  tensors; CPU tensors under ``NUMBA_ENABLE_CUDASIM=1``), :func:`run_lattice_torch`
  the pure-PyTorch anti-diagonal recursion of the reference backend, differentiated
  by autograd (any device; the occupancy of a step is d log P / d its log-prob).
"""

import re
from typing import Callable, Tuple

import numpy as np
import torch

from espnet_multiblank.loss.dispatch import BACKENDS, check_backend
from espnet_multiblank.loss.function import reduce_costs
from espnet_multiblank.loss.options import (
    LossOptions,
    TDTOptions,
    check_probability,
    make_options,
    make_tdt_options,
)
from espnet_multiblank.loss.validation import FLOAT_DTYPES, LabelRule
from espnet_multiblank.loss.validation import _check_tensor as check_tensor
from espnet_multiblank.loss.validation import check_lengths_and_labels, check_tensors

__all__ = [
    "BACKENDS",
    "FLOAT_DTYPES",
    "LossOptions",
    "TDTOptions",
    "check_backend",
    "check_labels_and_lengths",
    "check_probability",
    "check_tensor",
    "cpu_row_ops",
    "gradient_flush_below",
    "is_tdt",
    "make_options",
    "make_tdt_options",
    "planes_width",
    "reduce_costs",
    "run_lattice_cpu",
    "run_lattice_cuda",
    "run_lattice_torch",
]

LatticeRunner = Callable[..., np.ndarray]


def cpu_threads(num_elements: int):
    """(parallel, previous Numba thread count or None): whether a CPU kernel over
    ``num_elements`` values runs in parallel, by the dense CPU kernels' rule (one
    torch thread, small work, or a process forked after a parallel region: serial;
    else as many Numba threads as torch's, which the caller restores afterwards)."""
    from espnet_multiblank.loss.cpu import driver

    return driver._pick(num_elements)


def cpu_serial_twin(kernel):
    """A single-threaded copy of a ``parallel=True`` Numba kernel (prange as range),
    cached on disk beside it (the dense CPU driver's)."""
    from espnet_multiblank.loss.cpu import driver

    return driver._serial_twin(kernel)


def gradient_flush_below() -> float:
    """The dense path's relative bound below which gradient values are set to 0
    (:mod:`espnet_multiblank.loss.flush`)."""
    from espnet_multiblank.loss.flush import GRADIENT_FLUSH_BELOW

    return GRADIENT_FLUSH_BELOW


def cpu_row_ops():
    """The dense CPU kernels' range primitives (a module of Numba functions; imported
    on first use, so that importing the package does not import Numba)."""
    from espnet_multiblank.loss.cpu import row_ops

    return row_ops


def is_tdt(opts) -> bool:
    return isinstance(opts, TDTOptions)


def planes_width(opts) -> int:
    """Slots per node of the planes (see the module docstring)."""
    return opts.num_durations + 4 if is_tdt(opts) else opts.num_big_blanks + 3


def num_steps(opts) -> int:
    """The occupancy slots of a node (everything but the coefficient slots)."""
    return opts.num_durations + 2 if is_tdt(opts) else opts.num_big_blanks + 2


# ---------------------------------------------------------------------------- checks
# the dense checks name the logits tensor (B, T, U, V'); the fused arguments instead
_RENAMES = (
    (r"acts\.shape\[0\]", "enc.shape[0]"),
    (r"acts\.shape\[1\]", "enc.shape[1]"),
    (r"acts\.shape\[2\] - 1", "pred.shape[1] - 1"),
    (r"acts\.shape\[2\]", "pred.shape[1]"),
    (r"as acts \(", "as enc ("),
)


def _renamed(err: Exception) -> Exception:
    msg = str(err)
    for pattern, new in _RENAMES:
        msg = re.sub(pattern, new, msg)
    return type(err)(msg)


def check_labels_and_lengths(
    enc: torch.Tensor,
    pred: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts,
    vocab_size: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dense losses' checks of labels and lengths against ``enc`` (B, T, J) and
    ``pred`` (B, U, J) (T_b <= T, L_b <= U - 1, ids in [0, V) and not a blank; dtypes,
    batch sizes, devices), with the messages naming enc / pred.

    Args:
        vocab_size: V' = weight.shape[0] (V + D for a TDT).
    Returns:
        labels (B, L) int64 with the padding replaced by 0, act_lens, label_lens (B,)
        int64.
    """
    B, T, U = enc.shape[0], enc.shape[1], pred.shape[1]
    shape_only = torch.empty((B, T, U, 0), device=enc.device)
    if is_tdt(opts):
        V = vocab_size - opts.num_durations
        vocab_text = f"V = weight.shape[0] - len(tdt_durations) = {V}"
        blank_text = f"blank {opts.blank}"
        blank_ids = (opts.blank,)
    else:
        V = vocab_size
        vocab_text = f"V = weight.shape[0] = {V}"
        blank_text = (
            f"standard blank {opts.blank}, big blanks {list(opts.big_blank_ids)}"
        )
        blank_ids = opts.all_blank_ids
    rule = LabelRule(V, blank_ids, vocab_text, blank_text)
    try:
        check_tensors(shape_only, labels, act_lens, label_lens, "")
        return check_lengths_and_labels(shape_only, labels, act_lens, label_lens, rule)
    except (TypeError, ValueError) as err:
        raise _renamed(err) from None


# ------------------------------------------------------------------- lattice: CPU
# the dense CPU driver picks serial or parallel kernels by the number of logits; a
# node's lattice work is about that of this many logits
_LOGITS_PER_NODE = 64


def run_lattice_cpu(opts, rows: np.ndarray, act_lens, label_lens, need_grad: bool):
    """The CPU Numba lattice kernels on numpy planes (module docstring): the loss
    package's lattice stage, :func:`espnet_multiblank.loss.stages.run_lattice`.

    Args:
        rows: (B, T, U, width) float64 numpy array, C-contiguous.
        act_lens, label_lens: (B,) int64 numpy arrays.
    Returns:
        log_p: (B,) float64 numpy array.
    """
    from espnet_multiblank.loss.stages import run_lattice

    B, T, U, _ = rows.shape
    return run_lattice(
        opts,
        rows,
        act_lens,
        label_lens,
        need_grad,
        num_elements=B * T * U * _LOGITS_PER_NODE,
    )


# ------------------------------------------------------------------ lattice: CUDA
def run_lattice_cuda(opts, rows: torch.Tensor, act_lens, label_lens, need_grad: bool):
    """The Numba CUDA alpha / beta and weights kernels on planes on the GPU (module
    docstring), queued on torch's current stream without a host synchronisation.

    Args:
        rows: (B, T, U, width) float64 contiguous CUDA tensor (a CPU tensor in the
            simulator); the kernels read and write its first ``num_steps`` slots.
        act_lens, label_lens: (B,) int64 tensors on the same device.
    Returns:
        log_p: (B,) float64 tensor on the device.
    """
    from espnet_multiblank.loss.cuda import compute

    launch = compute.launch_module()  # without numba-cuda: ImportError, install hint
    if is_tdt(opts):
        from espnet_multiblank.loss.cuda.tdt_kernels import get_tdt_kernels as get
    else:
        from espnet_multiblank.loss.cuda.kernels import get_kernels as get

    B, T, U, _ = rows.shape
    ws = dict(dtype=torch.float64, device=rows.device)
    log_p = torch.empty((B,), **ws)
    if B == 0:
        return log_p
    if T == 0:  # every T_b = 0: the empty path (log P = 0) or impossible
        log_p.copy_(torch.where(label_lens == 0, 0.0, float("-inf")).to(**ws))
        return log_p
    # the row kernels of the family are not used (nor compiled: numba.cuda compiles
    # a kernel at its first launch)
    _, alpha_beta, weights, _ = get("float64", opts.lattice, launch.row_config(1))
    costs = torch.empty((B,), **ws)
    alphas = torch.empty((B, T, U), **ws)
    betas = torch.empty((B, T, U) if need_grad else (1, 1, 1), **ws)
    k = launch.kernel_array
    flags = (k(torch.zeros((B,), dtype=torch.int32, device=rows.device)),)
    flags = flags if is_tdt(opts) else ()
    do_beta = 1 if need_grad else 0

    def body(cfg):
        a_rows, a_lens, a_llens = k(rows), k(act_lens), k(label_lens)
        a_alphas, a_betas, a_logp = k(alphas), k(betas), k(log_p)
        cfg(alpha_beta, (B, 1 + do_beta), launch.diag_threads(T, U))(
            a_rows,
            a_lens,
            a_llens,
            *flags,
            float(opts.fastemit_lambda),
            do_beta,
            a_alphas,
            a_betas,
            a_logp,
            k(costs),
        )
        if need_grad:
            cells = B * T * U
            cfg(weights, -(-cells // launch.CELL_BLOCK), launch.CELL_BLOCK)(
                a_rows, a_lens, a_llens, a_alphas, a_betas, a_logp
            )

    launch.run_on_stream(rows.device, body)
    if need_grad:
        _coefficients_into_rows(opts, rows, log_p)
    return log_p


def _coefficients_into_rows(opts, rows: torch.Tensor, log_p: torch.Tensor) -> None:
    """The coefficient slots of the contract, from the occupancies, for the possible
    utterances (the CUDA weights kernel and the autograd occupancies give the
    occupancies only). Rows of padding get values too: they are never read."""
    ok = torch.isfinite(log_p).view(-1, 1, 1)
    w_label = rows[..., 1]
    lam = opts.fastemit_lambda
    if is_tdt(opts):
        D = opts.num_durations
        gamma = rows[..., 0] + w_label
        for slot, coef in ((D + 2, gamma + lam * w_label), (D + 3, gamma)):
            rows[..., slot] = torch.where(ok, coef * rows[..., slot], rows[..., slot])
        return
    K = opts.num_big_blanks + 2
    coef = rows[..., :K].sum(-1) + lam * w_label
    rows[..., K] = torch.where(ok, coef * rows[..., K], rows[..., K])


# ----------------------------------------------------------------- lattice: torch
_NEG = -1e30  # the reference recursions' finite "log 0" (no NaN through autograd)


def run_lattice_torch(
    opts, rows: torch.Tensor, act_lens, label_lens, need_grad: bool
) -> torch.Tensor:
    """The PyTorch reference recursion on planes (any device), occupancies by
    autograd: W of a step = d log P / d (its log-prob).

    Args:
        rows: (B, T, U, width) float64 tensor.
        act_lens, label_lens: (B,) int64 tensors on its device.
    Returns:
        log_p: (B,) float64 tensor.
    """
    from espnet_multiblank.loss.reference import log_likelihood, tdt_log_likelihood

    B, T, U, _ = rows.shape
    if T == 0:  # every T_b = 0: the empty path (log P = 0) or impossible
        zero = torch.zeros((B,), dtype=torch.float64, device=rows.device)
        return torch.where(label_lens == 0, zero, float("-inf"))
    K = num_steps(opts)
    t = torch.arange(T, device=rows.device)
    u = torch.arange(U, device=rows.device)
    valid = (t.view(1, T, 1) < act_lens.view(B, 1, 1)) & (
        u.view(1, 1, U) <= label_lens.view(B, 1, 1)
    )
    # padding may hold anything (NaN included) and -inf marks the missing label of the
    # last row: both become the finite "log 0" of the recursions
    lp = torch.where(valid[..., None], rows[..., :K], _NEG).clamp(min=_NEG)
    with torch.enable_grad():
        lp = lp.detach().requires_grad_(need_grad)
        if is_tdt(opts):
            dur = lp[..., 2:]
            log_p = tdt_log_likelihood(
                lp[..., :1] + dur,
                lp[..., 1:2] + dur,
                opts.durations,
                act_lens,
                label_lens,
            )
        else:
            log_p = log_likelihood(
                lp[..., 0],
                lp[..., 1],
                [lp[..., 2 + i] for i in range(opts.num_big_blanks)],
                opts.big_blank_durations,
                act_lens,
                label_lens,
            )
        possible = log_p > _NEG / 2
        if need_grad:
            (occ,) = torch.autograd.grad(
                torch.where(possible, log_p, 0.0).sum(), lp, allow_unused=True
            )
    log_p = torch.where(possible, log_p.detach(), float("-inf"))
    if need_grad:
        keep = (valid & possible.view(B, 1, 1))[..., None]
        rows[..., :K] = torch.where(
            keep, occ if occ is not None else 0.0, rows[..., :K]
        )
        _coefficients_into_rows(opts, rows, log_p)
    return log_p
