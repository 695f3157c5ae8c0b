"""The duration lattice: one definition for the losses, the model and the searches.

Every transducer this package trains or decodes walks the same kind of lattice. A path
starts at node (t, u) = (0, 0) (frame t, u labels emitted) of an utterance with T
frames and L labels, and every step emits one symbol that moves it to (t + n, u) (a
blank) or (t + n, u + 1) (the next label), where n >= 0 is the number of frames the
symbol covers. The lattices differ only in which symbols exist and how many frames
each covers:

==============  ===========================  ==========================================
lattice         blank symbols (frames)       labels (frames)
==============  ===========================  ==========================================
standard RNN-T  ``blank`` (1)                every label (0)
multi-blank     ``blank`` (1), big blank i   every label (0)
                at ``blank - 1 - i`` (d_i)
TDT             ``blank`` with each duration every label, with each duration
                d >= 1 of the duration head  d >= 0 of the duration head
==============  ===========================  ==========================================

The end rule is the same for all of them (:func:`step_target`): a step from (t, u) that
lands at t' = t + n < T reaches node (t', u') and continues; a step that lands exactly
on t' = T ends the path, and only a blank emitted after the last label may do that;
any other step (overshooting T, or a label landing on T) leads nowhere.

This module is the single owner of these rules: the loss options and their validation,
the ESPnet model's configuration checks, the searches and the kernels' launch code are
built from :class:`MultiblankLattice` and :class:`TDTLattice`. The recursions, the
gradients and the conventions are written out in ``docs/lattice.md``.

Nothing here imports torch or ESPnet.
"""

import heapq
import itertools
import math
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Iterator, Optional, Sequence, Tuple

#: :func:`step_target` results
NODE, END, NOWHERE = "node", "end", "nowhere"


@dataclass(frozen=True)
class BlankArc:
    """A blank arc of a lattice, as the joint network's outputs score it.

    Attributes:
        token: The blank symbol's column among the token log-probabilities.
        slot: The duration output it takes (TDT), or None (its frames are the
            symbol's own: standard and big blanks).
        frames: Frames it covers (>= 1).
    """

    token: int
    slot: Optional[int]
    frames: int


@dataclass(frozen=True)
class LabelMove:
    """How a label arc may move: with duration output ``slot`` (TDT; None: the
    label's log-probability alone) over ``frames`` frames (0 keeps the frame)."""

    slot: Optional[int]
    frames: int


def step_target(t: int, frames: int, num_frames: int, is_blank: bool, last_row: bool):
    """Where a step from frame ``t`` that covers ``frames`` frames goes.

    Args:
        t: Current frame, ``0 <= t < num_frames``.
        frames: Frames the emitted symbol covers (>= 0; blanks >= 1).
        num_frames: T of the utterance.
        is_blank: Whether the symbol is a blank (standard, big, or a TDT blank).
        last_row: Whether every label has been emitted before this step (u == L).

    Returns:
        :data:`NODE` (lands on frame ``t + frames < T``), :data:`END` (a blank after
        the last label landing exactly on T: the path is complete) or
        :data:`NOWHERE`.
    """
    dest = t + frames
    if dest < num_frames:
        return NODE
    if dest == num_frames and is_blank and last_row:
        return END
    return NOWHERE


#: end rules a search may use: ``"exact"`` (the loss's, :func:`step_target`) and
#: ``"clip"`` (every arc allowed, one that reaches or passes T ends the path, as
#: NeMo's TDT greedy search does; a TDT's searches only)
END_RULES = ("exact", "clip")


class _SearchRules:
    """What a search asks a lattice (derived from its arcs; no lattice kind is
    tested outside this module)."""

    #: the end rules its searches support (see :data:`END_RULES`)
    end_rules: Tuple[str, ...] = ("exact",)

    def check_end_rule(self, end_rule: Any) -> str:
        """``end_rule`` if this lattice's searches support it, else ValueError."""
        if end_rule not in self.end_rules:
            raise ValueError(
                f"end_rule must be one of {self.end_rules}, got {end_rule!r}"
            )
        return end_rule

    @property
    def room_cap(self) -> int:
        """C: the frames left ``T - t`` past which the end rule allows the same arcs
        at t whatever T is: a blank covering d frames needs ``d <= T - t``, a label
        covering e frames ``e < T - t`` (standard and multi-blank: the longest
        blank R; TDT: R + 1). A search's step depends on T only through
        ``min(T - t, C)``."""
        blank = max(arc.frames for arc in self.blank_arcs)
        return max(blank, max(move.frames for move in self.label_moves) + 1)

    @property
    def labels_move(self) -> bool:
        """Whether a label arc may cover frames (TDT): then a label's child can land
        on the frame of another hypothesis's blank in one step."""
        return any(move.frames > 0 for move in self.label_moves)

    @property
    def factorised(self) -> bool:
        """Whether an arc's log-probability is a token's plus a duration's (TDT: the
        joint output is V token logits then D duration logits), rather than one
        symbol's of a single softmax."""
        return self.num_duration_outputs > 0

    def num_tokens(self, joint_size: int) -> int:
        """V: the token outputs among ``joint_size`` joint-network outputs."""
        return joint_size - self.num_duration_outputs


def decide_early(choices: Sequence[tuple], room: int):
    """A step a stream may take before T is known, or None.

    A stream has received N frames of an utterance whose T >= N is unknown; its
    step at frame t depends on T only through ``min(T - t, cap)``
    (:attr:`_SearchRules.room_cap`), which is one of ``room .. cap`` (``room = N -
    t``). The step is taken when every one of them chooses the same arc.

    Args:
        choices: The step's choice with ``min(T - t, cap) = r`` for r = ``room``,
            ``room + 1``, ..., ``cap``: each a tuple ``(arc..., score)`` whose last
            item is the score.
        room: ``N - t`` (< cap).

    Returns:
        ``(the first choice, {r: score})``, or None when the choices differ.
    """
    arc = choices[0][:-1]
    if any(option[:-1] != arc for option in choices[1:]):
        return None
    return choices[0], {room + i: option[-1] for i, option in enumerate(choices)}


def _as_int(name: str, value: Any) -> int:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy/torch scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name} must be an int, got {type(value).__name__} ({value!r})"
        )
    return int(value)


def _as_int_tuple(name: str, value: Any, what: str) -> Tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"{name} must be a list of {what}, got {type(value).__name__} ({value!r})"
        )
    if hasattr(value, "tolist"):  # numpy array / torch tensor
        value = value.tolist()
    out = tuple(_as_int(f"{name}[{i}]", d) for i, d in enumerate(value))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must be distinct {what}, got {list(out)}")
    return out


def check_big_blank_durations(
    value: Any, name: str = "big_blank_durations"
) -> Tuple[int, ...]:
    """Validate multi-blank durations: distinct ints >= 2, any order; ``None`` = ().

    Raises:
        TypeError / ValueError naming ``name`` and the expected value.
    """
    if value is None:
        return ()
    out = _as_int_tuple(name, value, "ints >= 2 (e.g. [2, 4, 8])")
    bad = [d for d in out if d < 2]
    if bad:
        raise ValueError(
            f"{name} must contain ints >= 2 (a big blank covers at least 2 frames; "
            f"the standard blank covers 1), got {list(out)}"
        )
    return out


def check_tdt_durations(value: Any, name: str = "durations") -> Tuple[int, ...]:
    """Validate TDT durations: distinct ints >= 0, any order, at least one >= 1.

    Raises:
        TypeError / ValueError naming ``name`` and the expected value.
    """
    if value is None:
        raise TypeError(
            f"{name} must be a list of distinct ints >= 0 with at least one >= 1 "
            "(e.g. [0, 1, 2, 3, 4]), got None"
        )
    out = _as_int_tuple(name, value, "ints >= 0 (e.g. [0, 1, 2, 3, 4])")
    if not out:
        raise ValueError(
            f"{name} must not be empty: a TDT needs durations, e.g. [0, 1, 2, 3, 4]"
        )
    if any(d < 0 for d in out):
        raise ValueError(f"{name} must contain ints >= 0, got {list(out)}")
    if max(out) < 1:
        raise ValueError(
            f"{name} must contain a value >= 1 (a blank never has duration 0, so "
            f"without one no path can advance), got {list(out)}"
        )
    return out


def big_blank_token(duration: int) -> str:
    """Token ESPnet's ``ASRTask`` inserts for a big blank: ``<blank{d}>``."""
    return f"<blank{int(duration)}>"


def _check_blank(blank: Any, name: str) -> int:
    blank = _as_int(name, blank)
    if blank < 0:
        raise ValueError(
            f"{name} must be an index >= 0 into the vocabulary, got {blank}"
        )
    return blank


@dataclass(frozen=True)
class MultiblankLattice(_SearchRules):
    """Standard / multi-blank RNN-T lattice.

    Attributes:
        blank: Index of the standard blank (covers 1 frame).
        big_blank_durations: ``(d_0, ..., d_{N-1})``; big blank ``i`` has index
            ``blank - 1 - i`` and covers ``d_i`` frames. ``()``: standard RNN-T.

    Construct with :meth:`create` to validate (with argument names in the errors).
    """

    blank: int
    big_blank_durations: Tuple[int, ...] = ()

    kind = "multiblank"

    @classmethod
    def create(
        cls,
        blank: Any,
        big_blank_durations: Any = (),
        blank_name: str = "blank",
        durations_name: str = "big_blank_durations",
    ) -> "MultiblankLattice":
        blank = _check_blank(blank, blank_name)
        durations = check_big_blank_durations(big_blank_durations, durations_name)
        if blank - len(durations) < 0:
            raise ValueError(
                f"big blank i has index {blank_name} - 1 - i, so {blank_name} must be "
                f">= len({durations_name}) = {len(durations)}; got {blank_name} = "
                f"{blank} (ESPnet puts the <blank{{d}}> tokens before <blank> in the "
                "token list)"
            )
        return cls(blank, durations)

    @property
    def num_big_blanks(self) -> int:
        return len(self.big_blank_durations)

    @property
    def is_multiblank(self) -> bool:
        return bool(self.big_blank_durations)

    @property
    def big_blank_ids(self) -> Tuple[int, ...]:
        """Index of big blank ``i``: ``blank - 1 - i``."""
        return tuple(self.blank - 1 - i for i in range(self.num_big_blanks))

    @property
    def blank_ids(self) -> Tuple[int, ...]:
        """Every blank symbol: the standard blank first, then big blank 0, 1, ..."""
        return (self.blank,) + self.big_blank_ids

    @property
    def blank_moves(self) -> Tuple[Tuple[int, int], ...]:
        """``((symbol, frames), ...)`` of every blank: standard first, then big."""
        return ((self.blank, 1),) + tuple(
            zip(self.big_blank_ids, self.big_blank_durations)
        )

    @property
    def max_frames(self) -> int:
        """The most frames one symbol covers."""
        return max(self.big_blank_durations, default=1)

    @property
    def num_duration_outputs(self) -> int:
        """Duration outputs after the token outputs of the joint network: none."""
        return 0

    @property
    def blank_arcs(self) -> Tuple[BlankArc, ...]:
        """Every blank arc: the standard blank (1 frame), then big blank i."""
        return tuple(BlankArc(k, None, n) for k, n in self.blank_moves)

    @property
    def label_moves(self) -> Tuple[LabelMove, ...]:
        """A label keeps its frame, scored by its log-probability alone."""
        return (LabelMove(None, 0),)

    def frames(self, symbol: int) -> int:
        """Frames covered by ``symbol`` (0 for a label)."""
        if symbol == self.blank:
            return 1
        i = self.blank - 1 - symbol
        if 0 <= i < self.num_big_blanks:
            return self.big_blank_durations[i]
        return 0

    def is_blank(self, symbol: int) -> bool:
        return self.frames(symbol) > 0

    def check_vocab_size(self, vocab_size: int, name: str = "vocab_size") -> None:
        """Raise ValueError unless every blank index fits a vocabulary of that size."""
        if not self.blank < vocab_size:
            raise ValueError(
                f"blank must be < the vocabulary size {name} = {vocab_size}, got "
                f"{self.blank}"
            )

    def token_layout(self, sym_blank: str = "<blank>") -> Tuple[Tuple[int, str], ...]:
        """``((index, token), ...)`` the blanks must have in an ESPnet token list:
        ``sym_blank`` at ``blank`` and ``<blank{d_i}>`` at ``blank - 1 - i``."""
        return ((self.blank, sym_blank),) + tuple(
            (k, big_blank_token(d))
            for k, d in zip(self.big_blank_ids, self.big_blank_durations)
        )


@dataclass(frozen=True)
class TDTLattice(_SearchRules):
    """Token-and-duration transducer lattice (Xu et al., ICML 2023).

    The joint network outputs ``V`` token logits followed by ``D = len(durations)``
    duration logits; an arc's log-probability is the token's plus the duration's.
    Labels take any duration (0 keeps the frame); the blank takes only durations >= 1.

    Attributes:
        blank: Index of the blank among the V token logits.
        durations: ``(e_0, ..., e_{D-1})``, distinct ints >= 0 with at least one >= 1,
            in any order; duration logit ``j`` means "covers ``e_j`` frames".
    """

    blank: int
    durations: Tuple[int, ...]

    kind = "tdt"
    end_rules = END_RULES

    @classmethod
    def create(
        cls,
        blank: Any,
        durations: Any,
        blank_name: str = "blank",
        durations_name: str = "durations",
    ) -> "TDTLattice":
        return cls(
            _check_blank(blank, blank_name),
            check_tdt_durations(durations, durations_name),
        )

    @property
    def num_durations(self) -> int:
        return len(self.durations)

    @property
    def blank_ids(self) -> Tuple[int, ...]:
        return (self.blank,)

    @property
    def max_frames(self) -> int:
        return max(self.durations)

    @property
    def num_duration_outputs(self) -> int:
        """D: the duration outputs after the V token outputs."""
        return len(self.durations)

    @property
    def blank_arcs(self) -> Tuple[BlankArc, ...]:
        """The blank with each duration >= 1 (a blank never keeps its frame)."""
        return tuple(
            BlankArc(self.blank, j, e) for j, e in enumerate(self.durations) if e >= 1
        )

    @property
    def label_moves(self) -> Tuple[LabelMove, ...]:
        """A label takes any duration, 0 included."""
        return tuple(LabelMove(j, e) for j, e in enumerate(self.durations))

    def is_blank(self, symbol: int) -> bool:
        return symbol == self.blank

    def check_vocab_size(self, vocab_size: int, name: str = "vocab_size") -> None:
        """``vocab_size`` = V + D (the joint output); V >= 1 token logit needed."""
        V = vocab_size - self.num_durations
        if V < 1 or not self.blank < V:
            raise ValueError(
                f"{name} = {vocab_size} must be V + D with D = len(durations) = "
                f"{self.num_durations} duration logits after V token logits, and the "
                f"blank ({self.blank}) must be < V = {V}"
            )


#: every lattice kind: what a search decodes and :func:`move_frames` reads
LATTICE_KINDS = (MultiblankLattice, TDTLattice)


def is_lattice(value: Any) -> bool:
    """Whether ``value`` is a lattice of this module (of any kind): the one place
    outside the lattice classes that tells a lattice from anything else."""
    return isinstance(value, LATTICE_KINDS)


def lattice_from_config(
    blank: int,
    big_blank_durations: Optional[Sequence[int]] = None,
    tdt_durations: Optional[Sequence[int]] = None,
    big_blank_name: str = "big_blank_durations",
    tdt_name: str = "tdt_durations",
):
    """The lattice a model configuration asks for (multi-blank/standard or TDT).

    Raises:
        ValueError naming both keys when both big blanks and TDT durations are set.
    """
    big = check_big_blank_durations(big_blank_durations, big_blank_name)
    if tdt_durations is not None and len(tdt_durations) > 0:
        if big:
            raise ValueError(
                f"{big_blank_name} and {tdt_name} cannot both be set: a TDT's blank "
                "already covers several frames (choose big blanks OR TDT durations)"
            )
        return TDTLattice.create(blank, tdt_durations, durations_name=tdt_name)
    return MultiblankLattice.create(blank, big, durations_name=big_blank_name)


# ---------------------------------------------------------------------------
# Which (frames, labels) pairs have a path at all
#
# A complete path is a sequence of blank moves (at least one: the last step) and
# exactly L label moves whose frames add up to T; every order of the moves that ends
# with a blank is a valid path (the end rule only forbids a label landing on T, and a
# path that ends with a blank of >= 1 frame visits frames < T only). So whether an
# utterance of T frames and L labels has a path depends only on the frames each kind
# of move may cover, not on their order.


def move_frames(lattice) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """``(blank_frames, label_frames)``: the frames a blank move and a label move of
    ``lattice`` may cover (distinct, ascending).

    Standard / multi-blank: blanks cover 1 or ``d_i`` frames, labels 0. TDT: blanks
    take the durations >= 1, labels every duration (0 keeps the frame).
    """
    if not is_lattice(lattice):
        raise TypeError(
            f"lattice must be a MultiblankLattice or a TDTLattice, got "
            f"{type(lattice).__name__}"
        )
    blank = tuple(sorted({arc.frames for arc in lattice.blank_arcs}))
    return blank, tuple(sorted({move.frames for move in lattice.label_moves}))


@dataclass(frozen=True)
class ReachableLengths:
    """The encoder lengths T >= 1 that some complete path of a lattice fits (with a
    suitable number of labels), and the ones no path fits.

    The reachable lengths are the sums of one blank move and any number of blank and
    label moves: only multiples of ``period`` (the gcd of the frames the moves cover)
    are reachable, and among those all but finitely many (the semigroup they
    generate has finitely many gaps). Built by :func:`reachable_lengths`.

    Attributes:
        period: g = gcd of the frames of every blank and label move; a T that is not
            a multiple of g is never reachable (g = 1: no such restriction).
        smallest: ``smallest[r]`` is the smallest reachable T / g that is congruent
            to r modulo ``len(smallest)`` (the fewest frames / g that a move covers):
            a multiple T of g is reachable exactly when T / g >= smallest[(T / g) %
            len(smallest)], because adding that move to a path keeps it complete.
    """

    period: int
    smallest: Tuple[int, ...]

    def __contains__(self, num_frames: int) -> bool:
        """Whether an utterance of ``num_frames`` (>= 1) frames can have a path."""
        if num_frames < 1 or num_frames % self.period:
            return False
        n = num_frames // self.period
        return n >= self.smallest[n % len(self.smallest)]

    @property
    def all_reachable(self) -> bool:
        """True when every T >= 1 has a path (standard, multi-blank, TDT with 1)."""
        return self.period == 1 and not self.gap_count

    @property
    def gap_count(self) -> int:
        """How many multiples of ``period`` (>= 1) cannot be reached."""
        step = len(self.smallest)
        return sum(len(range(r or step, m, step)) for r, m in enumerate(self.smallest))

    def gaps(self) -> Iterator[int]:
        """The multiples of ``period`` (>= 1) that cannot be reached, ascending (a
        finite sequence: every larger multiple is reachable; generated lazily, one
        arithmetic progression per residue merged)."""
        step = len(self.smallest)
        runs = (range(r or step, m, step) for r, m in enumerate(self.smallest))
        return (n * self.period for n in heapq.merge(*runs))

    def describe(self, max_listed: int = 8) -> str:
        """The unreachable lengths in words, e.g. ``"every T that is not a multiple
        of 2 (T = 1, 3, 5, ...)"``, ``"T = 1, 2, 4, 7"`` or both; ``"none"``."""
        parts = []
        if self.period > 1:
            first = ", ".join(
                str(t) for t in range(1, 2 * self.period + 2) if t % self.period
            )
            parts.append(
                f"every T that is not a multiple of {self.period} (T = {first}, ...)"
            )
        count = self.gap_count
        if count:
            listed = [str(t) for t in itertools.islice(self.gaps(), max_listed)]
            if count > max_listed:
                largest = (max(self.smallest) - len(self.smallest)) * self.period
                listed.append(f"... ({count} lengths, the largest {largest})")
            parts.append("T = " + ", ".join(listed))
        return " and ".join(parts) or "none"


def reachable_lengths(lattice) -> ReachableLengths:
    """The encoder lengths T >= 1 for which ``lattice`` has a complete path.

    Examples: every T for the standard and multi-blank lattices (the standard blank
    covers 1 frame) and for a TDT with duration 1; TDT durations [0, 2, 4]: the even
    T only; [0, 3, 5]: all but T = 1, 2, 4, 7; [2, 3]: all but T = 1.

    Returns:
        :class:`ReachableLengths` (cheap to build: a shortest-path search over
        ``min(frames) / g`` residues).
    """
    blank_frames, label_frames = move_frames(lattice)
    moves = sorted(set(blank_frames) | {d for d in label_frames if d > 0})
    period = 0
    for d in moves:
        period = math.gcd(period, d)
    moves = [d // period for d in moves]
    step = moves[0]
    # Dijkstra over residues mod `step`: a path starts with one blank move (any
    # order of the moves gives a complete path), then adds any moves.
    inf = math.inf
    smallest = [inf] * step
    heap = []
    for d in blank_frames:
        n = d // period
        if n < smallest[n % step]:
            smallest[n % step] = n
            heapq.heappush(heap, (n, n % step))
    while heap:
        n, r = heapq.heappop(heap)
        if n > smallest[r]:
            continue
        for d in moves:
            m = n + d
            if m < smallest[m % step]:
                smallest[m % step] = m
                heapq.heappush(heap, (m, m % step))
    return ReachableLengths(period, tuple(int(m) for m in smallest))


def max_labels(lattice, num_frames: int) -> Optional[int]:
    """The most labels an utterance of ``num_frames`` frames can have a path with.

    Every smaller number of labels has a path too. ``None``: no limit (a label may
    keep its frame: standard, multi-blank, TDT with duration 0, and ``num_frames`` is
    reachable). ``-1``: no number of labels works (``num_frames`` is not reachable,
    see :func:`reachable_lengths`). ``num_frames = 0``: 0 (only the empty utterance,
    whose cost is 0, has a path).

    Without duration 0 each label covers at least ``min(durations)`` frames and the
    path needs a final blank, so ``L <= (T - min) / min``; the exact limit comes from a
    dynamic programme over the frames (O(T * D)).
    """
    num_frames = _as_int("num_frames", num_frames)
    if num_frames < 0:
        raise ValueError(f"num_frames must be >= 0, got {num_frames}")
    if num_frames == 0:
        return 0
    blank_frames, label_frames = move_frames(lattice)
    if 0 in label_frames:
        return None if num_frames in reachable_lengths(lattice) else -1
    # most labels in a split of n frames into label moves only (no_blank) or into
    # label moves and at least one blank move (with_blank); -1 = no split
    no_blank = [-1] * (num_frames + 1)
    with_blank = [-1] * (num_frames + 1)
    no_blank[0] = 0
    for n in range(1, num_frames + 1):
        best = -1
        for d in label_frames:
            if d <= n and no_blank[n - d] >= 0:
                best = max(best, no_blank[n - d] + 1)
        no_blank[n] = best
        best = -1
        for d in blank_frames:
            if d <= n:
                best = max(best, no_blank[n - d], with_blank[n - d])
        for d in label_frames:
            if d <= n and with_blank[n - d] >= 0:
                best = max(best, with_blank[n - d] + 1)
        with_blank[n] = best
    return with_blank[num_frames]


def has_path(lattice, num_frames: int, num_labels: int) -> bool:
    """Whether an utterance of ``num_frames`` frames and ``num_labels`` labels has a
    complete path in ``lattice`` (its loss is finite), from the lengths alone."""
    num_labels = _as_int("num_labels", num_labels)
    if num_labels < 0:
        raise ValueError(f"num_labels must be >= 0, got {num_labels}")
    limit = max_labels(lattice, num_frames)
    return limit is None or num_labels <= limit
