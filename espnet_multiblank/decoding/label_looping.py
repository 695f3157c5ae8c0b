"""Label-looping greedy search (Bataev et al. 2024, arXiv 2406.06220), batched.

The frame-looping greedy searches (:mod:`~espnet_multiblank.decoding.greedy`,
:mod:`~espnet_multiblank.decoding.tdt_greedy`) take one step per iteration for every
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
(:mod:`~espnet_multiblank.decoding.row_step`: ``SymbolTable.best_arcs``,
``TDTSymbolTable.best_arcs``); the two subclasses differ only in their lattice kind's
mixin.

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
``(B, capacity)`` buffer (one column per outer iteration, doubled when full), and the
prediction network's state is merged with
:meth:`~espnet_multiblank.decoding.stepper.Stepper.where_state`: the only host
synchronisations are the two loop conditions (and reading the results at the end).
See ``docs/decoding.md`` ("Label-looping greedy search").

Notation: B = utterances, T = encoder frames, J = joint space, V = joint outputs,
W = window.
"""

from typing import List, NamedTuple, Optional

import torch

from espnet_multiblank.decoding.arcs import Arcs
from espnet_multiblank.decoding.base import TransducerSearch, check_positive_int
from espnet_multiblank.decoding.hypothesis import Hypothesis
from espnet_multiblank.decoding.multiblank_table import check_blank_decision
from espnet_multiblank.decoding.row_step import MultiblankRowStep, TDTRowStep
from espnet_multiblank.decoding.tdt_greedy import TDT_GREEDY_DECISION
from espnet_multiblank.lattice import TDTLattice


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


class _Batch:
    """Constant tensors of one :meth:`LabelLoopingGreedySearch.search_batch` call."""

    def __init__(self, table, enc_proj: torch.Tensor, lens: torch.Tensor, W: int):
        B = lens.size(0)
        device = lens.device
        self.table = table
        # W frames of padding: a row reads frames t .. t + W - 1 with t <= T_b <=
        # T_max (what it reads past T_b is ignored)
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


def _repeat_rows(x: torch.Tensor, W: int) -> torch.Tensor:
    """(B, N) -> (B * W, N): every row W times in a row."""
    B, N = x.shape
    return x.unsqueeze(1).expand(B, W, N).reshape(B * W, N)


class LabelLoopingGreedySearch(TransducerSearch):
    """Base class of the label-looping greedy searches (module docstring).

    Subclasses take ``row_arcs`` (the arc a joint row chooses) from their lattice
    kind's :mod:`~espnet_multiblank.decoding.row_step` mixin; the loops,
    the bookkeeping and the results are here. :meth:`search` decodes one utterance as
    a batch of one.

    Args:
        stepper, lattice, max_sym_per_frame: As for
            :class:`~espnet_multiblank.decoding.base.TransducerSearch` (``nbest`` is
            1).
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
        window: Optional[int] = None,
        max_inner: Optional[int] = None,
        fusion=None,
    ):
        super().__init__(
            stepper, lattice, max_sym_per_frame=max_sym_per_frame, fusion=fusion
        )
        self.beam_size = 1
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
        """One utterance ((T, D_enc)) as a batch of one."""
        lens = torch.tensor([enc_out.size(0)], device=enc_out.device)
        return self.search_batch(enc_out.unsqueeze(0), lens)

    def follow_blanks(
        self,
        ctx: _Batch,
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
        B, J = dec_proj.shape
        W = self.window
        table = ctx.table
        if W == 1:
            enc_rows = ctx.enc_proj[ctx.rows, frame]
            arcs = self.row_arcs(
                table, enc_rows, dec_proj, frame, ctx.lens, num_sym, lm_labels
            )
            blank = rows & ~arcs.is_label
            moved = torch.where(blank, arcs.frames, 0)
            score = torch.where(blank, arcs.score, 0.0)
            return Window(moved, score, blank, moved > 1, arcs)
        offsets = ctx.offsets  # (W,)
        frames_w = frame.unsqueeze(1) + offsets  # (B, W)
        enc_rows = ctx.enc_proj[ctx.rows_w, frames_w]
        num_sym_w = torch.where(ctx.first, num_sym.unsqueeze(1), 0)  # (B, W)
        flat = self.row_arcs(
            table,
            enc_rows.reshape(B * W, J),
            _repeat_rows(dec_proj, W),
            frames_w.view(-1),
            ctx.lens_w.reshape(-1),
            num_sym_w.view(-1),
            None if lm_labels is None else _repeat_rows(lm_labels, W),
        )
        arcs = Arcs(*(a.view(B, W) for a in flat))
        # blank arcs of the followed rows, inside their utterance, move on
        blank = rows.unsqueeze(1) & (frames_w < ctx.lens_w) & ~arcs.is_label
        if table.max_frames == 1:
            # every blank covers one frame: the first position that is not a blank
            stop = ~blank
            offset = torch.where(stop.any(1), stop.int().argmax(1), W)
            taken = blank & (offsets < offset.unsqueeze(1))
            score = torch.where(taken, arcs.score.double(), 0.0).sum(1)
            big = torch.zeros_like(offset)
            moves = offset
        else:
            # pointer doubling over positions 0 .. W + max_frames - 1: labels,
            # frames past the end and landing points past the window are fixed
            # points; values[o] sums (score, arcs, big arcs) from o to nxt[o]
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
            offset = nxt[:, 0]
            score, moves, big = values[:, 0].unbind(1)
            moves, big = moves.long(), big.long()
        at = offset.clamp(max=W - 1).unsqueeze(1)  # (B, 1)
        return Window(
            offset,
            score,
            moves,
            big,
            Arcs(*(a.gather(1, at).squeeze(1) for a in arcs)),
        )

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
        if enc_out.dim() != 3 or enc_lens.shape != (enc_out.size(0),):
            raise ValueError(
                "enc_out must be (B, T_max, D_enc) and enc_lens (B,), got "
                f"{tuple(enc_out.shape)} and {tuple(enc_lens.shape)}"
            )
        device = enc_out.device
        B, T_max = enc_out.shape[:2]
        lens = enc_lens.to(device=device, dtype=torch.long)
        if B and bool(((lens < 0) | (lens > T_max)).any()):
            raise ValueError(
                f"enc_lens must be in [0, T_max = {T_max}], got {enc_lens.tolist()}"
            )
        stepper = self.stepper
        blank = self.blank_id
        W = self.window
        max_inner = self.inner_limit(device)
        enc_proj = stepper.project_enc(enc_out)  # (B, T_max, J)
        ctx = _Batch(self.table(device), enc_proj, lens, W)
        dec_proj, state = self.start(B, device)  # (B, J)
        fusion = self.fusion
        lm = self.start_lm(B, device)

        def zeros(dtype=torch.long):
            return torch.zeros(B, dtype=dtype, device=device)

        frame, num_sym, score = zeros(), zeros(), zeros(torch.float64)
        moves, big = zeros(), zeros()  # arcs that moved; those over > 1 frame
        no_label = torch.full((B,), -1, dtype=torch.long, device=device)
        labels = torch.full(
            (B, self.initial_capacity), -1, dtype=torch.long, device=device
        )
        # Hypothesis.timing of each label column: frame, frames covered, acoustic
        timing = labels.new_zeros(B, self.initial_capacity, 3, dtype=torch.float64)
        iteration = 0

        def take(window: Window) -> torch.Tensor:
            """Apply a window's blank arcs; True where a row is still searching (its
            arcs left the window)."""
            frame.add_(window.offset)
            score.add_(window.score)
            moves.add_(window.moves)
            big.add_(window.big)
            moved = window.offset > 0
            num_sym.masked_fill_(moved, 0)
            left = moved if W == 1 else window.offset >= W
            return left & (frame < lens)

        active = frame < lens
        while bool(active.any()):
            lm_labels = None if lm is None else lm.labels
            window = self.follow_blanks(
                ctx, dec_proj, frame, num_sym, active, lm_labels
            )
            arcs = window.arcs
            searching = take(window)
            # inner loop: blank arcs, joint network only
            calls = 1
            while calls < max_inner and bool(searching.any()):
                window = self.follow_blanks(
                    ctx, dec_proj, frame, num_sym, searching, lm_labels
                )
                arcs = window.arcs.where(searching, arcs)
                searching = take(window)
                calls += 1
            # every active row that is not still searching stands at a label arc:
            # record it, one prediction step
            emit = (frame < lens) & ~searching
            if iteration == labels.size(1):
                labels = torch.cat([labels, torch.full_like(labels, -1)], dim=1)
                timing = torch.cat([timing, torch.zeros_like(timing)], dim=1)
            labels[:, iteration] = torch.where(emit, arcs.symbol, no_label)
            score.add_(torch.where(emit, arcs.score, 0.0))
            moved = torch.where(emit, arcs.frames, 0)  # TDT: a label's duration
            acoustic = arcs.score
            if lm_labels is not None:
                acoustic = (
                    acoustic - lm_labels.gather(1, arcs.symbol.unsqueeze(1))[:, 0]
                )
            timing[:, iteration, 0] = frame
            timing[:, iteration, 1] = moved
            timing[:, iteration, 2] = acoustic
            iteration += 1
            frame.add_(moved)
            moves.add_(moved > 0)
            num_sym = torch.where(moved > 0, 0, num_sym + emit.long())
            emitted = torch.where(emit, arcs.symbol, blank)
            new_proj, new_state = stepper.step(emitted, state)
            dec_proj = torch.where(emit.unsqueeze(1), new_proj, dec_proj)
            state = stepper.where_state(emit, new_state, state)
            if lm is not None:
                lm = fusion.where(emit, fusion.step(emitted, lm), lm)
            active = frame < lens

        if lm is not None:  # every hypothesis is complete: the end of the sentence
            score.add_(lm.end.double())

        out_labels = labels[:, :iteration].tolist()
        out_timing = timing[:, :iteration].tolist()
        # every arc that moved covered one frame more than it skipped
        skipped = frame - moves
        values = [t.tolist() for t in (score, frame, num_sym, big, skipped)]
        return [
            Hypothesis(
                score=values[0][b],
                yseq=[blank] + [k for k in out_labels[b] if k >= 0],
                timing=[
                    (int(t), int(e), lp)
                    for k, (t, e, lp) in zip(out_labels[b], out_timing[b])
                    if k >= 0
                ],
                dec_state=stepper.select_state(state, torch.tensor([b], device=device)),
                dec_proj=dec_proj[b],
                frame=values[1][b],
                num_sym_frame=values[2][b],
                big_blank_emissions=values[3][b],
                frames_skipped=values[4][b],
                lm_state=(
                    None
                    if lm is None
                    else fusion.select(lm, torch.tensor([b], device=device))
                ),
            )
            for b in range(B)
        ]


class MultiblankLabelLoopingSearch(MultiblankRowStep, LabelLoopingGreedySearch):
    """Label-looping multi-blank greedy search: the hypotheses of
    :class:`~espnet_multiblank.decoding.MultiblankGreedySearch` (standard RNN-T
    without big blanks).

    Args: those of :class:`LabelLoopingGreedySearch`, and ``blank_decision``
    (``"total"`` or ``"symbol"``, see
    :mod:`~espnet_multiblank.decoding.multiblank_table`).
    """

    def __init__(
        self,
        stepper,
        lattice,
        max_sym_per_frame: int = 10,
        blank_decision: str = "total",
        window: Optional[int] = None,
        max_inner: Optional[int] = None,
        fusion=None,
    ):
        super().__init__(
            stepper,
            lattice,
            max_sym_per_frame=max_sym_per_frame,
            window=window,
            max_inner=max_inner,
            fusion=fusion,
        )
        self.blank_decision = check_blank_decision(blank_decision)


class TDTLabelLoopingSearch(TDTRowStep, LabelLoopingGreedySearch):
    """Label-looping TDT greedy search: the hypotheses of
    :class:`~espnet_multiblank.decoding.TDTGreedySearch`. A label arc with a
    duration >= 1 moves its utterance on when it is recorded (outer loop).

    Args: those of :class:`LabelLoopingGreedySearch` with a
    :class:`~espnet_multiblank.lattice.TDTLattice` (``stepper.vocab_size`` = V + D).
    """

    def __init__(
        self,
        stepper,
        lattice: TDTLattice,
        max_sym_per_frame: int = 10,
        blank_decision: str = TDT_GREEDY_DECISION,
        window: Optional[int] = None,
        max_inner: Optional[int] = None,
        fusion=None,
    ):
        super().__init__(
            stepper,
            lattice,
            max_sym_per_frame=max_sym_per_frame,
            window=window,
            max_inner=max_inner,
            fusion=fusion,
        )
        self.blank_decision = check_blank_decision(blank_decision)
