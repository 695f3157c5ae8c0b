"""The greedy step of every lattice, on one row of the joint network's
log-probabilities (plain Python: a step decides among a few dozen numbers, where
NumPy's per-call cost would dominate).

A greedy hypothesis at frame t of an utterance with T frames, having emitted g labels
at t, takes one arc of the lattice (:mod:`espnet_multiblank.lattice`: its
``blank_arcs`` and ``label_moves``, one description for standard, multi-blank and
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
* ``"symbol"``: the most probable allowed arc (a tie goes to the blanks);
* ``"nemo"``: NeMo's and sherpa-onnx's greedy rule, to compare with them: the most
  probable token, and for a TDT its most probable duration, with no end rule (an
  arc past T ends the hypothesis), a blank of duration 0 moved by one frame, and
  the ``max_sym_per_frame``-th label in a row at one frame moved by one frame
  (sherpa-onnx's ``max_tokens_per_frame``, 5); a standard RNN-T takes the most
  probable symbol with at most ``max_sym_per_frame`` labels per frame (sherpa-onnx:
  10). Not for multi-blank models.

The decision depends on T only through ``room = T - t`` up to R + 1 (R: the longest
arc), so :meth:`StepRule.decide` takes ``min(T - t, R + 1)``.
"""

import math
from typing import List, NamedTuple

#: ``blank_decision`` values
BLANK_DECISIONS = ("total", "symbol", "nemo")

_NEG = -math.inf


class Step(NamedTuple):
    """One greedy step: ``is_label``, ``symbol`` (token id), ``frames`` moved,
    ``score`` (the decision's score: see the module docstring)."""

    is_label: bool
    symbol: int
    frames: int
    score: float


def log_sum_exp(values: List[float]) -> float:
    """log(sum(exp(values))) of a short list (-inf when all are -inf or empty)."""
    top = max(values, default=_NEG)
    if top == _NEG:
        return _NEG
    return top + math.log(sum([math.exp(v - top) for v in values]))


def _best(values: List[float]) -> int:
    """Index of the first largest value."""
    return max(range(len(values)), key=values.__getitem__)


class StepRule:
    """The greedy decision of a lattice (module docstring).

    Args:
        lattice: A ``MultiblankLattice`` or ``TDTLattice``.
        joint_size: V', the joint network's outputs.
        blank_decision: ``"total"`` or ``"symbol"``.
        max_sym: Labels that may stay at one frame (``max_sym_per_frame``, >= 1).
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
        self.nemo = blank_decision == "nemo" and lattice.num_duration_outputs > 0
        if blank_decision == "nemo" and getattr(lattice, "big_blank_durations", ()):
            raise ValueError(
                "blank_decision 'nemo' (NeMo's and sherpa-onnx's rule) is for standard "
                "and TDT models; a multi-blank model takes 'total' or 'symbol'"
            )
        self.max_sym = max_sym
        self.V = joint_size - lattice.num_duration_outputs
        self.durations = list(getattr(lattice, "durations", ()))
        self.blank = lattice.blank
        V = joint_size - lattice.num_duration_outputs
        blank_ids = set(lattice.blank_ids)
        #: per blank arc: (token column, duration column or None, frames)
        self.blank_arcs = [
            (a.token, None if a.slot is None else V + a.slot, a.frames)
            for a in lattice.blank_arcs
        ]
        #: per label move: (duration column or None, frames)
        self.moves = [
            (None if m.slot is None else V + m.slot, m.frames)
            for m in lattice.label_moves
        ]
        self.labels = [k for k in range(V) if k not in blank_ids]
        self.R = lattice.max_frames
        #: rooms from which on no end-rule mask applies
        self.free_room = self.R + 1
        # the arcs allowed by (room, guarded), as index lists: computed once
        self._allowed = {}
        for room in range(1, self.free_room + 1):
            for guarded in (False, True):
                blanks = [i for i, a in enumerate(self.blank_arcs) if a[2] <= room]
                moves = [
                    i
                    for i, (_, n) in enumerate(self.moves)
                    if n < room and (n >= 1 or not guarded)
                ]
                if not blanks and not moves:  # stuck: any blank, clipped at T
                    blanks = list(range(len(self.blank_arcs)))
                self._allowed[room, guarded] = (blanks, moves)

    def decide(self, row: List[float], room: int, num_sym: int) -> Step:
        """The step at one frame.

        Args:
            row: The V' log-probabilities of the frame (a Python list).
            room: T - t (>= 1); values above R mean "far from the end".
            num_sym: Labels already emitted at this frame.
        """
        if self.nemo:
            return self._nemo(row, room, num_sym)
        guarded = num_sym >= self.max_sym
        room = min(room, self.free_room)
        blanks, moves = self._allowed[room, guarded]
        arcs = self.blank_arcs
        bs = [
            row[arcs[i][0]] + (0.0 if arcs[i][1] is None else row[arcs[i][1]])
            for i in blanks
        ]
        blank = _NEG
        if bs:  # (none fits only where a label does: a TDT without duration 1)
            bj = _best(bs)
            blank = log_sum_exp(bs) if self.total else bs[bj]
        label = _NEG
        if moves:
            labels = self.labels
            lk = max(labels, key=row.__getitem__)
            ms = [
                0.0 if self.moves[i][0] is None else row[self.moves[i][0]]
                for i in moves
            ]
            mj = _best(ms)
            label = row[lk] + (log_sum_exp(ms) if self.total else ms[mj])
        if label > blank:
            return Step(True, lk, self.moves[moves[mj]][1], label)
        arc = arcs[blanks[bj]]
        return Step(False, arc[0], min(arc[2], room), blank)

    def _nemo(self, row: List[float], room: int, num_sym: int) -> Step:
        """NeMo's / sherpa-onnx's TDT step (module docstring): the first most
        probable token and duration, each on its own."""
        V = self.V
        y = _best(row[:V])
        j = _best(row[V:])
        frames = self.durations[j]
        score = row[y] + row[V + j]
        if y != self.blank:
            if frames == 0 and num_sym + 1 >= self.max_sym:
                frames = 1
            return Step(True, y, min(frames, room), score)  # past T: the end
        return Step(False, y, min(max(frames, 1), room), score)
