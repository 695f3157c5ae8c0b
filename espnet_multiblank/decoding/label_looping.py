"""Label-looping greedy search (Bataev et al. 2024, arXiv 2406.06220), batched.

The greedy search (:mod:`~espnet_multiblank.decoding.greedy`, every lattice kind)
decodes a batch with these loops, which take each utterance's steps of the
one-utterance loop in an order where the prediction network runs once per emitted
label, for the whole batch at once:

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
is :meth:`~espnet_multiblank.decoding.base.TransducerSearch.row_arcs` (the symbol
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
run needs. On a GPU that is the paper's trade: a call costs kernel launches, the
prediction network runs once per label. On a CPU, where each call is a fixed cost of
small operations, ``max_inner`` = K ends the inner loop after K joint calls: the
utterances that found their label emit it and run the prediction network, the others
go on searching in the next outer iteration (the arcs taken are the same for every
K; K = 1 with W = 1 takes one step of every utterance per iteration, the frame-looping
order). Default: no limit on an accelerator; on a CPU 3 (W = 1) or 1 (W > 1),
measured on the digits recipe's models (``docs/decoding.md``).

The loops (:meth:`GreedySearch.run_loops
<espnet_multiblank.decoding.greedy.GreedySearch.run_loops>`) work on fixed-size
batch tensors with masks (an utterance that has ended
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

from typing import Optional

import torch

from espnet_multiblank.decoding.base import check_positive_int
from espnet_multiblank.decoding.greedy import GreedySearch, Window
from espnet_multiblank.decoding.tables import Arcs, RowNodes
from espnet_multiblank.lattice import is_lattice


def _repeat_rows(x: torch.Tensor, W: int) -> torch.Tensor:
    """(B, N) -> (B * W, N): every row W times in a row."""
    B, N = x.shape
    return x.unsqueeze(1).expand(B, W, N).reshape(B * W, N)


class LabelLoopingGreedySearch(GreedySearch):
    """Label-looping greedy search of every lattice (module docstring): the
    :class:`~espnet_multiblank.decoding.greedy.GreedySearch` (its hypotheses, its
    loops, its one-utterance :meth:`search`) with a window of W frames and a limit
    on the inner loop of one's choosing (``MultiblankLabelLoopingSearch`` and
    ``TDTLabelLoopingSearch`` are its former names). A TDT label arc with a duration
    >= 1 moves its utterance on when it is recorded (outer loop).

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
        if self.window > 1 and device.type == "cpu":
            return 1
        return super().inner_limit(device)

    def _follow_blanks(self, ctx, dec_proj, frame, num_sym, rows, lm_labels=None):
        """:meth:`GreedySearch._follow_blanks
        <espnet_multiblank.decoding.greedy.GreedySearch._follow_blanks>` over a
        window of W frames: one joint call for B * W rows, then the blank arcs
        followed through the window."""
        if self.window == 1:
            return super()._follow_blanks(
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


def greedy_search_class(lattice, loop_labels: bool) -> type:
    """The greedy search of ``lattice`` (frame-looping, or label-looping with
    ``loop_labels``): every lattice has both; anything else is refused."""
    if not is_lattice(lattice):
        raise TypeError(f"no greedy search for a {type(lattice).__name__}")
    return LabelLoopingGreedySearch if loop_labels else GreedySearch
