"""The rows: what a lattice node passes between the stages of a loss (the contract).

``rows`` is a ``(B, T, U, width)`` float64 C-contiguous array (numpy on the CPU, a
torch tensor on a GPU), one row per lattice node (t, u); only the valid nodes
(``t < T_b``, ``u <= L_b``) are read or written, the others may hold anything.
A :class:`RowsLayout` (one per lattice, from its family record:
``espnet_multiblank.loss.families``) says what the slots hold. After **extract**:

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

In the layout's words: the **token steps** (the blank, the label, then the other
blank symbols of ``step_ids``), then the **duration** slots (D, a TDT's), then one
**coefficient** slot per softmax part of the row (the tokens; the durations).

After **lattice** with the gradient wanted, each valid row of a possible utterance
holds the occupancies (probabilities in [0, 1]) of the transitions leaving its node
and the coefficients multiplied by the node's softmax weight:

* multi-blank: ``[W_blank, W_label, W_big_0, ..., W_big_{N-1}, (gamma + lambda
  W_label) * r]``;
* TDT: ``[W_blank, W_label, W_dur_0, ..., W_dur_{D-1}, (gamma + lambda W_label) *
  r_tok, gamma * r_dur]``

where ``gamma`` is the probability that a path visits the node (the sum of the
occupancies of its token steps; a TDT's W_dur split the same paths by duration) and
``lambda`` the FastEmit weight. With ``p = softmax`` of the row's logits (of its part,
for a TDT), the gradient of the cost of utterance b is then, for a multi-blank row,

    d cost_b / d z[k] = (gamma + lambda W_label) p_k - W_blank [k = blank]
                        - (1 + lambda) W_label [k = y_u] - sum_i W_big_i [k = big_i]

and for a TDT row ``(gamma + lambda W_label) p_k - W_blank [k = blank] - (1 + lambda)
W_label [k = y_u]`` on the token part and ``gamma q_j - W_dur_j`` on the duration
part. The dense path stores the row's exps ``e = exp(z - c)`` and puts ``r = 1 / S``
(``S = sum(e)``) in the coefficient slot, so that ``coef * e_k = (gamma + lambda
W_label) p_k``; a caller that puts ``r = 1`` gets the coefficients themselves. Rows
of an impossible utterance (``log P = -inf``) are left as they are: their gradient is
zero, whatever they hold.
"""

import functools
from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class RowsLayout:
    """The slots of a row of one lattice (module docstring).

    Attributes:
        step_ids: the symbols of the token steps other than the label, the standard
            blank first: slot 0 is ``step_ids[0]``, slot 1 the label, slot ``1 + i``
            ``step_ids[i]`` for i >= 1 (a multi-blank lattice's big blanks).
        num_durations: D, the duration logits that follow the V token logits of a
            row of logits, one slot each after the token steps (a TDT's); 0: none.
    """

    step_ids: Tuple[int, ...]
    num_durations: int = 0

    @property
    def num_token_steps(self) -> int:
        """The token steps' slots: the blank, the label, the other blanks."""
        return len(self.step_ids) + 1

    @property
    def num_steps(self) -> int:
        """The occupancy slots (every slot but the coefficients)."""
        return self.num_token_steps + self.num_durations

    @property
    def num_parts(self) -> int:
        """The softmax parts of a row of logits, one coefficient slot each."""
        return 2 if self.num_durations else 1

    @property
    def width(self) -> int:
        return self.num_steps + self.num_parts

    def num_tokens(self, num_logits: int) -> int:
        """V: the token logits of a row of ``num_logits`` logits."""
        return num_logits - self.num_durations

    def parts(self, num_logits: int) -> Tuple[Tuple[int, int], ...]:
        """The ranges ``[lo, hi)`` of a row of logits that have their own softmax."""
        V = self.num_tokens(num_logits)
        return ((0, V), (V, num_logits)) if self.num_durations else ((0, V),)


@functools.lru_cache(maxsize=256)
def multiblank_rows(opts) -> RowsLayout:
    """The layout of a multi-blank (standard: no big blanks) lattice's rows."""
    return RowsLayout(opts.lattice.blank_ids)


@functools.lru_cache(maxsize=256)
def tdt_rows(opts) -> RowsLayout:
    """The layout of a TDT lattice's rows."""
    return RowsLayout(opts.lattice.blank_ids, opts.lattice.num_durations)


def _check_lengths(name: str, x, B: int, bound: int, what: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.int64 or x.shape != (B,):
        raise TypeError(
            f"{name} must be a (B,) = ({B},) int64 numpy array, got "
            f"{type(x).__name__} {getattr(x, 'dtype', '')} "
            f"{getattr(x, 'shape', '')}"
        )
    if B and (int(x.min()) < 0 or int(x.max()) > bound):
        raise ValueError(f"{name} must be in [0, {bound}] ({what}), got {x.tolist()}")


def check_rows(layout: RowsLayout, rows, act_lens, label_lens) -> None:
    """Raise TypeError / ValueError unless numpy ``rows``, ``act_lens`` and
    ``label_lens`` follow the contract (the CPU kernels read and write within the
    lengths without bounds checks)."""
    if not isinstance(rows, np.ndarray) or rows.dtype != np.float64 or rows.ndim != 4:
        raise TypeError(
            "rows must be a (B, T, U, width) float64 numpy array, got "
            f"{type(rows).__name__} {getattr(rows, 'dtype', '')} "
            f"{getattr(rows, 'shape', '')}"
        )
    if not rows.flags.c_contiguous or not rows.flags.writeable:
        raise ValueError("rows must be C-contiguous and writeable")
    B, T, U, w = rows.shape
    if w != layout.width:
        raise ValueError(
            f"rows.shape[3] must be {layout.width} for these options (see "
            f"espnet_multiblank.loss.rows), got {w}"
        )
    if U < 1:
        raise ValueError(f"rows.shape[2] (U = max labels + 1) must be >= 1, got {U}")
    _check_lengths("act_lens", act_lens, B, T, "frames per utterance, <= T")
    _check_lengths("label_lens", label_lens, B, U - 1, "labels per utterance")


def fill_coefficients(
    layout: RowsLayout, rows: torch.Tensor, log_p: torch.Tensor, fastemit_lambda
) -> None:
    """The coefficient slots of the contract from the occupancies, in place, for the
    possible utterances (for the lattice runners that compute the occupancies only:
    the CUDA weights kernel, autograd). Rows of padding get values too: they are
    never read.

    Args:
        rows: (B, T, U, width) float64 tensor holding the occupancies and ``r``.
        log_p: (B,) float64 tensor on its device.
    """
    ok = torch.isfinite(log_p).view(-1, 1, 1)
    w_label = rows[..., 1]
    gamma = rows[..., : layout.num_token_steps].sum(-1)
    coefs = (gamma + fastemit_lambda * w_label, gamma)[: layout.num_parts]
    for slot, coef in zip(range(layout.num_steps, layout.width), coefs):
        rows[..., slot] = torch.where(ok, coef * rows[..., slot], rows[..., slot])
