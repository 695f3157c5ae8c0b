"""Label-looping greedy search (Bataev et al. 2024, arXiv 2406.06220), batched.

The frame-looping greedy search (:mod:`~espnet_multiblank.decoding.greedy`, every
lattice kind) takes one step per iteration for every
active utterance: one joint-network call, then one prediction-network call for the rows
that emitted a label. Label-looping reorders the same steps so that the prediction
network runs once per emitted label, for the whole batch at once:

* **outer loop**: one label per utterance. After the inner loop every active utterance
  stands at its next label arc (unless the inner loop was limited, below); the labels
  are recorded, and the prediction network runs once, batched, for the utterances that
  emitted (a TDT label also moves its utterance by its duration).
* **inner loop**: every utterance whose best arc is a blank takes it (the standard
  blank: 1 frame; big blank i: d_i frames; a TDT blank: its duration), and the joint
  network alone is evaluated again at the new frame, for the whole batch, until every
  utterance stands at a label arc or has reached its last frame.

Each utterance takes exactly the steps of the one-utterance greedy search (the same
arcs, the same ``max_sym_per_frame`` guard, the same end rule, the same scores): only
the order in which the utterances' steps are computed changes. The arc of a joint row
comes from the step the frame-looping searches take
(:meth:`~espnet_multiblank.decoding.base.TransducerSearch.row_arcs`: the symbol
table's ``best_arcs``), for every lattice kind.

**Window.** The prediction output of an utterance does not change until its next
label, so the inner loop may evaluate the joint network at ``window`` = W frames
``t .. t + W - 1`` per call and follow the blank arcs through them (pointer doubling
over the window's positions; a blank that lands past the window goes on from there at
the next iteration). The arcs taken are the same for every W; W trades joint rows
evaluated in vain for fewer iterations (fewer kernel launches and host syncs). W = 1
is the paper's loop. Default: 16 frames when every blank covers one frame (the
standard lattice, where blank runs are long), else 1 (big blanks and TDT durations
already cover the runs in few arcs).

**Inner-loop limit.** The inner loop runs until the slowest utterance of the batch
finds its label, so a batch makes, per label, as many joint calls as its longest blank
run needs (the frame-looping search needs as many as the utterance with the most steps
in all). On a GPU that is the paper's trade: a call costs kernel launches, the
prediction network runs once per label. On a CPU, where each call is a fixed cost of
small operations, ``max_inner`` = K ends the inner loop after K joint calls: the
utterances that found their label emit it and run the prediction network, the others
go on searching in the next outer iteration (the arcs taken are the same for every
K). Default: no limit on an accelerator; on a CPU 3 (W = 1) or 1 (W > 1), measured on
the digits recipe's models (``docs/decoding.md``).

The loops work on fixed-size batch tensors with masks (an utterance that has ended
keeps its row, its updates are masked out), the labels go into a preallocated
``(B, capacity)`` buffer (one column per outer iteration that emits, doubled when
full), and the prediction network's state is merged with
:meth:`~espnet_multiblank.decoding.stepper.Stepper.where_state`: the only host
synchronisations are the two loop conditions (and reading the results at the end; on a
CPU, a third tells an outer iteration in which no row emits to skip the prediction
network).
See ``docs/decoding.md`` ("Label-looping greedy search").

Notation: B = utterances, T = encoder frames, J = joint space, V = joint outputs,
W = window.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from espnet_multiblank.decoding.base import (
    TransducerSearch,
    check_batch,
    check_positive_int,
)
from espnet_multiblank.decoding.greedy import GreedySearch
from espnet_multiblank.decoding.hypothesis import Hypothesis, TokenTiming
from espnet_multiblank.decoding.tables import Arcs, RowNodes
from espnet_multiblank.lattice import is_lattice


class Window(NamedTuple):
    """The blank arcs one inner-loop iteration took for each row.

    Attributes:
        offset: (B,) long, frames moved (0: none; ``>= W``: the arcs left the window,
            the row goes on searching).
        score: (B,) float, their total log-probability.
        moves: (B,) long, arcs taken.
        big: (B,) long, arcs taken over more than one frame.
        arcs: The arc at ``offset`` when ``offset < W``: a label arc, unless the row
            has reached its end.
    """

    offset: torch.Tensor
    score: torch.Tensor
    moves: torch.Tensor
    big: torch.Tensor
    arcs: Arcs


class LoopBatch:
    """Constant tensors of one :meth:`LabelLoopingGreedySearch.search_batch` call.

    ``padded``: ``enc_proj`` already has at least W frames after every row's length
    (the streaming search's buffer; it is then used as it is, not copied, so frames
    written into it later and ``lens`` updated in place are seen)."""

    def __init__(
        self,
        table,
        enc_proj: torch.Tensor,
        lens: torch.Tensor,
        W: int,
        padded: bool = False,
    ):
        B = lens.size(0)
        device = lens.device
        self.table = table
        # W frames of padding: a row reads frames t .. t + W - 1 with t <= T_b <=
        # T_max (what it reads past T_b is ignored)
        if padded:
            self.enc_proj = enc_proj
        else:
            pad = enc_proj.new_zeros(B, W, enc_proj.size(2))
            self.enc_proj = torch.cat([enc_proj, pad], 1)  # (B, T_max + W, J)
        self.lens = lens  # (B,)
        self.rows = torch.arange(B, device=device)
        # windows of W frames
        self.offsets = torch.arange(W, device=device)  # (W,)
        self.first = self.offsets == 0
        self.rows_w = self.rows.unsqueeze(1)  # (B, 1)
        self.lens_w = lens.unsqueeze(1).expand(B, W)
        extra = table.max_frames  # landing points past the window
        self.after = torch.arange(W, W + extra, device=device).expand(B, extra)
        self.after_values = torch.zeros(B, extra, 3, dtype=torch.float64, device=device)


@dataclass
class LoopState:
    """The search state of B rows, carried between calls of
    :meth:`LabelLoopingGreedySearch.run_loops` (the streaming search keeps one
    across chunks).

    Attributes:
        frame, num_sym: (B,) long, t of each row and the labels emitted at t.
        score: (B,) float64, the path's score (fused with the LMs).
        moves, big: (B,) long, arcs that moved, and those over > 1 frame.
        labels: (B, capacity) long, the labels emitted since the last
            :meth:`drain`, one column per outer iteration that ran the prediction
            network (-1: none).
        timing: (B, capacity, 3) float64, each column's label timing (frame,
            frames its arc covers, acoustic log-probability:
            :attr:`~espnet_multiblank.decoding.hypothesis.Hypothesis.timing`).
        iteration: Columns of ``labels`` used.
        dec_proj: (B, J) projected prediction-network output after the labels.
        state: The prediction network's state (the stepper's type).
        lm: The fused LMs' state, or None.
    """

    frame: torch.Tensor
    num_sym: torch.Tensor
    score: torch.Tensor
    moves: torch.Tensor
    big: torch.Tensor
    labels: torch.Tensor
    dec_proj: torch.Tensor
    state: Any
    timing: torch.Tensor
    lm: Any = None
    iteration: int = 0

    def record(
        self,
        symbols: torch.Tensor,
        frame: torch.Tensor,
        covered: torch.Tensor,
        acoustic: torch.Tensor,
    ) -> None:
        """One outer iteration's labels ((B,) long, -1 where a row emitted none)
        and their timing ((B,) each: the frame, the frames the arc covers, its
        acoustic log-probability); the buffers doubled when full."""
        if self.iteration == self.labels.size(1):
            self.labels = torch.cat([self.labels, torch.full_like(self.labels, -1)], 1)
            self.timing = torch.cat([self.timing, torch.zeros_like(self.timing)], 1)
        self.labels[:, self.iteration] = symbols
        column = self.timing[:, self.iteration]
        column[:, 0] = frame
        column[:, 1] = covered
        column[:, 2] = acoustic
        self.iteration += 1

    def drain(self) -> Tuple[List[List[int]], List[List[TokenTiming]]]:
        """The labels recorded since the last drain and their timings, per row;
        the buffers are emptied."""
        used = self.labels[:, : self.iteration].tolist()
        timing = self.timing[:, : self.iteration].tolist()
        labels = [[k for k in row if k >= 0] for row in used]
        timings = [
            [(int(t), int(e), lp) for k, (t, e, lp) in zip(row, times) if k >= 0]
            for row, times in zip(used, timing)
        ]
        self.labels.fill_(-1)
        self.iteration = 0
        return labels, timings

    def empty_copy(self, **tensors) -> "LoopState":
        """A copy with ``tensors`` replaced and empty label buffers (what a
        provisional run to the end records into)."""
        return dataclasses.replace(
            self,
            **tensors,
            labels=torch.full_like(self.labels, -1),
            timing=torch.zeros_like(self.timing),
            iteration=0,
        )


def _repeat_rows(x: torch.Tensor, W: int) -> torch.Tensor:
    """(B, N) -> (B * W, N): every row W times in a row."""
    B, N = x.shape
    return x.unsqueeze(1).expand(B, W, N).reshape(B * W, N)


class LabelLoopingGreedySearch(TransducerSearch):
    """Label-looping greedy search of every lattice (module docstring): the
    hypotheses of :class:`~espnet_multiblank.decoding.greedy.GreedySearch`
    (``MultiblankLabelLoopingSearch`` and ``TDTLabelLoopingSearch`` are its former
    names). A TDT label arc with a duration >= 1 moves its utterance on when it is
    recorded (outer loop).

    The arc a joint row chooses is :meth:`TransducerSearch.row_arcs` (every
    lattice's); the loops, the bookkeeping and the results are here. :meth:`search`
    decodes one utterance with the frame-looping search's one-utterance loop
    (:attr:`one_utterance`).

    Args:
        stepper, lattice, max_sym_per_frame, blank_decision, fusion, end_rule: As for
            :class:`~espnet_multiblank.decoding.greedy.GreedySearch`.
        window: Frames the inner loop evaluates per joint-network call and utterance
            (module docstring); None: 16 when every blank of the lattice covers one
            frame, else 1.
        max_inner: Joint-network calls per outer iteration (module docstring); None:
            no limit on an accelerator (the paper's loop), on a CPU 1 with a window
            > 1 and 3 without.
    """

    batched = True
    #: first label-buffer capacity, in outer iterations (doubled when full)
    initial_capacity = 32

    def __init__(
        self,
        stepper,
        lattice,
        max_sym_per_frame: int = 10,
        blank_decision: str = "total",
        window: Optional[int] = None,
        max_inner: Optional[int] = None,
        fusion=None,
        end_rule: str = "exact",
    ):
        super().__init__(
            stepper, lattice, max_sym_per_frame, blank_decision, fusion, end_rule
        )
        if window is None:
            window = 16 if lattice.max_frames == 1 else 1
        self.window = check_positive_int("window", window)
        self.max_inner = (
            None if max_inner is None else check_positive_int("max_inner", max_inner)
        )
        # pointer-doubling rounds: after k rounds a row has followed 2^k arcs, and
        # W positions hold at most W of them
        self._rounds = (self.window - 1).bit_length()

    def inner_limit(self, device: torch.device) -> float:
        """:attr:`max_inner`, or its default on ``device`` (class docstring)."""
        if self.max_inner is not None:
            return self.max_inner
        if device.type != "cpu":
            return float("inf")
        return 1 if self.window > 1 else 3

    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        """One utterance ((T, D_enc)): the frame-looping search's one-utterance loop,
        the same hypothesis (the class docstring's) without a batch's bookkeeping,
        which a batch of one pays on every step (bench/RESULTS.md)."""
        return self.one_utterance.search(enc_out)

    @property
    def one_utterance(self) -> GreedySearch:
        """The frame-looping search :meth:`search` runs (built once, on the same
        stepper, lattice, inner-loop limit, blank decision and fusion)."""
        if getattr(self, "_one", None) is None:
            self._one = GreedySearch(**self.settings())
        return self._one

    def _follow_blanks(
        self,
        ctx: LoopBatch,
        dec_proj: torch.Tensor,
        frame: torch.Tensor,
        num_sym: torch.Tensor,
        rows: torch.Tensor,
        lm_labels: Optional[torch.Tensor] = None,
    ) -> Window:
        """Evaluate the joint network at frames ``t .. t + W - 1`` of every row and
        follow the blank arcs of the rows in ``rows`` from ``t`` until a label, the
        row's end or the window's end.

        Args:
            ctx: The batch's constant tensors.
            dec_proj: (B, J) projected prediction-network outputs.
            frame: (B,) long, t of each row.
            num_sym: (B,) long, labels emitted at ``t`` (the later frames of the
                window are reached by a blank: 0 there).
            rows: (B,) bool, rows inside their utterance that follow their blank
                arcs (the others get offset 0, and their ``arcs`` are to be ignored).
            lm_labels: (B, V) float32 weighted LM scores of the next label (they
                do not change before the next label either), or None.
        """
        if self.window == 1:
            return self._follow_one_frame(
                ctx, dec_proj, frame, num_sym, rows, lm_labels
            )
        arcs = self._window_arcs(ctx, dec_proj, frame, num_sym, lm_labels)
        # blank arcs of the followed rows, inside their utterance, move on
        frames_w = frame.unsqueeze(1) + ctx.offsets  # (B, W)
        blank = rows.unsqueeze(1) & (frames_w < ctx.lens_w) & ~arcs.is_label
        if ctx.table.max_frames == 1:
            offset, score, moves, big = self._one_frame_blanks(ctx, arcs, blank)
        else:
            offset, score, moves, big = self._pointer_doubling(ctx, arcs, blank)
        at = offset.clamp(max=self.window - 1).unsqueeze(1)  # (B, 1)
        return Window(
            offset,
            score,
            moves,
            big,
            Arcs(*(a.gather(1, at).squeeze(1) for a in arcs)),
        )

    def _follow_one_frame(self, ctx, dec_proj, frame, num_sym, rows, lm_labels):
        """:meth:`_follow_blanks` with W = 1: the arc at ``t``, taken if a blank."""
        enc_rows = ctx.enc_proj[ctx.rows, frame]
        nodes = RowNodes(enc_rows, dec_proj, frame, ctx.lens, num_sym, lm_labels)
        arcs = self.row_arcs(ctx.table, nodes)
        blank = rows & ~arcs.is_label
        moved = torch.where(blank, arcs.frames, 0)
        score = torch.where(blank, arcs.score, 0.0)
        return Window(moved, score, blank, moved > 1, arcs)

    def _window_arcs(self, ctx, dec_proj, frame, num_sym, lm_labels) -> Arcs:
        """The greedy arcs at the W frames ``t .. t + W - 1`` of every row, as (B, W)
        tensors (one joint call for B * W rows)."""
        B, J = dec_proj.shape
        W = self.window
        frames_w = frame.unsqueeze(1) + ctx.offsets  # (B, W)
        enc_rows = ctx.enc_proj[ctx.rows_w, frames_w]
        num_sym_w = torch.where(ctx.first, num_sym.unsqueeze(1), 0)  # (B, W)
        nodes = RowNodes(
            enc_rows.reshape(B * W, J),
            _repeat_rows(dec_proj, W),
            frames_w.view(-1),
            ctx.lens_w.reshape(-1),
            num_sym_w.view(-1),
            None if lm_labels is None else _repeat_rows(lm_labels, W),
        )
        flat = self.row_arcs(ctx.table, nodes)
        return Arcs(*(a.view(B, W) for a in flat))

    def _one_frame_blanks(self, ctx, arcs: Arcs, blank: torch.Tensor):
        """Every blank covers one frame: the blanks run to the first position that
        is not one. Returns (offset, score, moves, big), each (B,)."""
        W = self.window
        stop = ~blank
        offset = torch.where(stop.any(1), stop.int().argmax(1), W)
        taken = blank & (ctx.offsets < offset.unsqueeze(1))
        score = torch.where(taken, arcs.score.double(), 0.0).sum(1)
        return offset, score, offset, torch.zeros_like(offset)

    def _pointer_doubling(self, ctx, arcs: Arcs, blank: torch.Tensor):
        """Blanks over several frames, followed by pointer doubling over positions
        0 .. W + max_frames - 1: labels, frames past the end and landing points past
        the window are fixed points; ``values[o]`` sums (score, arcs, big arcs) from
        o to ``nxt[o]``. Returns (offset, score, moves, big), each (B,)."""
        offsets = ctx.offsets
        nxt = torch.cat(
            [torch.where(blank, offsets + arcs.frames, offsets), ctx.after], 1
        )
        jump = blank & (arcs.frames > 1)
        values = torch.stack(
            [
                torch.where(blank, arcs.score.double(), 0.0),
                blank.double(),
                jump.double(),
            ],
            2,
        )  # (B, W, 3)
        values = torch.cat([values, ctx.after_values], 1)
        for _ in range(self._rounds):
            values = values + values.gather(1, nxt.unsqueeze(2).expand(-1, -1, 3))
            nxt = nxt.gather(1, nxt)
        score, moves, big = values[:, 0].unbind(1)
        return nxt[:, 0], score, moves.long(), big.long()

    @torch.no_grad()
    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """Label-looping greedy search for B utterances (module docstring).

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b <= T_max.

        Returns:
            B hypotheses, in input order, as the one-utterance greedy search gives
            them (``frame == T_b``; ``dec_state`` / ``dec_proj`` after the last
            label).
        """
        lens = check_batch(enc_out, enc_lens)
        return self.search_projected(self.stepper.project_enc(enc_out), lens)

    @torch.no_grad()
    def search_projected(
        self, enc_proj: torch.Tensor, lens: torch.Tensor
    ) -> List[Hypothesis]:
        """:meth:`search_batch` on encoder frames already projected by
        ``stepper.project_enc`` ((B, T_max, J); ``lens`` (B,) long on its device):
        what the streaming search decides on, chunk by chunk."""
        B = enc_proj.size(0)
        loop = self.init_loop(B, enc_proj.device)
        ctx = LoopBatch(self.table(enc_proj.device), enc_proj, lens, self.window)
        self.run_loops(ctx, loop, lens)
        self.finish_loop(loop)
        return self.hypotheses(loop, *loop.drain())

    def init_loop(self, batch: int, device: torch.device) -> LoopState:
        """The search of ``batch`` rows before the first frame."""
        dec_proj, state = self.start(batch, device)  # (B, J)

        def zeros(dtype=torch.long):
            return torch.zeros(batch, dtype=dtype, device=device)

        labels = torch.full(
            (batch, self.initial_capacity), -1, dtype=torch.long, device=device
        )
        return LoopState(
            timing=labels.new_zeros(labels.shape + (3,), dtype=torch.float64),
            frame=zeros(),
            num_sym=zeros(),
            score=zeros(torch.float64),
            moves=zeros(),
            big=zeros(),
            labels=labels,
            dec_proj=dec_proj,
            state=state,
            lm=self.start_lm(batch, device),
        )

    def run_loops(self, ctx: LoopBatch, loop: LoopState, limit: torch.Tensor) -> None:
        """The outer and inner loops, for as long as some row may take its next
        window: a row at frame t evaluates frames ``t .. t + W - 1`` only while
        ``t < limit`` (offline: ``limit`` = the utterance lengths, ``ctx.lens``; the
        streaming search stops each row where the frames received no longer decide
        its arcs as the whole utterance would, ``docs/streaming.md``).

        Args:
            ctx: The batch's constant tensors (``ctx.lens``: T of each row, or the
                frames received so far).
            loop: The rows' search state (updated in place).
            limit: (B,) long, ``<= ctx.lens``.
        """
        ready = loop.frame < limit
        # on a CPU a host sync costs little against the prediction network's call,
        # so an outer iteration in which no row stands at a label (the inner loop
        # stopped at max_inner) skips it: _emit with no row emitting changes nothing
        on_cpu = ctx.lens.device.type == "cpu"
        while bool(ready.any()):
            arcs, searching = self._inner_loop(ctx, loop, ready, limit)
            # every ready row that is not still searching stands at a label arc
            emit = ready & ~searching & (loop.frame < ctx.lens)
            if not on_cpu or bool(emit.any()):
                self._emit(loop, arcs, emit)
            ready = loop.frame < limit

    def _inner_loop(self, ctx, loop: LoopState, ready, limit):
        """Blank arcs, joint network only, for at most ``max_inner`` calls. Returns
        the arcs each row stands at and the rows still searching (their blanks left
        the last window evaluated, or they wait at ``limit``)."""
        max_inner = self.inner_limit(ctx.lens.device)
        lm_labels = None if loop.lm is None else loop.lm.labels
        window = self._follow_blanks(
            ctx, loop.dec_proj, loop.frame, loop.num_sym, ready, lm_labels
        )
        arcs = window.arcs
        searching = self._take(ctx, loop, window)
        calls = 1
        go = searching & (loop.frame < limit)
        while calls < max_inner and bool(go.any()):
            window = self._follow_blanks(
                ctx, loop.dec_proj, loop.frame, loop.num_sym, go, lm_labels
            )
            arcs = window.arcs.where(go, arcs)
            searching = self._take(ctx, loop, window) | (searching & ~go)
            go = searching & (loop.frame < limit)
            calls += 1
        return arcs, searching

    def _take(self, ctx, loop: LoopState, window: Window) -> torch.Tensor:
        """Apply a window's blank arcs; True where a row is still searching (its
        arcs left the window)."""
        loop.frame.add_(window.offset)
        loop.score.add_(window.score)
        loop.moves.add_(window.moves)
        loop.big.add_(window.big)
        moved = window.offset > 0
        loop.num_sym.masked_fill_(moved, 0)
        left = moved if self.window == 1 else window.offset >= self.window
        return left & (loop.frame < ctx.lens)

    def _emit(self, loop: LoopState, arcs: Arcs, emit: torch.Tensor) -> None:
        """Record the label arcs of the rows in ``emit`` and run the prediction
        network (and the fused LMs) once for the batch."""
        moved = torch.where(emit, arcs.frames, 0)  # TDT: a label's duration
        acoustic = arcs.score  # the LM part left out
        if loop.lm is not None:
            lm_labels = loop.lm.labels
            acoustic = acoustic - lm_labels.gather(1, arcs.symbol.unsqueeze(1))[:, 0]
        loop.record(torch.where(emit, arcs.symbol, -1), loop.frame, moved, acoustic)
        loop.score.add_(torch.where(emit, arcs.score, 0.0))
        loop.frame.add_(moved)
        loop.moves.add_(moved > 0)
        loop.num_sym = torch.where(moved > 0, 0, loop.num_sym + emit.long())
        emitted = torch.where(emit, arcs.symbol, self.blank_id)
        new_proj, new_state = self.stepper.step(emitted, loop.state)
        loop.dec_proj = torch.where(emit.unsqueeze(1), new_proj, loop.dec_proj)
        loop.state = self.stepper.where_state(emit, new_state, loop.state)
        if loop.lm is not None:
            fusion = self.fusion
            loop.lm = fusion.where(emit, fusion.step(emitted, loop.lm), loop.lm)

    def finish_loop(self, loop: LoopState, rows: Optional[torch.Tensor] = None):
        """The end of the sentence for complete rows (all, or ``rows`` (B,) bool):
        the fused LMs' end-of-sentence score."""
        if loop.lm is not None:
            end = loop.lm.end.double()
            loop.score.add_(end if rows is None else torch.where(rows, end, 0.0))

    def hypotheses(
        self, loop: LoopState, labels, timings, rows: Optional[List[int]] = None
    ) -> List[Hypothesis]:
        """Rows of ``loop`` (default: all) as :class:`Hypothesis` objects.

        Args:
            loop: The search state.
            labels: The labels of each row (indexed by row: a list or a dict).
            timings: Their timings, indexed as ``labels``.
            rows: The rows wanted.
        """
        stepper = self.stepper
        device = loop.frame.device
        # every arc that moved covered one frame more than it skipped
        skipped = loop.frame - loop.moves
        values = [
            t.tolist()
            for t in (loop.score, loop.frame, loop.num_sym, loop.big, skipped)
        ]
        out = []
        for b in range(loop.frame.size(0)) if rows is None else rows:
            row = torch.tensor([b], device=device)
            out.append(
                Hypothesis(
                    score=values[0][b],
                    yseq=[self.blank_id] + labels[b],
                    timing=list(timings[b]),
                    dec_state=stepper.select_state(loop.state, row),
                    dec_proj=loop.dec_proj[b],
                    frame=values[1][b],
                    num_sym_frame=values[2][b],
                    big_blank_emissions=values[3][b],
                    frames_skipped=values[4][b],
                    lm_state=(
                        None if loop.lm is None else self.fusion.select(loop.lm, row)
                    ),
                )
            )
        return out


def greedy_search_class(lattice, loop_labels: bool) -> type:
    """The greedy search of ``lattice`` (frame-looping, or label-looping with
    ``loop_labels``): every lattice has both; anything else is refused."""
    if not is_lattice(lattice):
        raise TypeError(f"no greedy search for a {type(lattice).__name__}")
    return LabelLoopingGreedySearch if loop_labels else GreedySearch
