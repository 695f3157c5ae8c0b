"""The greedy step of every lattice, on the joint network's log-probabilities (NumPy).

A greedy hypothesis at frame t of an utterance with T frames, having emitted g labels
at t, takes one arc of the lattice (:mod:`espnet_multiblank.lattice`: its
``blank_arcs`` and ``label_moves``; one description for standard, multi-blank and
TDT models). The arcs it may take (the lattice's end rule, as the plug-in's
searches apply it):

* a blank arc covering n frames when n <= T - t (landing on T ends the hypothesis);
* a label with a move of n frames when n < T - t (a label never lands on T), and,
  once ``max_sym_per_frame`` labels stayed at t, only with n >= 1;
* when that leaves nothing (a TDT without duration 1 near the end), every blank
  arc, clipped at T.

How it chooses (``blank_decision``, as in the plug-in):

* ``"total"``: the best label token k (the highest token log-probability) scores
  ``tok[k] + log sum exp(its allowed moves)``; the blanks score ``log sum exp(the
  allowed blank arcs)``; a label is emitted when its score is higher (a tie goes
  to the blanks), with its most probable allowed move, else the most probable
  allowed blank arc;
* ``"symbol"``: the most probable allowed arc (a tie goes to the blanks).

The decision at a frame depends on T only through ``room = T - t`` up to R + 1
(R: the longest arc), so a step is "free" when room > R and no guard applies;
:meth:`StepRule.free` decides a whole window of such frames with a few array
operations, :meth:`StepRule.decide` one frame under any room and guard.

Shapes: W frames, V' joint outputs (V tokens, then D duration outputs for a TDT).
"""

from typing import NamedTuple

import numpy as np

#: ``blank_decision`` values
BLANK_DECISIONS = ("total", "symbol")


class Step(NamedTuple):
    """One greedy step: ``is_label``, ``symbol`` (token id), ``frames`` moved,
    ``score`` (the decision's score: see the module docstring)."""

    is_label: bool
    symbol: int
    frames: int
    score: float


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - safe), axis=axis, keepdims=True)) + safe
    return np.squeeze(out, axis)


class StepRule:
    """The greedy decision of a lattice (module docstring).

    Args:
        lattice: A ``MultiblankLattice`` or ``TDTLattice``.
        joint_size: V', the joint network's outputs.
        blank_decision: ``"total"`` or ``"symbol"``.
        max_sym_per_frame: Labels that may stay at one frame (>= 1).
    """

    def __init__(self, lattice, joint_size: int, blank_decision: str, max_sym: int):
        if blank_decision not in BLANK_DECISIONS:
            raise ValueError(
                f"blank_decision must be one of {list(BLANK_DECISIONS)}, got "
                f"{blank_decision!r}"
            )
        if isinstance(max_sym, bool) or not isinstance(max_sym, int) or max_sym < 1:
            raise ValueError(f"max_sym_per_frame must be an int >= 1, got {max_sym!r}")
        self.total = blank_decision == "total"
        self.max_sym = max_sym
        D = lattice.num_duration_outputs
        V = joint_size - D
        self.V = V
        arcs = lattice.blank_arcs
        moves = lattice.label_moves
        blank_ids = set(lattice.blank_ids)
        # columns of the log-probabilities (a slot j is column V + j)
        self.blank_tok = np.array([a.token for a in arcs])
        self.blank_dur = np.array([-1 if a.slot is None else V + a.slot for a in arcs])
        self.blank_frames = np.array([a.frames for a in arcs])
        self.label_tok = np.array([k for k in range(V) if k not in blank_ids])
        self.move_dur = np.array([-1 if m.slot is None else V + m.slot for m in moves])
        self.move_frames = np.array([m.frames for m in moves])
        self.tdt = D > 0
        self.R = lattice.max_frames
        #: room above which no end-rule mask applies
        self.free_room = self.R + 1

    # --------------------------------------------------------------- scores
    def _blank_scores(self, lp: np.ndarray) -> np.ndarray:
        """(..., NB) log-probabilities of the blank arcs."""
        s = lp[..., self.blank_tok]
        if self.tdt:
            s = s + lp[..., self.blank_dur]
        return s

    def _move_scores(self, lp: np.ndarray) -> np.ndarray:
        """(..., NM) the moves' duration log-probabilities (0 without)."""
        if self.tdt:
            return lp[..., self.move_dur]
        return np.zeros(lp.shape[:-1] + (1,), lp.dtype)

    # ------------------------------------------------------------ decisions
    def free(self, lp: np.ndarray):
        """Decisions of W frames where room > R and no guard applies.

        Args:
            lp: (W, V') float32 log-probabilities.

        Returns:
            (W,) bool is_label, (W,) int64 symbol, (W,) int64 frames, (W,) float64
            score.
        """
        bs = self._blank_scores(lp)  # (W, NB)
        bj = np.argmax(bs, 1)
        lt = lp[:, self.label_tok]  # (W, L)
        lk = np.argmax(lt, 1)
        rows = np.arange(lp.shape[0])
        ltop = lt[rows, lk].astype(np.float64)
        ms = self._move_scores(lp)  # (W, NM)
        mj = np.argmax(ms, 1)
        if self.total:
            blank = _logsumexp(bs.astype(np.float64), 1)
            label = ltop + _logsumexp(ms.astype(np.float64), 1)
        else:
            blank = bs[rows, bj].astype(np.float64)
            label = ltop + ms[rows, mj]
        is_label = label > blank
        symbol = np.where(is_label, self.label_tok[lk], self.blank_tok[bj])
        frames = np.where(is_label, self.move_frames[mj], self.blank_frames[bj])
        return is_label, symbol, frames, np.where(is_label, label, blank)

    def decide(self, lp: np.ndarray, room: int, guarded: bool) -> Step:
        """The step at one frame.

        Args:
            lp: (V',) float32 log-probabilities.
            room: T - t (>= 1); any value > R means "far from the end".
            guarded: ``max_sym_per_frame`` labels already stayed at this frame.
        """
        room = min(room, self.free_room)
        bs = self._blank_scores(lp).astype(np.float64)
        b_ok = self.blank_frames <= room
        m_ok = self.move_frames < room
        if guarded:
            m_ok = m_ok & (self.move_frames >= 1)
        if not b_ok.any() and not m_ok.any():
            b_ok = np.ones_like(b_ok)  # stuck: any blank, clipped at T
        neg = -np.inf
        bs = np.where(b_ok, bs, neg)
        bj = int(np.argmax(bs))
        if m_ok.any():
            lt = lp[self.label_tok]
            lk = int(np.argmax(lt))
            ms = np.where(m_ok, self._move_scores(lp).astype(np.float64), neg)
            mj = int(np.argmax(ms))
            if self.total:
                label = float(lt[lk]) + float(_logsumexp(ms))
            else:
                label = float(lt[lk]) + float(ms[mj])
        else:
            label = neg
        blank = float(_logsumexp(bs)) if self.total else float(bs[bj])
        if label > blank:
            frames = int(self.move_frames[mj])
            return Step(True, int(self.label_tok[lk]), frames, label)
        frames = min(int(self.blank_frames[bj]), room)
        return Step(False, int(self.blank_tok[bj]), frames, blank)
