"""Greedy search of every lattice: the one-utterance loop and the batch loops.

Algorithm (Xu et al. 2023, "multi-blank greedy"; ``docs/decoding.md``): a hypothesis
sits at frame t with label history y and emits one allowed symbol k of
``log_softmax(joint(enc[t], pred(y)))``, decided by ``blank_decision``
(:mod:`~espnet_multiblank.decoding.tables`; default ``"total"``: a blank
when the allowed blanks together are at least as probable as the best label, then the
most probable blank; ``"symbol"``: the arg-max symbol):

* a label: y <- y + [k], the prediction network advances, t stays (at most
  ``max_sym_per_frame`` labels per frame; after that only blanks are allowed);
* the standard blank: t <- t + 1;
* big blank i: t <- t + d_i (d_i - 1 frames are never evaluated); big blanks that would
  jump past the last frame (t + d_i > T) are not allowed, so the path is a path of the
  loss's lattice and its score is that path's log-probability.

It stops when t == T.

Batches (:meth:`GreedySearch.search_batch`) run the label-looping loops
(:mod:`~espnet_multiblank.decoding.label_looping`, Bataev et al. 2024) with a window
of one frame: the same arcs of every utterance, taken in another order. An *inner
loop* evaluates the joint network for the whole batch and every row whose arc is a
blank takes it (at most :meth:`~GreedySearch.inner_limit` calls: 3 on a CPU, no
limit on an accelerator); then the *outer loop* records the rows' labels and runs the
prediction network once for the batch. The rows are fixed-size tensors with masks
(:class:`LoopState`), so the only host synchronisations are the loop conditions.
Every utterance takes the steps of the one-utterance loop (tested).

A token-and-duration transducer (TDT; ``docs/decoding.md``, "TDT searches") takes the
same loop with (token, duration) arcs: the joint network gives token log-probabilities
``tok`` (V) and duration log-probabilities ``dur`` (D), and the search emits one
allowed arc (token k, duration e_j) chosen by ``blank_decision``
(:mod:`~espnet_multiblank.decoding.tables`): ``"total"`` (default) the most
probable token, each counted with the total probability of the durations it may take,
then its most probable allowed duration; ``"symbol"`` the most probable allowed arc
``tok[k] + dur[j]``. Allowed: a blank takes durations >= 1 that do not pass T; a label
takes durations that land before T (>= 1 once ``max_sym_per_frame`` labels stayed at
this frame). A label extends y; every arc moves t to ``t + e_j``; the hypothesis ends
when it reaches T, always with a blank, as a path of the loss's lattice.

Differences from NeMo's TDT greedy search (token arg-max first, then duration
arg-max; a blank with duration 0 moved by one frame; durations that overshoot T end
the utterance): here a token counts with the durations it may take (a blank's
probability excludes duration 0), and a path ends with a blank landing on T.

The step of each lattice is its symbol table's (``one_outputs``, ``one_choice``);
the loop, the stream's early decisions and the bookkeeping are here, once.
:meth:`GreedySearch.run_one` takes the steps of one utterance on a :class:`OneRun`:
offline it runs to T in one call; a stream
(:class:`~espnet_multiblank.decoding.streaming.StreamingRowGreedySearch`) calls it
as frames arrive, with a :class:`StepCache` that its provisional copies share. The
loops of a batch run on a :class:`LoopState`, which the label-looping stream
(:class:`~espnet_multiblank.decoding.streaming.StreamingGreedySearch`) keeps across
chunks.

Notation: B = utterances, T = encoder frames, J = joint space, V = joint outputs,
W = window (1 here).
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch

from espnet_multiblank.decoding.base import TransducerSearch, check_batch
from espnet_multiblank.decoding.fusion import FusionState
from espnet_multiblank.decoding.hypothesis import Hypothesis, TokenTiming
from espnet_multiblank.decoding.tables import Arcs, RowNodes

#: a score term that T decides: (frame t, {min(T - t, cap): value}, and for a
#: label whose timing holds it: (index in ``timing``, frames covered, LM part))
PendingTerm = Tuple[int, Dict[int, float], Optional[Tuple[int, int, float]]]


class StepCache:
    """What a stream's runs (the decided run and its provisional copies) compute
    more than once, kept for the next one: a step that waits for frames is
    evaluated again when they arrive, and a provisional run takes steps that the
    decided run takes later. Only steps near the last frame received are kept
    (the others are taken once). The same inputs give the same outputs, so reading
    them here changes no result (bit for bit).

    Attributes:
        steps: ``(t, labels, labels at t)`` -> ``[joint-network outputs, what the
            search derived from them, ...]`` (the search's own layout).
        labels: label sequence (with the start symbol) -> ``(t, the prediction
            network's (1, J) output and state, the fused LMs' state)`` after it
            (t: the frame of its last label).
        low: The first frame of anything kept (no lookup before it).
    """

    def __init__(self):
        self.steps: Dict[Tuple[int, Tuple[int, ...], int], list] = {}
        self.labels: Dict[Tuple[int, ...], Tuple[int, torch.Tensor, Any, Any]] = {}
        self.low = math.inf

    def key(self, hyp: Hypothesis) -> Tuple[int, Tuple[int, ...], int]:
        """The key of the step a hypothesis takes next."""
        return hyp.frame, tuple(hyp.yseq), hyp.num_sym_frame

    def put_step(self, key: Tuple[int, Tuple[int, ...], int], info: list) -> None:
        self.steps[key] = info
        self.low = min(self.low, key[0])

    def put_labels(self, key: Tuple[int, ...], t: int, outputs: tuple) -> None:
        self.labels[key] = (t,) + outputs
        self.low = min(self.low, t)

    def prune(self, frame: int, labels: int) -> None:
        """Forget the steps before ``frame`` and the label sequences shorter than
        ``labels`` (a decided run never goes back to them); nothing while all
        that is kept lies at ``frame`` or later."""
        if self.low >= frame:
            return
        self.steps = {k: v for k, v in self.steps.items() if k[0] >= frame}
        self.labels = {k: v for k, v in self.labels.items() if len(k) >= labels}
        frames = [k[0] for k in self.steps] + [v[0] for v in self.labels.values()]
        self.low = min(frames, default=math.inf)


@dataclasses.dataclass
class OneRun:
    """The state of a one-utterance greedy search between steps
    (:meth:`GreedySearch.run_one`).

    Attributes:
        hyp: The hypothesis so far (frame, labels, score, timing).
        dec_proj: (1, J) projected prediction-network output after its labels.
        state: The prediction network's state after them (the stepper's type).
        lm: The fused language models' state after them, or None.
        terms: Score terms not yet added to ``hyp.score``, in step order: a step
            decided before T was known (a stream) can have a score that T decides
            (a blank's total over the blanks T allows), and the terms after it wait
            with it, so that the score is added up in the offline order.
        cache: A stream's :class:`StepCache` (shared with the run's copies), or
            None (offline).
    """

    hyp: Hypothesis
    dec_proj: torch.Tensor
    state: Any
    lm: Optional[FusionState]
    terms: List[Union[float, PendingTerm]] = dataclasses.field(default_factory=list)
    cache: Optional["StepCache"] = None

    def add(self, term: float) -> None:
        """The score of the next step."""
        if self.terms:
            self.terms.append(term)
        else:
            self.hyp.score += term

    def fold(self, length: int, final: bool, cap: int) -> None:
        """Add the terms T now decides, in order: every term once ``final``
        (T = ``length``), else those of frames t <= ``length`` - ``cap``."""
        done = 0
        for term in self.terms:
            if isinstance(term, tuple):
                t, values, timing = term
                if final:
                    value = values[min(length - t, cap)]
                elif length - t >= cap:
                    value = values[cap]
                else:
                    break
                if timing is not None:
                    index, frames, lm_part = timing
                    self.hyp.timing[index] = (t, frames, value - lm_part)
                term = value
            self.hyp.score += term
            done += 1
        del self.terms[:done]

    def copy(self) -> "OneRun":
        """An independent copy (the tensors are shared: a step makes new ones)."""
        hyp = dataclasses.replace(
            self.hyp, yseq=list(self.hyp.yseq), timing=list(self.hyp.timing)
        )
        return OneRun(
            hyp, self.dec_proj, self.state, self.lm, list(self.terms), self.cache
        )


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
    """Constant tensors of one :meth:`GreedySearch.search_batch` call.

    ``padded``: ``enc_proj`` already has at least :meth:`padding` frames after every
    row's length (the streaming search's buffer; it is then used as it is, not
    copied, so frames written into it later and ``lens`` updated in place are
    seen)."""

    @staticmethod
    def padding(W: int, table) -> int:
        """Frames a row may read after its length: a window's, and one arc's past
        its end (non-finite joint outputs can choose an arc that its T forbids;
        the row then stops there)."""
        return W + table.max_frames

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
        # a row reads frames t .. t + W - 1 with t <= T_b <= T_max (what it reads
        # past T_b is ignored), or t < T_b + max_frames after an arc that its T
        # forbids
        if padded:
            self.enc_proj = enc_proj
        else:
            pad = enc_proj.new_zeros(B, self.padding(W, table), enc_proj.size(2))
            self.enc_proj = torch.cat([enc_proj, pad], 1)  # (B, T_max + padding, J)
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
    :meth:`GreedySearch.run_loops` (the streaming search keeps one
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


class GreedySearch(TransducerSearch):
    """Greedy search of every lattice (see the module docstring): one utterance
    at a time with :meth:`search_one` (a plain Python loop), and B at once with
    :meth:`search_batch` (the label-looping loops with a window of one frame); the
    arc of a joint row is :meth:`TransducerSearch.row_arcs` in both.

    Args: those of :class:`~espnet_multiblank.decoding.base.TransducerSearch`
    (``blank_decision``: ``"total"`` (default) or ``"symbol"``). With a TDT
    (``stepper.vocab_size`` = V + D) ``max_sym_per_frame`` counts the labels that
    stay (duration 0) at one frame; after that every emission moves on.
    """

    batched = True
    #: frames the inner loop evaluates per joint call and row
    #: (:class:`~espnet_multiblank.decoding.label_looping.LabelLoopingGreedySearch`
    #: chooses it)
    window = 1
    #: first label-buffer capacity, in outer iterations (doubled when full)
    initial_capacity = 32

    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        return [self.search_one(enc_out)]

    def search_one(self, enc_out: torch.Tensor) -> Hypothesis:
        """Greedy search for one utterance (a plain Python loop: no batch overhead).

        Args:
            enc_out: (T, D_enc) encoder output.
        """
        return self._one_projected(self.stepper.project_enc(enc_out))

    @torch.no_grad()
    def _one_projected(self, enc_proj: torch.Tensor) -> Hypothesis:
        """:meth:`search_one` on (T, J) projected encoder frames."""
        run = self.start_one(enc_proj.device)
        self.run_one(run, enc_proj, enc_proj.size(0))
        return self.finish_one(run)

    def start_one(self, device: torch.device) -> OneRun:
        """The state of a one-utterance search before the first frame."""
        dec_proj, state = self.start(1, device)
        hyp = Hypothesis(score=0.0, yseq=[self.blank_id])
        return OneRun(hyp, dec_proj, state, self.start_lm(1, device))

    @torch.no_grad()
    def run_one(
        self, run: OneRun, enc_proj: torch.Tensor, length: int, final: bool = True
    ) -> None:
        """Take the steps of one utterance (in place) up to frame ``length``: the
        one-utterance loop, the same arcs as the table's ``best_arcs``.

        Offline (``final``): ``length`` is T and the run ends at T. A stream
        (``final`` false) has received ``length`` = N frames and its T >= N is not
        known yet. A step at frame t depends on T only through ``min(T - t, R)`` (R
        + 1 for a TDT): at t <= N - R that is R whatever T is, and the step is
        taken; nearer to N, the step is taken if its arc is the one every T >= N
        gives (its score, when T changes it, is held in ``run.terms``), else the run
        stops there until more frames arrive. Each step taken is the one the whole
        utterance takes, so the run ends as offline, bit for bit.

        Args:
            run: The search's state (modified).
            enc_proj: (>= length, J) projected encoder frames.
            length: T, or the frames received N.
            final: Whether ``length`` is T.
        """
        device = enc_proj.device
        table = self.table(device)
        stepper = self.stepper
        cap = table.room_cap  # the step depends on T via min(T - t, cap)
        max_sym = self.max_sym_per_frame
        decision = self.blank_decision
        run.fold(length, final, cap)
        hyp, dec_proj, state, lm = run.hyp, run.dec_proj, run.state, run.lm
        cache = run.cache
        one_outputs, one_choice = table.one_outputs, table.one_choice
        early_choice = table.early_choice

        def choose(info, guarded: bool, room: int):
            """The table's choice with min(T - t, cap) = ``room``, kept in the
            step's ``info`` (a stream evaluates a step again with more frames)."""
            choices = info[1]
            out = choices.get(room)
            if out is None:
                out = one_choice(info[0], room, guarded, max_sym, decision)
                choices[room] = out
            return out

        while hyp.frame < length:
            t = hyp.frame
            tail = t > length - cap  # near the last frame: other runs may take it
            info = key = None  # a stream's [joint outputs, choices by room]
            if cache is not None and t >= cache.low:
                key = cache.key(hyp)
                info = cache.steps.get(key)
            if info is None:
                outputs = one_outputs(
                    stepper, enc_proj[t : t + 1], dec_proj, lm, decision
                )
                if cache is not None and tail:  # (a step before it is not asked again)
                    info = [outputs, {}]
                    cache.put_step(cache.key(hyp) if key is None else key, info)
            else:
                outputs = info[0]
            guarded = hyp.num_sym_frame >= max_sym
            room = length - t
            if final or room >= cap:
                if info is None:  # offline, or not near the last frame: taken once
                    choice = one_choice(
                        outputs, min(room, cap), guarded, max_sym, decision
                    )
                else:
                    choice = choose(info, guarded, min(room, cap))
                is_label, k, _, frames, score = choice
                pending = None
            else:  # T decides which arcs fit: taken if every T >= N agrees
                if info is None:
                    info = [outputs, {}]
                early = early_choice(info[0], room, guarded, max_sym, decision, info[1])
                if early is None:
                    break  # this step waits for more frames
                (is_label, k, _, frames, score), pending = early
            if is_label:
                hyp.yseq.append(k)
                lm_k = 0.0 if lm is None else float(lm.labels[0, k])
                if pending is None:
                    run.add(score)
                else:
                    run.terms.append((t, pending, (len(hyp.timing), frames, lm_k)))
                hyp.timing.append((t, frames, score - lm_k))
                dec_proj, state, lm = self._emit_one(
                    run, k, dec_proj, state, lm, device, tail
                )
                if frames == 0:
                    hyp.num_sym_frame += 1
                else:
                    hyp.advance(frames, is_label=True)
            else:
                if pending is None:
                    run.add(score)
                else:
                    run.terms.append((t, pending, None))
                hyp.advance(frames)
        if hyp.frame > length:  # NaN outputs chose an arc past the end (score NaN)
            hyp.frame = length
        run.dec_proj, run.state, run.lm = dec_proj, state, lm

    def _emit_one(
        self, run: OneRun, label: int, dec_proj, state, lm, device, keep: bool
    ) -> Tuple[torch.Tensor, Any, Any]:
        """The prediction network's output and state and the LMs' state after
        ``label`` (already appended to ``run.hyp.yseq``, emitted at frame t), from
        the stream's cache when one of its runs has computed them; ``keep``: put
        them there (t is near the last frame received)."""
        cache = run.cache
        t = run.hyp.timing[-1][0]
        key = None
        if cache is not None and t >= cache.low:
            key = tuple(run.hyp.yseq)
            got = cache.labels.get(key)
            if got is not None:
                return got[1:]
        labels = torch.full((1,), label, dtype=torch.long, device=device)
        dec_proj, state = self.stepper.step(labels, state)
        if lm is not None:
            lm = self.fusion.step(labels, lm)
        if cache is not None and keep:
            key = tuple(run.hyp.yseq) if key is None else key
            cache.put_labels(key, t, (dec_proj, state, lm))
        return dec_proj, state, lm

    def finish_one(self, run: OneRun) -> Hypothesis:
        """The end of a one-utterance search (every frame consumed): its hypothesis
        with the prediction network's state and output after the last label, and
        with an LM its state and the end-of-sentence score."""
        if run.terms:
            raise ValueError("the run has not ended (run_one with final=True)")
        hyp = run.hyp
        hyp.dec_state = run.state
        hyp.dec_proj = run.dec_proj[0]
        if run.lm is not None:
            hyp.score += float(run.lm.end[0])
            hyp.lm_state = run.lm
        return hyp

    @torch.no_grad()
    def search_batch(
        self, enc_out: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """Greedy search for B utterances at once: the loops (module docstring).

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
        what the label-looping stream decides on, chunk by chunk."""
        B = enc_proj.size(0)
        loop = self.init_loop(B, enc_proj.device)
        ctx = LoopBatch(self.table(enc_proj.device), enc_proj, lens, self.window)
        self.run_loops(ctx, loop, lens)
        self.finish_loop(loop)
        return self.hypotheses(loop, *loop.drain())

    def inner_limit(self, device: torch.device) -> float:
        """Joint-network calls per outer iteration (module docstring): no limit on
        an accelerator, 3 on a CPU."""
        return float("inf") if device.type != "cpu" else 3

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
        row's end or the window's end (here W = 1: the arc at ``t``, taken if a
        blank).

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
        enc_rows = ctx.enc_proj[ctx.rows, frame]
        nodes = RowNodes(enc_rows, dec_proj, frame, ctx.lens, num_sym, lm_labels)
        arcs = self.row_arcs(ctx.table, nodes)
        blank = rows & ~arcs.is_label
        moved = torch.where(blank, arcs.frames, 0)
        score = torch.where(blank, arcs.score, 0.0)
        return Window(moved, score, blank, moved > 1, arcs)

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
        # every outer iteration a ready row emits a label or moves on, and takes at
        # most max_sym_per_frame labels at a frame: past this many iterations the
        # rows still ready take arcs their rules forbid (non-finite joint outputs
        # choose any arc), and they end where they are, their score NaN
        iterations = (self.max_sym_per_frame + 1) * (ctx.enc_proj.size(1) + 1)
        while bool(ready.any()):
            if iterations == 0:
                loop.score.masked_fill_(ready, math.nan)
                loop.frame = torch.where(
                    ready, torch.maximum(loop.frame, limit), loop.frame
                )
                break
            iterations -= 1
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
