"""The three stages of every loss of this package, and the interface between them.

A transducer loss over a (B, T, U, V') tensor of logits (V' = V, or V + D for a TDT)
is computed in three stages. Only the first and the last ever touch V'-sized rows;
the middle one works on a few numbers per lattice node (t, u):

1. **extract**: from each valid node's row of logits, the log-softmax normaliser
   and the log-probabilities of the few symbols the lattice uses there (standard
   RNN-T: the blank and the next label; multi-blank: also each big blank; TDT: the
   token blank and label, and the whole duration head) -> the node's *row* of
   ``rows`` below;
2. **lattice**: the forward and backward sweeps over those rows only: the costs
   ``-(1 + lambda) log P`` and, when the gradient is wanted, each node's transition
   occupancies (the probability that a path takes the transition), with sigma and
   FastEmit folded in;
3. **apply**: the gradient from the occupancies: written into a logits-sized buffer
   (the dense path of :mod:`espnet_multiblank.loss.function`), or contracted into a
   joint network's parameters by a caller that recomputes the logits tile by tile.

The definitions (recursions, gradients, sigma, FastEmit) are in ``docs/lattice.md``;
this module fixes the data that passes between the stages on the CPU.

The rows (the contract)
-----------------------
``rows`` is a ``(B, T, U, width)`` float64 C-contiguous numpy array, one row per
node (t, u); only the valid nodes (``t < T_b``, ``u <= L_b``) are read or written,
the others may hold anything. After **extract**:

* multi-blank with N big blanks (N = 0: standard RNN-T), ``width = N + 3``::

      [lp_blank, lp_label, lp_big_0, ..., lp_big_{N-1}, r]

  ``lp_k = log_softmax(z)[k] - sigma`` for the standard blank, the label ``y_u``
  (``-inf`` on the last row ``u = L_b``: no label left) and big blank ``i`` (index
  ``blank - 1 - i``); ``r`` is a softmax coefficient (see below);
* TDT with D durations, ``width = D + 4``::

      [tok_blank, tok_label, dur_0, ..., dur_{D-1}, r_tok, r_dur]

  ``tok_k = log_softmax(z[:V])[k] - sigma`` for the blank and ``y_u`` (``-inf`` on
  the last row), ``dur_j = log_softmax(z[V:])[j]`` (no sigma); ``r_tok`` and
  ``r_dur`` are the token and duration parts' coefficients.

After **lattice** with the gradient wanted, each valid row of a possible utterance
holds the occupancies (probabilities in [0, 1]) of the transitions leaving its node
and the coefficients multiplied by the node's softmax weight:

* multi-blank: ``[W_blank, W_label, W_big_0, ..., W_big_{N-1}, (gamma + lambda
  W_label) * r]``;
* TDT: ``[W_blank, W_label, W_dur_0, ..., W_dur_{D-1}, (gamma + lambda W_label) *
  r_tok, gamma * r_dur]``

where ``gamma`` is the probability that a path visits the node (the sum of the
occupancies of its transitions) and ``lambda`` the FastEmit weight. With ``p =
softmax`` of the row's logits (of its part, for a TDT), the gradient of the cost of
utterance b is then, for a multi-blank row,

    d cost_b / d z[k] = (gamma + lambda W_label) p_k - W_blank [k = blank]
                        - (1 + lambda) W_label [k = y_u] - sum_i W_big_i [k = big_i]

and for a TDT row ``(gamma + lambda W_label) p_k - W_blank [k = blank] - (1 + lambda)
W_label [k = y_u]`` on the token part and ``gamma q_j - W_dur_j`` on the duration
part. The dense path stores the row's exps ``e = exp(z - c)`` and puts ``r = 1 / S``
(``S = sum(e)``) in the coefficient slot, so that ``coef * e_k = (gamma + lambda
W_label) p_k``; a caller that puts ``r = 1`` gets the coefficients themselves. Rows
of an impossible utterance (``log P = -inf``) are left as they are: their gradient is
zero, whatever they hold.

Functions
---------
* :func:`run_lattice` (lattice): the stage the fused joint + loss shares with the
  dense path, on rows it extracted itself;
* :func:`extract_rows` and :func:`apply_rows` (extract and dense apply), the dense
  path's stages 1 and 3 (the autograd Function runs them through
  ``espnet_multiblank.loss.cpu.driver``, which uses the same kernels).

All of them run the CPU Numba kernels (``espnet_multiblank.loss.cpu``): serial or
parallel and with as many threads as the driver chooses for the loss itself
(``torch.get_num_threads()``, single-threaded for small problems and in forked
children), leaving Numba's and torch's thread settings as they were.
"""

from typing import Optional, Tuple

import numba
import numpy as np


def _driver(opts):
    """The CPU kernel driver of ``opts``' lattice family."""
    from espnet_multiblank.loss.families import family_of

    return family_of(opts).cpu_driver()


def _run_stage(driver, num_elements: int, stage, *args) -> None:
    """``stage(kernels, *args)`` with the serial or parallel kernels the driver picks
    for ``num_elements`` (Numba's thread count restored afterwards)."""
    kernels, prev = driver.pick(num_elements)
    try:
        stage(kernels, *args)
    finally:
        if prev is not None:
            numba.set_num_threads(prev)


def _check_lengths(name: str, x, B: int, bound: int, what: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.int64 or x.shape != (B,):
        raise TypeError(
            f"{name} must be a (B,) = ({B},) int64 numpy array, got "
            f"{type(x).__name__} {getattr(x, 'dtype', '')} "
            f"{getattr(x, 'shape', '')}"
        )
    if B and (int(x.min()) < 0 or int(x.max()) > bound):
        raise ValueError(f"{name} must be in [0, {bound}] ({what}), got {x.tolist()}")


def check_rows(opts, rows, act_lens, label_lens) -> None:
    """Raise TypeError / ValueError unless ``rows``, ``act_lens`` and ``label_lens``
    follow the contract of this module for ``opts`` (the kernels read and write
    within the lengths without bounds checks)."""
    width = _driver(opts).width(opts)
    if not isinstance(rows, np.ndarray) or rows.dtype != np.float64 or rows.ndim != 4:
        raise TypeError(
            "rows must be a (B, T, U, width) float64 numpy array, got "
            f"{type(rows).__name__} {getattr(rows, 'dtype', '')} "
            f"{getattr(rows, 'shape', '')}"
        )
    if not rows.flags.c_contiguous or not rows.flags.writeable:
        raise ValueError("rows must be C-contiguous and writeable")
    B, T, U, w = rows.shape
    if w != width:
        raise ValueError(
            f"rows.shape[3] must be {width} for these options (see "
            f"espnet_multiblank.loss.stages), got {w}"
        )
    if U < 1:
        raise ValueError(f"rows.shape[2] (U = max labels + 1) must be >= 1, got {U}")
    _check_lengths("act_lens", act_lens, B, T, "frames per utterance, <= T")
    _check_lengths("label_lens", label_lens, B, U - 1, "labels per utterance")


def run_lattice(
    opts,
    rows: np.ndarray,
    act_lens: np.ndarray,
    label_lens: np.ndarray,
    need_grad: bool,
    *,
    num_elements: Optional[int] = None,
) -> np.ndarray:
    """The lattice stage on extracted rows: log P per utterance.

    Args:
        opts: validated options of either family
            (:class:`~espnet_multiblank.loss.options.LossOptions` or
            :class:`~espnet_multiblank.loss.options.TDTOptions`); ``blank``,
            ``sigma``, ``clamp`` and ``reduction`` are not used here.
        rows: (B, T, U, width) float64 C-contiguous, as the module docstring
            describes; when ``need_grad``, the valid rows of every possible utterance
            are overwritten with the occupancies and coefficients.
        act_lens, label_lens: (B,) int64 numpy arrays, ``T_b <= T``, ``L_b <= U - 1``.
        need_grad: whether to run the backward sweep (the occupancies).
        num_elements: the size the serial / parallel choice is made on (the dense
            path passes the number of logits; default: ``rows.size``).

    Returns:
        (B,) float64 ``log P``: 0 for ``T_b = 0 = L_b``, ``-inf`` for an impossible
        utterance (no complete path). The cost is ``-(1 + fastemit_lambda) log P``.

    Raises:
        TypeError / ValueError when the arrays break the contract.
    """
    check_rows(opts, rows, act_lens, label_lens)
    driver = _driver(opts)
    log_p = np.empty(rows.shape[0], np.float64)
    size = rows.size if num_elements is None else num_elements
    args = (rows, act_lens, label_lens, opts, bool(need_grad), log_p)
    _run_stage(driver, size, driver.sweep, *args)
    return log_p


def extract_rows(
    opts,
    acts: np.ndarray,
    labels: np.ndarray,
    act_lens: np.ndarray,
    label_lens: np.ndarray,
    store_exps: bool,
) -> Tuple[np.ndarray, Optional[np.ndarray], np.ndarray]:
    """The extract stage of the dense path (one read of the logits).

    Args:
        opts: validated options of either family.
        acts: (B, T, U, V') float32 / float64 C-contiguous raw logits.
        labels: (B, L) int64 C-contiguous, ``L >= max L_b``, padding replaced by
            valid ids; act_lens, label_lens: (B,) int64 (validated).
        store_exps: also return the exps of the valid rows (the dense apply stage
            turns them into the gradient), padding rows zeroed.

    Returns:
        ``(rows, exps or None, bad)``: rows (B, T, U, width) float64 as the module
        docstring describes (``r = 1 / S``); exps (B, T, U, V') in acts' dtype;
        bad (B,) bool, True for an utterance with a NaN / +inf logit in a valid row
        or a distribution of only -inf (its rows are unusable).
    """
    driver = _driver(opts)
    B, T, U, _ = acts.shape
    rows = np.empty((B, T, U, driver.width(opts)), np.float64)
    bad = np.zeros(B, np.uint8)
    exps = np.empty(acts.shape, acts.dtype) if store_exps else None
    buffer = acts if exps is None else exps
    args = (acts, labels, act_lens, label_lens, opts, store_exps, buffer, rows, bad)
    _run_stage(driver, acts.size, driver.extract, *args)
    return rows, exps, bad.astype(bool)


def apply_rows(
    opts,
    rows: np.ndarray,
    log_p: np.ndarray,
    exps: np.ndarray,
    labels: np.ndarray,
    act_lens: np.ndarray,
    label_lens: np.ndarray,
    factors: np.ndarray,
) -> np.ndarray:
    """The dense apply stage: ``exps`` (from :func:`extract_rows`) becomes, in
    place, ``factors[b] * clip(d cost_b / d acts_b, -clamp, clamp)`` and is returned.

    Args:
        rows: the output of :func:`run_lattice` with ``need_grad``; log_p its (B,)
            result; labels, act_lens, label_lens as for :func:`extract_rows`;
            factors: (B,) float64 (reduction weight times incoming gradient).
    """
    driver = _driver(opts)
    factors = np.ascontiguousarray(factors, dtype=np.float64)
    args = (labels, act_lens, label_lens, opts, rows, log_p, factors, exps)
    _run_stage(driver, exps.size, driver.apply, *args)
    return exps
