"""The symbol tables: a lattice's arcs as tensors on one device, which arcs a search
allows, how their scores are read from the joint network and how a step chooses.

Every search asks its table
(:meth:`~espnet_multiblank.decoding.base.TransducerSearch.table`) through one
interface:

* ``step_scores(stepper, nodes)``: the joint network's scores of A rows at their
  nodes (:class:`RowNodes`);
* ``best_arcs(scores, nodes, max_sym, decision)``: the greedy arc of each row;
  ``beam_candidates(scores, nodes, max_sym, decision)``: every candidate arc of each
  row (both :class:`Arcs`);
* ``one_outputs`` / ``one_choice``: the same step for one row in Python floats (the
  one-utterance greedy loop), and ``early_choice``: a stream's step before T is known
  (:func:`early_choice`; the one-softmax table settles most steps from the widest
  room's choice alone);
* ``arc_log_probs`` / ``blank_weights`` / ``label_weights`` (with ``labels``,
  ``blank_d``, ``label_d``): the arcs as columns of the joint network's outputs, for
  a search that scores every frame of a prefix at once (the label-synchronous beam);
* ``max_frames``: the longest arc.

The rows a step reads (:class:`RowNodes`) and the arcs it returns (:class:`Arcs`) are
one type each for every lattice and search.

:class:`SymbolTable` serves the lattices scored by one softmax over the symbols
(standard and multi-blank), :class:`TDTSymbolTable` the token-and-duration
transducers (a token softmax and a duration softmax).

Standard and multi-blank lattices
---------------------------------

Built from :class:`espnet_multiblank.lattice.MultiblankLattice` (the owner of the
symbol rules): the standard blank covers 1 frame, big blank ``i`` (index
``blank - 1 - i``) covers ``d_i`` frames, every other symbol is a label (0 frames).

Blank decisions (``docs/decoding.md``, "Blank or label"):

* ``"total"``: a step is a blank when the allowed blanks together are at least as
  probable as the best label, and then the most probable allowed blank; its score is
  the blanks' total log-probability. A multi-blank model spreads the blank mass over
  several durations, so a label can beat every single blank while the blanks
  together beat the label; the arg-max over symbols then emits that label (most often
  a repeated or extra last word).
* ``"symbol"``: the arg-max over all allowed symbols, scored with that symbol's
  log-probability (the paper's and ESPnet's greedy rule): scores are lattice path
  log-probabilities.

Token-and-duration transducers
------------------------------

Built from :class:`espnet_multiblank.lattice.TDTLattice` (the owner of the rules): the
joint network outputs ``V`` token logits (the blank at ``blank``) followed by
``D = len(durations)`` duration logits; an arc emits a token *and* a duration ``e``,
with log-probability ``tok[k] + dur[j] = log_softmax(z[:V])[k] +
log_softmax(z[V:])[j]``. A blank takes only durations >= 1; a label takes any (0 keeps
the frame). The searches add (``docs/decoding.md``, "TDT searches"):

* **end rule** (the lattice's, as for big blanks): from frame t of an utterance with T
  frames, a blank may take ``e <= T - t`` (landing on T completes the hypothesis) and
  a label ``e < T - t`` (a label never lands on T: a blank must end the path). Only
  when a duration set without 1 leaves no allowed arc at all does the most probable
  blank take a longer duration; it then ends the hypothesis (clipped at T).
* **guard**: once ``max_sym_per_frame`` labels stayed at one frame (duration 0), a
  label must take a duration >= 1 there.
* **decision** (``blank_decision``): ``"total"``: every token counts with the total
  probability of its allowed durations (``tok[k] + logsumexp(dur[allowed])``); the
  most probable token is emitted with its most probable allowed duration, and the step
  scores that total. ``"symbol"``: the most probable allowed arc, scored with its own
  log-probability (scores are lattice path log-probabilities).
"""

import math
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from espnet_multiblank.lattice import (
    MultiblankLattice,
    TDTLattice,
    decide_early,
)


class RowNodes(NamedTuple):
    """A rows at their lattice nodes: what a step (greedy or beam) reads there.

    A node (t, y) fixes the joint network's inputs (encoder frame t, prediction
    output after y) and, with T and the labels emitted at t, the arcs allowed.

    Attributes:
        enc_proj, dec_proj: (A, J) projected encoder frame and prediction output.
        frame: (A,) long, t of each row (rows with ``t >= length`` are past their
            end: their arcs are to be ignored).
        length: (A,) long, T of each row.
        num_sym: (A,) long, labels already emitted at ``frame``.
        lm_labels: (A, V) float32 weighted LM scores of every token as the next
            label (0 at the blanks), or None without an LM.
    """

    enc_proj: torch.Tensor
    dec_proj: torch.Tensor
    frame: torch.Tensor
    length: torch.Tensor
    num_sym: torch.Tensor
    lm_labels: Optional[torch.Tensor] = None


class Arcs(NamedTuple):
    """Arcs leaving the rows' nodes: what each emits and how far it moves.

    A greedy step has one arc per row (shapes (A,), the tables' ``best_arcs``); a
    beam expansion N candidates per row (shapes (A, N), ``beam_candidates``).

    Attributes:
        symbol: long, the emitted symbol (a label or a blank).
        frames: long, frames the arc moves on (0: a label that stays), never past
            the utterance's last frame (for rows inside their utterance).
        score: float32, the arc's score (``blank_decision``; with an LM, the fused
            score); a candidate that is not allowed scores -inf.
        is_label: bool.
    """

    symbol: torch.Tensor
    frames: torch.Tensor
    score: torch.Tensor
    is_label: torch.Tensor

    def where(self, mask: torch.Tensor, other: "Arcs") -> "Arcs":
        """``self`` in the rows of ``mask`` ((A,) bool), ``other`` elsewhere."""
        return Arcs(*(torch.where(mask, a, b) for a, b in zip(self, other)))


#: a TDT's step scores: (A, V) token and (A, D) duration log-probabilities
TDTScores = Tuple[torch.Tensor, torch.Tensor]

#: ``blank_decision`` values (module docstring)
BLANK_DECISIONS = ("total", "symbol")


def check_blank_decision(value) -> str:
    if value not in BLANK_DECISIONS:
        raise ValueError(
            f"blank_decision must be one of {list(BLANK_DECISIONS)}, got {value!r}"
        )
    return value


def log_sum_exp(values: List[float]) -> float:
    """log(sum(exp(values))) of a short Python list (-inf when all are -inf)."""
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum([math.exp(v - top) for v in values]))


NEG = float("-inf")


def _columns(cols: List[int], device: torch.device):
    """An index for the last dimension: a slice when ``cols`` are consecutive (a
    view, which saves a copy of a (rows, frames, columns) tensor per step), else a
    (len,) long tensor (a gather)."""
    if cols and cols == list(range(cols[0], cols[0] + len(cols))):
        return slice(cols[0], cols[0] + len(cols))
    return torch.tensor(cols, dtype=torch.long, device=device)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    """``torch.log_softmax(x, -1)``. On the CPU, with fewer than 16 columns (the
    recipe's vocabularies, a TDT's durations) torch's kernel takes a slow path, 4-8
    times slower than ``x - logsumexp(x)`` (the same max-shifted sum; bench/RESULTS.md).
    """
    if x.device.type == "cpu" and x.size(-1) < 16:
        return x - torch.logsumexp(x, -1, keepdim=True)
    return torch.log_softmax(x, -1)


def _arc_columns(table, lattice, num_tokens: int, device: torch.device) -> None:
    """The attributes both tables give the searches that score every frame of a
    prefix at once (the label-synchronous beam): ``labels`` (L,) long, the label
    symbols, and ``label_cols`` (their columns, :func:`_columns`); ``blank_d`` (NB,)
    and ``label_d`` (NL,) long (host), the frames each blank arc and each label move
    covers; ``labels_move`` (the lattice's)."""
    blanks = set(lattice.blank_ids)
    labels = [k for k in range(num_tokens) if k not in blanks]
    table.labels = torch.tensor(labels, dtype=torch.long, device=device)
    table.label_cols = _columns(labels, device)
    arcs = lattice.blank_arcs
    table.blank_d = torch.tensor([arc.frames for arc in arcs], dtype=torch.long)
    table.label_d = torch.tensor(
        [move.frames for move in lattice.label_moves], dtype=torch.long
    )
    table.labels_move = lattice.labels_move


class SymbolTable:
    """Frames covered by each symbol, as tensors on one device, and the masks.

    Serves every lattice scored by one softmax over its symbols (no duration
    outputs): its blanks are ``lattice.blank_arcs`` (contiguous indices, the
    multi-blank layout) and every other symbol is a label with the lattice's one
    ``label_moves`` entry (standard and multi-blank: 0 frames; a lattice whose labels
    cover e >= 1 frames never lets a label land on T).

    Args:
        lattice: The lattice.
        vocab_size: V, the joint network's output size.
        device: Where the tensors live.
        end_rule: ``"exact"``, the lattice's (the only one it supports).

    Attributes:
        frames: (V,) long, frames covered by each symbol (labels: the lattice's
            label move, 0 for standard and multi-blank); ``frames_list`` is the same
            as a Python list.
        is_label: (V,) bool; ``is_label_list`` as a Python list.
        symbols: (V,) long, ``0 .. V - 1``.
        blank_index: (N + 1,) long, every blank: the standard blank, then big blank
            0, 1, ...; ``blank_index_list`` as a Python list.
        blank_range: ``(lo, hi)``: the blanks are the indices ``lo .. hi - 1``.
        big_ids: (N,) long, index of big blank i.
        durations: (N,) long, d_i.
        max_frames: The most frames one symbol covers.
        room_cap: C, the lattice's ``room_cap``: the frames left ``T - t`` past which
            every arc is allowed (the masks' rows).
        mask_rows: (2 (C + 1), V) float32 additive masks, 0 where an arc is allowed
            and -inf where not: row ``g (C + 1) + r`` for a node whose guard is ``g``
            (``max_sym_per_frame`` labels stayed at its frame) with ``min(T - t, C)
            = r`` (:meth:`_build_masks`).
        allowed_lists: The same as Python lists of allowed (True) symbols when each
            room's allowed symbols hold the smaller room's (the arcs need only fit
            in the frames left), else None.
    """

    def __init__(
        self,
        lattice: MultiblankLattice,
        vocab_size: int,
        device: torch.device,
        end_rule: str = "exact",
    ):
        lattice.check_vocab_size(vocab_size)
        lattice.check_end_rule(end_rule)
        self.lattice = lattice
        self.vocab_size = vocab_size
        moves = lattice.label_moves
        if len(moves) != 1 or moves[0].slot is not None:
            raise ValueError(
                "SymbolTable scores lattices with one softmax over the symbols: one "
                f"label move without a duration output, got {moves}"
            )
        self.label_frames = moves[0].frames
        self.frames = torch.full(
            (vocab_size,), self.label_frames, dtype=torch.long, device=device
        )
        self.is_label = torch.ones(vocab_size, dtype=torch.bool, device=device)
        self.symbols = torch.arange(vocab_size, device=device)
        for arc in lattice.blank_arcs:
            self.frames[arc.token] = arc.frames
            self.is_label[arc.token] = False
        self.big_ids = torch.tensor(
            lattice.big_blank_ids, dtype=torch.long, device=device
        )
        self.durations = torch.tensor(
            lattice.big_blank_durations, dtype=torch.long, device=device
        )
        self.is_label_list: List[bool] = self.is_label.tolist()
        self.frames_list: List[int] = self.frames.tolist()
        self.max_frames = lattice.max_frames
        self.room_cap = lattice.room_cap
        self.blank_index = torch.tensor(
            lattice.blank_ids, dtype=torch.long, device=device
        )
        self.blank_index_list: List[int] = list(lattice.blank_ids)
        # the blanks are the contiguous indices blank - N .. blank
        self.blank_range = (lattice.blank - lattice.num_big_blanks, lattice.blank + 1)
        self._row_arcs: Dict[int, List[torch.Tensor]] = {}
        self.num_tokens = vocab_size
        self._build_masks(device)
        _arc_columns(self, lattice, vocab_size, device)
        self._blank_cols = _columns([arc.token for arc in lattice.blank_arcs], device)

    def _build_masks(self, device: torch.device) -> None:
        """The arcs a search may take at a node, as :attr:`mask_rows` and
        :attr:`allowed_lists`.

        Not allowed: labels once ``max_sym_per_frame`` labels stayed at the frame
        (the guard), big blank ``i`` where ``t + d_i > T`` (a path ends exactly on
        T, as in the loss) and, where labels cover e >= 1 frames, labels where ``t
        + e >= T`` (a blank ends a path). The standard blank is always allowed. So a
        node's mask depends only on the guard and on ``min(T - t, C)``.
        """
        C = self.room_cap
        left = torch.arange(C + 1, device=device).repeat(2).unsqueeze(1)  # T - t
        guard = torch.arange(2 * (C + 1), device=device).unsqueeze(1) > C
        bad = guard & self.is_label
        bad[:, self.big_ids] |= self.durations > left
        if self.label_frames:
            bad |= self.is_label & (left <= self.label_frames)
        self.mask_rows = torch.zeros(bad.shape, device=device).masked_fill(
            bad, float("-inf")
        )
        rows = (~bad).tolist()
        nested = all(  # each room's allowed symbols hold the smaller room's
            all(b or not a for a, b in zip(rows[g + r], rows[g + r + 1]))
            for g in (0, C + 1)
            for r in range(1, C)
        )
        self.allowed_lists = rows if nested else None

    def blank_total(self, masked: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Total log-probability of the allowed blanks and the most probable one.

        Args:
            masked: (A, V) log-probabilities, disallowed symbols at -inf.

        Returns:
            (A,) log-sum-exp over the blanks, (A,) long index of the best blank.
        """
        blanks = masked[:, self.blank_index]  # (A, N + 1)
        return torch.logsumexp(blanks, -1), self.blank_index[blanks.argmax(-1)]

    def decide(
        self, logp: torch.Tensor, masked: torch.Tensor, blank_decision: str
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The symbol each row emits, and its score (module docstring).

        Args:
            logp: (A, V) log-probabilities.
            masked: (A, V) the same with disallowed symbols at -inf.
            blank_decision: ``"total"`` or ``"symbol"``.

        Returns:
            (A,) long symbols, (A,) their scores (``logp``'s dtype).
        """
        k = masked.argmax(dim=-1)
        if blank_decision == "symbol":
            return k, logp.gather(1, k.unsqueeze(1)).squeeze(1)
        total, best_blank = self.blank_total(masked)
        label_lp = logp.gather(1, k.unsqueeze(1)).squeeze(1)
        is_label = self.is_label[k] & (label_lp > total)
        k = torch.where(is_label, k, best_blank)
        return k, torch.where(is_label, label_lp, total)

    def step_scores(self, stepper, nodes: RowNodes) -> torch.Tensor:
        """What :meth:`best_arcs` and :meth:`beam_candidates` choose from: (A, V)
        float32 log-softmax of the joint network (``stepper``) at the rows' nodes,
        plus their ``lm_labels``."""
        logp = stepper.log_probs(nodes.enc_proj, nodes.dec_proj)  # (A, V) float32
        if nodes.lm_labels is not None:
            logp = logp + nodes.lm_labels
        return logp

    def _masked(self, logp: torch.Tensor, nodes: RowNodes, max_sym: int):
        """``logp`` with the symbols not allowed at the rows' nodes at -inf
        (:attr:`mask_rows`)."""
        R = self.room_cap
        guard = nodes.num_sym >= max_sym
        which = (nodes.length - nodes.frame).clamp_(0, R).add_(guard, alpha=R + 1)
        return logp + self.mask_rows[which]

    def beam_candidates(
        self, logp: torch.Tensor, nodes: RowNodes, max_sym: int, blank_decision: str
    ) -> Arcs:
        """Every candidate arc of each row (beam search), N = V, one per symbol: the
        masked scores (:attr:`mask_rows`); with ``"total"`` the blanks are replaced by
        one candidate, the most probable allowed blank scored with the allowed
        blanks' total. Arguments as for :meth:`best_arcs` (``frame < length``).

        Returns:
            (A, V) :class:`Arcs`, ``score`` -inf where not allowed.
        """
        scores = self._masked(logp, nodes, max_sym)
        if blank_decision == "total":  # one blank candidate per hypothesis
            total, best_blank = self.blank_total(scores)
            scores = scores.index_fill(1, self.blank_index, float("-inf"))
            scores.scatter_(1, best_blank.unsqueeze(1), total.unsqueeze(1))
        A = scores.size(0)
        # symbols, frames and kinds are every row's: read-only views, kept per A
        fixed = self._row_arcs.get(A)
        if fixed is None:
            columns = (self.symbols, self.frames, self.is_label)
            fixed = self._row_arcs[A] = [x.expand(A, -1) for x in columns]
        symbol, frames, is_label = fixed
        return Arcs(symbol, frames, scores, is_label)

    def one_outputs(
        self, stepper, enc_proj: torch.Tensor, dec_proj: torch.Tensor, lm, decision
    ) -> torch.Tensor:
        """The joint network's outputs at one step of a one-utterance greedy search,
        as :meth:`one_choice` reads them: (1, V) float32 log-probabilities, with an
        LM the labels' fused scores (the blanks' are 0).

        Args:
            enc_proj, dec_proj: (1, J).
            lm: The fused LMs' state, or None.
            decision: ``blank_decision`` (unused: the same outputs serve both).
        """
        logp = stepper.log_probs(enc_proj, dec_proj)  # (1, V)
        if lm is not None:
            logp = logp + lm.labels
        return logp

    def one_choice(
        self, logp: torch.Tensor, room: int, guarded: bool, max_sym: int, decision
    ) -> Tuple[bool, int, None, int, float]:
        """The arc of a one-utterance greedy step (:meth:`best_arcs` of one row, in
        Python floats: no batch overhead).

        Args:
            logp: (1, V) :meth:`one_outputs`.
            room: ``min(T - t, C)`` (C = :attr:`room_cap`).
            guarded: Whether ``max_sym`` labels stayed at this frame.
            decision: ``"total"`` or ``"symbol"``.

        Returns:
            ``(is label, symbol, None, frames, score)``.
        """
        R = self.room_cap
        if room >= R and not guarded:  # every arc fits: no mask needed
            masked = logp
        else:
            # (0 or -inf: exact in any dtype)
            masked = logp + self.mask_rows[guarded * (R + 1) + room]
        k = int(masked.argmax())  # (1, V): the flat index is the symbol
        is_label = self.is_label_list[k]
        if decision == "total":
            lo, hi = self.blank_range
            blanks = masked[0, lo:hi].tolist()
            blank_lp = log_sum_exp(blanks)
            if is_label and float(logp[0, k]) <= blank_lp:
                k, is_label = lo + blanks.index(max(blanks)), False
            score = float(logp[0, k]) if is_label else blank_lp
        else:
            score = float(logp[0, k])
        return is_label, k, None, self.frames_list[k], score

    def early_choice(
        self,
        logp: torch.Tensor,
        room: int,
        guarded: bool,
        max_sym: int,
        decision: str,
        choices: Dict[int, tuple],
    ):
        """The step a stream may take before T is known (:func:`early_choice`), from
        the widest room's choice alone where the allowed symbols grow with the room
        (:attr:`allowed_lists`).

        The most probable symbol of a set is the most probable of every subset that
        holds it, and a blank total only grows with its set. So the choice at C is
        the step at every room from ``room`` up when it is allowed at ``room`` and
        is a label (with ``"total"`` it beat the total at C, which bounds the
        others), or with ``"symbol"`` any arc, or a blank whose total at ``room``
        is at least the best label's (always so when the blank is the arg-max
        symbol). A choice not allowed at ``room`` is not the choice there: the step
        waits. What is left (a best label not allowed at ``room``) asks every room.

        Arguments and result as :func:`early_choice`; a blank's scores (its totals
        by room) are computed when read.
        """
        rows = self.allowed_lists
        if rows is None:
            return early_choice(self, logp, room, guarded, max_sym, decision, choices)
        R = self.room_cap
        widest = choices.get(R)
        if widest is None:
            widest = choices[R] = self.one_choice(logp, R, guarded, max_sym, decision)
        is_label, k = widest[:2]
        first = guarded * (R + 1)
        if not rows[first + room][k]:
            return None  # not allowed at room: the choice there differs
        if is_label or decision != "total":
            return widest, None  # the same arc and score at every room
        lo, hi = self.blank_range
        totals = _BlankTotals(logp[0, lo:hi].tolist(), lo, rows[first : first + R + 1])
        top = k if guarded else int(logp.argmax())  # guarded: every label masked
        if top != k:  # a label beat blank k but not the blanks' total at C
            if not rows[first + room][top]:
                return early_choice(
                    self, logp, room, guarded, max_sym, decision, choices
                )
            if float(logp[0, top]) > totals[room]:
                return None  # the label wins at room
        return (False, k, None, self.frames_list[k], totals[room]), totals

    def arc_log_probs(self, logits: torch.Tensor):
        """(..., V) raw joint outputs -> what the arcs read: the symbols'
        log-probabilities (..., V) float32, and None (no duration outputs);
        non-finite outputs become -inf (no path through them)."""
        return _log_softmax(logits.float()).nan_to_num(NEG), None

    def blank_weights(self, tok: torch.Tensor, dur) -> torch.Tensor:
        """(..., NB) log-probability of each blank arc."""
        return tok[..., self._blank_cols]

    def label_weights(self, tok_l: torch.Tensor, dur) -> torch.Tensor:
        """(..., NL) log-probability of each arc of a label whose log-probability is
        ``tok_l`` (...): its one move."""
        return tok_l.unsqueeze(-1)

    def best_arcs(
        self, logp: torch.Tensor, nodes: RowNodes, max_sym: int, blank_decision: str
    ) -> Arcs:
        """The greedy step of each row: the allowed symbol it emits (:meth:`decide`).

        Args:
            logp: (A, V) float32 log-probabilities of the row's node (with an LM, the
                fused scores: the labels' log-probabilities plus the LM's),
                :meth:`step_scores`.
            nodes: The rows' nodes (``frame``, ``length``, ``num_sym`` are read).
            max_sym: Labels allowed per frame.
            blank_decision: ``"total"`` or ``"symbol"``.
        """
        masked = self._masked(logp, nodes, max_sym)
        symbol, score = self.decide(logp, masked, blank_decision)
        return Arcs(symbol, self.frames[symbol], score, self.is_label[symbol])


def early_choice(
    table,
    outputs,
    room: int,
    guarded: bool,
    max_sym: int,
    decision: str,
    choices: Dict[int, tuple],
):
    """The step a stream may take at frame t before T is known, or None (it waits
    for more frames): :func:`~espnet_multiblank.lattice.decide_early` of the
    table's choices with ``min(T - t, C) = room .. C`` (``room = N - t < C``, N the
    frames received, C the table's ``room_cap``).

    Args:
        table: The symbol table.
        outputs: Its ``one_outputs`` at the step.
        room, guarded, max_sym, decision: As for its ``one_choice``.
        choices: The step's choices by room computed so far (a stream evaluates a
            step again when more frames arrive); the new ones are added.

    Returns:
        ``(choice, scores)``: the choice at ``room`` and ``{r: score}`` for r =
        ``room .. C`` (None: the same score at every room), or None.
    """
    options = []
    for r in range(room, table.room_cap + 1):
        choice = choices.get(r)
        if choice is None:
            choice = choices[r] = table.one_choice(
                outputs, r, guarded, max_sym, decision
            )
        options.append(choice)
    return decide_early(options, room)


class _BlankTotals(dict):
    """``{r: the total log-probability of the blanks allowed at room r}``, each
    computed when first read, as :meth:`SymbolTable.one_choice` computes it (the
    blanks not allowed at -inf).

    Args:
        blanks: The blanks' log-probabilities (indices lo .. hi - 1).
        lo: The first blank's index.
        rows: The allowed symbols by room (:attr:`SymbolTable.allowed_lists`).
    """

    def __init__(self, blanks: List[float], lo: int, rows: List[List[bool]]):
        super().__init__()
        self.blanks, self.lo, self.rows = blanks, lo, rows

    def __missing__(self, room: int) -> float:
        allowed = self.rows[room][self.lo : self.lo + len(self.blanks)]
        neg = float("-inf")
        self[room] = value = log_sum_exp(
            [x if ok else neg for x, ok in zip(self.blanks, allowed)]
        )
        return value


def _durations_value(raw, ex, slots, total: bool):
    """(value, slot) of the allowed duration ``slots`` of one step: their total (log
    of the sum of their exp(raw - max) ``ex``) or the best one's raw logit (the
    duration log-normaliser is subtracted by the caller), and the best slot."""
    if not slots:
        return float("-inf"), -1
    j = max(slots, key=raw.__getitem__)
    if not total:
        return raw[j], j
    mass = sum([ex[i] for i in slots])
    if mass > 0.0:
        return math.log(mass), j
    # every allowed duration underflowed next to the best one: exact, slower
    top = max(raw)
    return log_sum_exp([raw[i] - top for i in slots]), j


class TDTSymbolTable:
    """Durations and masks of a TDT lattice on one device.

    Args:
        lattice: The lattice.
        vocab_size: ``V + D``, the joint network's output size.
        device: Where the tensors live.
        end_rule: ``"exact"`` (the lattice's end rule, module docstring) or
            ``"clip"`` (every duration allowed; an arc that reaches or passes T ends
            the hypothesis, as NeMo's TDT greedy search does).

    Attributes:
        num_tokens: V.
        num_durations: D.
        durations: (D,) long, frames of duration slot ``j``; ``durations_list`` the
            same as a list.
        moves: (D,) bool, slots with a duration >= 1 (the blank's slots).
        max_frames: The longest duration.
        room_cap: C, the lattice's ``room_cap`` (R + 1).
    """

    def __init__(
        self,
        lattice: TDTLattice,
        vocab_size: int,
        device: torch.device,
        end_rule: str = "exact",
    ):
        lattice.check_vocab_size(vocab_size)
        self.lattice = lattice
        self.end_rule = lattice.check_end_rule(end_rule)
        self.blank = lattice.blank
        self.num_durations = lattice.num_durations
        self.num_tokens = vocab_size - self.num_durations
        durations = torch.tensor(lattice.durations, dtype=torch.long)
        self.durations = durations.to(device)
        self.durations_list = list(lattice.durations)
        self.moves = self.durations >= 1
        self.max_frames = lattice.max_frames
        self.room_cap = lattice.room_cap
        _arc_columns(self, lattice, self.num_tokens, device)
        self._blank_slots = _columns([arc.slot for arc in lattice.blank_arcs], device)
        # allowed() as a lookup for best_arcs(): the masks depend only on the guard and
        # on min(T - t, R + 1); row g * (R + 1) + r - 1, (blank, label) x D additive
        R1 = self.max_frames + 1
        room = torch.arange(1, R1 + 1, device=device).repeat(2)
        guard = torch.arange(2 * R1, device=device) >= R1
        blank_ok, label_ok = self.allowed(room, guard)
        ok = torch.stack((blank_ok, label_ok), 1)  # (2 (R + 1), 2, D)
        self._mask_rows = torch.zeros(ok.shape, device=device).masked_fill(
            ~ok, float("-inf")
        )
        #: {(min(T - t, R + 1), guarded): (blank slots, label slots)}, the same as
        #: Python lists (the one-utterance greedy loop's)
        self.slot_sets = {
            (r, g): (
                [j for j, ok in enumerate(b) if ok],
                [j for j, ok in enumerate(lab) if ok],
            )
            for r, g, b, lab in zip(
                room.tolist(), guard.tolist(), blank_ok.tolist(), label_ok.tolist()
            )
        }
        # column of each token in (blank, label) pairs
        self._token_kind = torch.ones(self.num_tokens, dtype=torch.long, device=device)
        self._token_kind[self.blank] = 0

    def log_probs(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Token and duration log-probabilities of raw joint outputs.

        Args:
            logits: (A, V + D) raw joint-network output.

        Returns:
            (A, V) token and (A, D) duration log-probabilities, float32 (decoding
            applies no sigma).
        """
        logits = logits.float()
        V = self.num_tokens
        return logits[:, :V].log_softmax(-1), logits[:, V:].log_softmax(-1)

    def one_outputs(
        self, stepper, enc_proj: torch.Tensor, dec_proj: torch.Tensor, lm, decision
    ) -> list:
        """The joint network's outputs at one step of a one-utterance greedy search,
        as :meth:`one_choice` reads them: the duration logits ``raw`` (D floats),
        their exp(raw - max) ``ex``, the normaliser to subtract from a duration
        value, the (1, V) token log-probabilities (LM-fused), their two best
        ((values), (tokens)) (None when V = 1), and the blank token's score once
        read (None until then).

        Args:
            enc_proj, dec_proj: (1, J).
            lm: The fused LMs' state, or None.
            decision: ``blank_decision``.
        """
        V = self.num_tokens
        # as few torch calls per step as possible: the durations' log-softmax is
        # taken in Python on D floats, the tokens' in torch (V may be large)
        z_tok, z_dur = stepper.joint(enc_proj, dec_proj).split_with_sizes(
            (V, self.num_durations), 1
        )
        raw = z_dur.tolist()[0]  # (D,) duration logits
        top = max(raw)
        ex = [math.exp(x - top) for x in raw]
        # log-prob of a duration = raw - top - log(sum(ex)); of a total = the
        # _durations_value() (log of its ex sum) - log(sum(ex)); so subtract:
        norm = math.log(sum(ex)) + (0.0 if decision == "total" else top)
        tok = z_tok.float().log_softmax(-1)  # (1, V)
        if lm is not None:  # fused scores of the labels (the blank's is 0)
            tok = tok + lm.labels
        best_tokens = tuple(x.tolist() for x in tok[0].topk(2)) if V > 1 else None
        return [raw, ex, norm, tok, best_tokens, None]

    def one_choice(
        self, outputs: list, room: int, guarded: bool, max_sym: int, decision
    ) -> Tuple[bool, int, int, int, float]:
        """The arc of a one-utterance greedy step (:meth:`best_arcs` of one row, in
        Python floats: no batch overhead).

        Args:
            outputs: :meth:`one_outputs` (its blank token's score filled in when
                read).
            room: ``min(T - t, R + 1)``.
            guarded: Whether ``max_sym`` labels stayed at this frame.
            decision: ``"total"`` or ``"symbol"``.

        Returns:
            ``(is label, token, duration slot, frames, score)``.
        """
        raw, ex, norm, tok, best_tokens = outputs[:5]
        total = decision == "total"
        neg = float("-inf")
        blank_slots, label_slots = self.slot_sets[room, guarded]
        b_val, b_j = _durations_value(raw, ex, blank_slots, total)
        l_val, l_j = _durations_value(raw, ex, label_slots, total)
        b_val -= norm
        l_val -= norm
        blank = self.blank
        # the best label token and the blank's, from the two best tokens
        if best_tokens is not None:
            (v0, v1), (k0, k1) = best_tokens
            if k0 == blank:
                label_k, label_tok, blank_tok = k1, v1, v0
            else:
                label_k, label_tok = k0, v0
                blank_tok = v1 if k1 == blank else None
                if blank_tok is None and b_val > l_val:  # not decided by order
                    if outputs[5] is None:
                        outputs[5] = float(tok[0, blank])
                    blank_tok = outputs[5]
        else:
            label_k, label_tok, blank_tok = -1, neg, float(tok[0, 0])
        label_score = label_tok + l_val
        durations = self.durations_list
        if blank_tok is None or label_score > blank_tok + b_val:
            return True, label_k, l_j, min(durations[l_j], room), label_score
        return False, blank, b_j, min(durations[b_j], room), blank_tok + b_val

    def early_choice(self, outputs, room, guarded, max_sym, decision, choices):
        """The step a stream may take before T is known (:func:`early_choice`)."""
        return early_choice(self, outputs, room, guarded, max_sym, decision, choices)

    def arc_log_probs(self, logits: torch.Tensor):
        """(..., V + D) raw joint outputs -> what the arcs read: token (..., V) and
        duration (..., D) log-probabilities, float32; non-finite outputs become -inf
        (no path through them)."""
        logits = logits.float()
        V = self.num_tokens
        tok = _log_softmax(logits[..., :V])
        dur = _log_softmax(logits[..., V:])
        return tok.nan_to_num(NEG), dur.nan_to_num(NEG)

    def blank_weights(self, tok: torch.Tensor, dur: torch.Tensor) -> torch.Tensor:
        """(..., NB) log-probability of each blank arc (the blank with a duration)."""
        return tok[..., self.blank, None] + dur[..., self._blank_slots]

    def label_weights(self, tok_l: torch.Tensor, dur: torch.Tensor) -> torch.Tensor:
        """(..., NL) log-probability of each arc of a label whose token
        log-probability is ``tok_l`` (...): one per duration."""
        return tok_l.unsqueeze(-1) + dur

    def step_scores(self, stepper, nodes: RowNodes) -> TDTScores:
        """What :meth:`best_arcs` and :meth:`beam_candidates` choose from: the
        joint network's (``stepper``) (A, V) token log-probabilities at the rows'
        nodes, plus their ``lm_labels``, and (A, D) duration log-probabilities,
        float32 (:meth:`log_probs`)."""
        tok, dur = self.log_probs(stepper.joint(nodes.enc_proj, nodes.dec_proj))
        if nodes.lm_labels is not None:
            tok = tok + nodes.lm_labels
        return tok, dur

    def allowed(
        self, room: torch.Tensor, guard: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Which durations the blank and the labels may take (module docstring).

        Args:
            room: (A,) long, frames left ``T - t`` (>= 1).
            guard: (A,) bool, rows whose labels must move.

        Returns:
            (A, D) bool for the blank, (A, D) bool for every label.
        """
        e = self.durations.unsqueeze(0)  # (1, D)
        moves = self.moves.unsqueeze(0)
        stay_ok = ~guard.unsqueeze(1) | moves  # (A, D)
        if self.end_rule == "clip":
            return moves.expand_as(stay_ok), stay_ok
        room = room.unsqueeze(1)
        blank_ok = moves & (e <= room)
        label_ok = stay_ok & (e < room)
        # no allowed arc (only with durations sets without 1): any blank, clipped
        stuck = ~(blank_ok.any(1) | label_ok.any(1))
        return blank_ok | (stuck.unsqueeze(1) & moves), label_ok

    def _duration_totals(self, dur, blank_ok, label_ok):
        """Per row, the blank's and the labels' total over their allowed durations
        and their most probable slots."""
        neg = torch.tensor(float("-inf"), dtype=dur.dtype, device=dur.device)
        blank_dur = torch.where(blank_ok, dur, neg)
        label_dur = torch.where(label_ok, dur, neg)
        blank_j = blank_dur.argmax(-1)
        label_j = label_dur.argmax(-1)
        return blank_dur.logsumexp(-1), blank_j, label_dur.logsumexp(-1), label_j

    def best_arcs(
        self, scores: TDTScores, nodes: RowNodes, max_sym: int, decision: str
    ) -> Arcs:
        """The arc each row emits (greedy search; module docstring). A tie between
        tokens goes to the lower index.

        Args:
            scores: (A, V) float32 token log-probabilities (with an LM, the fused
                scores: the labels' log-probabilities plus the LM's) and (A, D)
                duration log-probabilities (:meth:`step_scores`).
            nodes: The rows' nodes (``frame``, ``length``, ``num_sym`` are read).
            max_sym: Labels that may stay at one frame (the guard: after them a
                label must move).
            decision: ``"total"`` or ``"symbol"``.
        """
        tok, dur = scores
        room = nodes.length - nodes.frame
        guard = nodes.num_sym >= max_sym
        R1 = self.max_frames + 1
        which = room.clamp(1, R1) - 1 + R1 * guard.long()
        masked = dur.unsqueeze(1) + self._mask_rows[which]  # (A, 2, D): blank, label
        slots = masked.argmax(-1)  # (A, 2)
        if decision == "total":
            values = masked.logsumexp(-1)
        else:
            values = masked.gather(2, slots.unsqueeze(2)).squeeze(2)
        # each token with its kind's duration term (blank: column 0, labels: 1)
        score, symbol = (tok + values[:, self._token_kind]).max(-1)
        is_label = symbol != self.blank
        slot = slots.gather(1, is_label.long().unsqueeze(1)).squeeze(1)
        frames = torch.minimum(self.durations[slot], room)
        return Arcs(symbol, frames, score, is_label)

    def beam_candidates(
        self, scores: TDTScores, nodes: RowNodes, max_sym: int, decision: str
    ) -> Arcs:
        """Every candidate arc of each row (beam search; :meth:`_candidates`), each
        moving by its duration (clipped at T). Arguments as for :meth:`best_arcs`
        (``frame < length``).

        Returns:
            (A, N) :class:`Arcs` (N = V D with ``"symbol"``, V with ``"total"``),
            ``score`` -inf where not allowed.
        """
        tok, dur = scores
        room = nodes.length - nodes.frame
        guard = nodes.num_sym >= max_sym
        score, tokens, slots = self._candidates(tok, dur, room, guard, decision)
        frames = torch.minimum(self.durations[slots], room.unsqueeze(1))
        return Arcs(tokens, frames, score, tokens != self.blank)

    def _candidates(
        self,
        tok: torch.Tensor,
        dur: torch.Tensor,
        room: torch.Tensor,
        guard: torch.Tensor,
        decision: str,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every candidate of each row (beam search), -inf where not allowed.

        ``"symbol"``: one candidate per arc (token k, slot j), N = V * D, scored
        ``tok[k] + dur[j]``. ``"total"``: one per token, N = V, scored with the token's
        total over its allowed durations and placed at its most probable one.

        Args: see :meth:`best_arcs`.

        Returns:
            (A, N) scores, (A, N) long tokens, (A, N) long slots.
        """
        A, V = tok.shape
        D = self.num_durations
        blank_ok, label_ok = self.allowed(room, guard)
        neg = torch.tensor(float("-inf"), dtype=dur.dtype, device=dur.device)
        if decision == "symbol":
            is_blank = torch.zeros(V, dtype=torch.bool, device=tok.device)
            is_blank[self.blank] = True
            ok = torch.where(
                is_blank.view(1, V, 1), blank_ok.unsqueeze(1), label_ok.unsqueeze(1)
            )  # (A, V, D)
            scores = torch.where(ok, tok.unsqueeze(2) + dur.unsqueeze(1), neg)
            tokens = torch.arange(V, device=tok.device).repeat_interleave(D)
            slots = torch.arange(D, device=tok.device).repeat(V)
            return scores.view(A, V * D), tokens.expand(A, -1), slots.expand(A, -1)
        b_val, b_j, l_val, l_j = self._duration_totals(dur, blank_ok, label_ok)
        scores = tok + l_val.unsqueeze(1)  # (A, V)
        scores[:, self.blank] = tok[:, self.blank] + b_val
        slots = l_j.unsqueeze(1).repeat(1, V)
        slots[:, self.blank] = b_j
        tokens = torch.arange(V, device=tok.device).expand(A, -1)
        return scores, tokens, slots
