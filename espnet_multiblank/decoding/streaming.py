"""Streaming search: the package's searches over encoder frames that arrive in chunks.

A search decides at frame t of an utterance of T frames from the frames it has and
from T, and T enters only through ``min(T - t, R)`` (multi-blank and standard
lattices, R = the longest blank; :meth:`SymbolTable.best_arcs`) or ``min(T - t, R +
1)`` (TDT, R = the longest duration; :meth:`TDTSymbolTable.best_arcs`). So once
N >= t + L frames have arrived (L = :func:`decision_lookahead`), the arcs chosen at
frame t are those the search would choose with the whole utterance, whatever T turns
out to be: the streaming searches take every step at frames t <= N - L as soon as it
is decided, leave the rest (a big blank or a TDT duration may have carried a row past
frame N - L: it waits there), and when the stream ends finish with the true T (and
the language models' end of sentence). The final hypothesis of a stream is then the
offline search's on the same encoder frames: the same arcs, taken in the same order,
the same scores (tested bit for bit against :meth:`GreedySearch.search_projected`,
the one-utterance loop and :meth:`BeamSearch.nbest_projected`).

* :class:`StreamingGreedySearch`: label-looping greedy search (every lattice) over a
  fixed number of rows, one stream per row; streams start and end independently
  (:meth:`~StreamingGreedySearch.reset`). A label-looping window of W > 1 frames is
  evaluated only when all its frames are decided (L + W - 1 frames of look-ahead
  for the next step), so it groups the arcs as the offline search does.
* :class:`StreamingRowGreedySearch`: the same for a frame-looping greedy search:
  each row runs the one-utterance loop (:meth:`GreedySearch.run_one`)
  on its own, taking also the steps inside the look-ahead that no T >= N can change
  (the faster loop on a CPU).
* :class:`StreamingBeamSearch`: the frame-synchronous beam search (multi-blank and
  TDT, with LM fusion), each row its own stream: the frame queues are carried across
  chunks; frames t <= N - R - 1 are expanded (no arc lands on frame N before the
  stream ends, so no hypothesis is completed too early).

All three have the row interface of :class:`StreamingSearch`;
:func:`streaming_rows` gives the one a search streams with, and
:func:`streamable` the search that streams in place of an offline one.

All give a *provisional* hypothesis at any time: a copy of the undecided state run
to the last frame received as if the stream ended there (the offline result for the
audio so far). The decided labels lag the last frame received by up to L frames (8
frames of 40 ms = 320 ms for big blanks [2, 4, 8]; the row search less where T
cannot change a step); the provisional ones do not.

Encoder frames are given *projected* (``stepper.project_enc``): the searches decide
on projected frames, and projecting each chunk as it arrives gives, to float
rounding, what projecting the whole utterance gives.

Notation: B = rows (streams), N = frames received, J = joint space size.
"""

import dataclasses
from abc import ABC, abstractmethod
from typing import List, Optional, Sequence

import torch

from espnet_multiblank.decoding.beam import BeamSearch, Queue
from espnet_multiblank.decoding.greedy import GreedySearch, LoopBatch, StepCache
from espnet_multiblank.decoding.hypothesis import Hypothesis, TokenTiming
from espnet_multiblank.decoding.label_looping import (
    LabelLoopingGreedySearch,
    greedy_search_class,
)


def decision_lookahead(search) -> int:
    """L: frames past frame t that must have arrived before ``search`` decides at t
    as it would with the whole utterance (module docstring): R for the multi-blank
    and standard greedy search (1 without big blanks), R + 1 for a TDT's and for the
    beam searches (which must also not complete a hypothesis at the last frame
    received)."""
    lattice = search.lattice
    if isinstance(search, BeamSearch):
        return max(lattice.room_cap, lattice.max_frames + 1)
    return lattice.room_cap


def frames_with_room(
    buf: torch.Tensor, used: int, needed: int, first: int, dim: int = 0
) -> torch.Tensor:
    """``buf`` when it holds ``needed`` frames along ``dim``, else a zero buffer of
    ``max(first, 2 * capacity, needed)`` frames with ``buf``'s first ``used`` copied:
    a stream's frames grow by doubling (appending costs amortised O(1) per frame,
    not a copy of the whole stream per chunk)."""
    capacity = buf.size(dim)
    if needed <= capacity:
        return buf
    shape = list(buf.shape)
    shape[dim] = max(first, 2 * capacity, needed)
    grown = buf.new_zeros(shape)
    grown.narrow(dim, 0, used).copy_(buf.narrow(dim, 0, used))
    return grown


def _check_frames(name: str, frames: torch.Tensor, J: Optional[int]) -> None:
    if frames.dim() != 2 or (J is not None and frames.size(1) != J):
        want = "(n, J)" if J is None else f"(n, {J})"
        raise ValueError(
            f"{name} must be {want} projected encoder frames, got "
            f"{tuple(frames.shape)}"
        )


class StreamingSearch(ABC):
    """The row interface of the streaming searches: ``batch`` rows, each row one
    stream at a time; streams start and end independently.

    A row's stream: :meth:`reset` starts it, :meth:`append` gives it its next
    frames, :meth:`end` (or ``append(..., final=True)``) ends it; :meth:`advance`
    takes the steps the frames received decide, in every row, and completes the
    ended streams; then :meth:`done`, :meth:`hypotheses` (the n-best list) and
    :meth:`hypothesis` (its best). :meth:`provisional` gives each row's labels as if
    its stream ended at the last frame received, :attr:`tokens` the labels decided
    for good. Rows are ready for a stream when built.

    Args:
        search: The search the rows run (a :attr:`search_class`; others raise
            ``TypeError``).
        batch: B, the rows.
        device: Where the search runs.

    Attributes:
        search, batch, device: The arguments.
        lookahead: L (:func:`decision_lookahead`).
        received: (B,) ints, frames appended to each row since its reset.
        tokens: (B,) lists of int, each row's decided labels (a prefix of its final
            labels).
    """

    #: the class of the searches the rows run
    search_class: type
    #: first frame capacity per row (doubled when full)
    initial_frames = 64

    def __init__(self, search, batch: int, device):
        kind = self.search_class
        if not isinstance(search, kind):
            raise TypeError(
                f"search must be a {kind.__name__}, got {type(search).__name__}"
            )
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        self.search = search
        self.batch = batch
        self.device = torch.device(device)
        self.lookahead = decision_lookahead(search)

    @abstractmethod
    def reset(self, rows: Sequence[int]) -> None:
        """Start new streams in ``rows``: their state as before the first frame."""

    @abstractmethod
    def append(self, row: int, enc_proj: torch.Tensor, final: bool = False) -> None:
        """Frames for one row's stream.

        Args:
            row: The row.
            enc_proj: (n, J) float, its next projected encoder frames (n >= 0; J
                the same in every call).
            final: The stream ends after them.

        Raises:
            ValueError: frames of another shape, or the row's stream has ended.
        """

    @abstractmethod
    def end(self, row: int) -> None:
        """The row's stream has ended (after its last :meth:`append`)."""

    @abstractmethod
    def advance(self) -> None:
        """Take every step the frames received decide, in every row; complete the
        rows whose stream has ended."""

    @abstractmethod
    def done(self, row: int) -> bool:
        """Whether the row's stream has ended and been completed."""

    @abstractmethod
    def hypothesis(self, row: int) -> Hypothesis:
        """The best final hypothesis of a completed row (the offline search's on
        its frames).

        Raises:
            ValueError: the row is not complete (:meth:`done`).
        """

    def hypotheses(self, row: int) -> List[Hypothesis]:
        """The n-best list of a completed row, best first (a greedy search's: its
        one hypothesis)."""
        return [self.hypothesis(row)]

    @abstractmethod
    def provisional(self, rows: Optional[Sequence[int]] = None) -> List[List[int]]:
        """(B,) lists of int: each row's labels if its stream ended at the last
        frame received. The search may run only ``rows`` (default: all); another
        row may give its decided labels (:attr:`tokens`)."""


class StreamingGreedySearch(StreamingSearch):
    """Label-looping greedy search over ``batch`` streams (module docstring), the
    rows of one label-looping batch.

    Args:
        search: A label-looping search (any lattice, LM fusion included).
        batch: Rows: streams decoded together.
        device: Where the search runs.

    Attributes: those of :class:`StreamingSearch` (``received``: a (B,) long
    tensor), and ``final``: (B,) bool, the rows whose stream has ended.
    """

    search_class = LabelLoopingGreedySearch

    def __init__(
        self, search: LabelLoopingGreedySearch, batch: int, device: torch.device
    ):
        super().__init__(search, batch, device)
        self.loop = search.init_loop(batch, self.device)
        # the state before the first frame, computed for the whole batch as the
        # offline search computes it (a batch of one could round differently)
        self._fresh = search.init_loop(batch, self.device)
        # (B, capacity, J), with at least LoopBatch.padding frames after every
        # row's last frame
        self.enc_proj: Optional[torch.Tensor] = None
        self._padding = LoopBatch.padding(search.window, search.table(self.device))
        self._ctx: Optional[LoopBatch] = (
            None  # the loops' view of it (rebuilt on growth)
        )
        self.received = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.final = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self._ended = [False] * batch  # end of sentence scored
        self.tokens: List[List[int]] = [[] for _ in range(batch)]
        self.timings: List[List[TokenTiming]] = [[] for _ in range(batch)]

    def reset(self, rows: Sequence[int]) -> None:
        """Start new streams in ``rows``: their state as before the first frame."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        if idx.numel() == 0:
            return
        loop, fresh, search = self.loop, self._fresh, self.search
        for name in ("frame", "num_sym", "score", "moves", "big"):
            getattr(loop, name)[idx] = 0
        loop.dec_proj[idx] = fresh.dec_proj[idx]
        search.stepper.scatter_state(
            loop.state, idx, search.stepper.select_state(fresh.state, idx)
        )
        if loop.lm is not None:
            search.fusion.scatter(loop.lm, idx, search.fusion.select(fresh.lm, idx))
        self.received[idx] = 0
        self.final[idx] = False
        for r in idx.tolist():
            self._ended[r] = False
            self.tokens[r] = []
            self.timings[r] = []

    def append(self, row: int, enc_proj: torch.Tensor, final: bool = False) -> None:
        if self.final[row]:
            raise ValueError(f"row {row}: its stream has ended (reset it first)")
        J = None if self.enc_proj is None else self.enc_proj.size(2)
        _check_frames("enc_proj", enc_proj, J)
        n = enc_proj.size(0)
        start = int(self.received[row])
        if n:
            self._reserve(start + n + self._padding, enc_proj)
            self.enc_proj[row, start : start + n] = enc_proj
            self.received[row] = start + n
        if final:
            self.final[row] = True

    def end(self, row: int) -> None:
        self.final[row] = True

    def _reserve(self, frames: int, like: torch.Tensor) -> None:
        buf = self.enc_proj
        if buf is None:
            buf = like.new_zeros(self.batch, 0, like.size(1))
        grown = frames_with_room(buf, buf.size(1), frames, self.initial_frames, dim=1)
        if grown is not self.enc_proj:
            self.enc_proj, self._ctx = grown, None

    def _context(self) -> LoopBatch:
        table, W = self.search.table(self.device), self.search.window
        if self.enc_proj is None:  # no frame yet anywhere: zero frames to read
            enc = torch.zeros(
                self.batch,
                self._padding,
                self.loop.dec_proj.size(1),
                device=self.device,
            )
            enc = enc.to(self.loop.dec_proj.dtype)
            return LoopBatch(table, enc, self.received, W, padded=True)
        if self._ctx is None:
            # the buffer itself, not a copy: appended frames and the in-place
            # updates of ``received`` reach the loops without rebuilding it
            self._ctx = LoopBatch(table, self.enc_proj, self.received, W, padded=True)
        return self._ctx

    def _limit(self) -> torch.Tensor:
        """(B,) the frame below which a row may take its next window."""
        undecided = self.lookahead + self.search.window - 2
        return torch.where(self.final, self.received, self.received - undecided)

    @torch.no_grad()
    def advance(self) -> None:
        """Take every step the frames received decide; complete the rows whose
        stream has ended (their hypotheses: :meth:`hypothesis`)."""
        self.search.run_loops(self._context(), self.loop, self._limit())
        final = self.final.tolist()  # one host read, not one per row
        ending = [b for b in range(self.batch) if final[b] and not self._ended[b]]
        if ending:
            rows = torch.zeros(self.batch, dtype=torch.bool, device=self.device)
            rows[ending] = True
            self.search.finish_loop(self.loop, rows)
            for b in ending:
                self._ended[b] = True
        for b, (labels, timing) in enumerate(zip(*self.loop.drain())):
            self.tokens[b].extend(labels)
            self.timings[b].extend(timing)

    def done(self, row: int) -> bool:
        return self._ended[row]

    def hypothesis(self, row: int) -> Hypothesis:
        if not self._ended[row]:
            raise ValueError(f"row {row} is not complete (append final, advance)")
        (hyp,) = self.search.hypotheses(
            self.loop, {row: self.tokens[row]}, {row: self.timings[row]}, [row]
        )
        hyp.dec_proj = hyp.dec_proj.clone()  # the row's tensors are reused
        return hyp

    @torch.no_grad()
    def provisional(self, rows: Optional[Sequence[int]] = None) -> List[List[int]]:
        """Each row's labels if its stream ended at the last frame received: the
        decided labels and those of a copy of the state run to the end (every row
        at once, whatever ``rows`` says: one batched run)."""
        loop = self.loop
        copy = loop.empty_copy(
            **{
                n: getattr(loop, n).clone()
                for n in ("frame", "num_sym", "score", "moves", "big")
            }
        )
        self.search.run_loops(self._context(), copy, self.received)
        return [a + b for a, b in zip(self.tokens, copy.drain()[0])]


class StreamingRowGreedySearch(StreamingSearch):
    """The one-utterance greedy loop (:meth:`GreedySearch.run_one`) over
    ``batch`` streams, each row stepped on its own.

    The row interface (:class:`StreamingSearch`) of a frame-looping greedy
    search (multi-blank, standard or TDT; LM fusion included). A row's steps are
    those of :meth:`GreedySearch.search_one` on its frames, each taken
    as soon as no utterance length T >= N can change it (every step at t <= N - L,
    and those inside the look-ahead that T cannot change:
    :meth:`GreedySearch.run_one`), so its final hypothesis is that
    search's, bit for bit. Each row keeps a :class:`StepCache` that its provisional
    runs share. On a CPU it costs a quarter to a third of the label-looping loop per
    stream, also at 16 streams (bench/RESULTS.md); rows are not batched, so on a GPU
    many streams are better served by :class:`StreamingGreedySearch`.

    Args:
        search: A :class:`~espnet_multiblank.decoding.greedy.GreedySearch`.
        batch: Rows: streams decoded side by side.
        device: Where the search runs.

    Attributes: those of :class:`StreamingSearch` (``received``: a list).
    """

    search_class = GreedySearch

    def __init__(self, search: GreedySearch, batch: int, device):
        super().__init__(search, batch, device)
        # the state before the first frame, computed once (the same every time)
        self._fresh = search.start_one(self.device)
        self.runs = [self._fresh.copy() for _ in range(batch)]
        for run in self.runs:
            run.cache = StepCache()
        self._frames: List[Optional[torch.Tensor]] = [None] * batch  # (capacity, J)
        self.received = [0] * batch
        self._advanced = [0] * batch  # frames received at each row's last advance
        self._final = [False] * batch
        self._hyps: List[Optional[Hypothesis]] = [None] * batch

    @property
    def tokens(self) -> List[List[int]]:
        """The decided labels of each row."""
        return [run.hyp.labels for run in self.runs]

    def reset(self, rows: Sequence[int]) -> None:
        for r in rows:
            self.runs[r] = self._fresh.copy()
            self.runs[r].cache = StepCache()
            self.received[r] = 0
            self._advanced[r] = 0
            self._final[r] = False
            self._hyps[r] = None

    def append(self, row: int, enc_proj: torch.Tensor, final: bool = False) -> None:
        if self._final[row]:
            raise ValueError(f"row {row}: its stream has ended (reset it first)")
        buf = self._frames[row]
        _check_frames("enc_proj", enc_proj, None if buf is None else buf.size(1))
        n, start = enc_proj.size(0), self.received[row]
        if n:
            if buf is None:
                buf = enc_proj.new_zeros(0, enc_proj.size(1))
            buf = frames_with_room(buf, start, start + n, self.initial_frames)
            self._frames[row] = buf
            buf[start : start + n] = enc_proj
            self.received[row] = start + n
        if final:
            self._final[row] = True

    def end(self, row: int) -> None:
        self._final[row] = True

    @torch.no_grad()
    def advance(self) -> None:
        search = self.search
        for r, run in enumerate(self.runs):
            if self._hyps[r] is not None:
                continue
            N, frames = self.received[r], self._frames[r]
            if self._final[r]:
                if N:
                    search.run_one(run, frames, N)
                self._hyps[r] = search.finish_one(run)
            elif N > self._advanced[r]:  # else nothing new to decide
                search.run_one(run, frames, N, final=False)
                run.cache.prune(run.hyp.frame, len(run.hyp.yseq))
            self._advanced[r] = N

    def done(self, row: int) -> bool:
        return self._hyps[row] is not None

    def hypothesis(self, row: int) -> Hypothesis:
        if self._hyps[row] is None:
            raise ValueError(f"row {row} is not complete (append final, advance)")
        return self._hyps[row]

    @torch.no_grad()
    def provisional(self, rows: Optional[Sequence[int]] = None) -> List[List[int]]:
        """Each row's labels if its stream ended at the last frame received: a
        copy of its state run to the end (the decided steps are not taken again).
        Only ``rows`` (default: all) are run; the others give their decided
        labels."""
        wanted = range(self.batch) if rows is None else set(rows)
        out = []
        for r, run in enumerate(self.runs):
            N = self.received[r]
            if r in wanted and self._hyps[r] is None and run.hyp.frame < N:
                run = run.copy()
                self.search.run_one(run, self._frames[r], N)
            out.append(run.hyp.labels)
        return out


class _BeamStream:
    """One stream of :class:`StreamingBeamSearch`: its frame queues, frames and
    n-best list.

    Attributes:
        queues: Q[0 .. N] (:meth:`BeamSearch.start_queues`), None for the
            frames expanded.
        enc_proj: (>= N, J) the frames appended first (None before the first;
            room for more after them, :func:`frames_with_room`).
        received: N.
        decided: Frames whose hypotheses have been expanded.
        final: Whether the stream has ended.
    """

    def __init__(self, search: BeamSearch, lookahead: int, device, first: int):
        self.search = search
        self.lookahead = lookahead
        self.first = first  # frames of the first buffer
        self.queues: List[Optional[Queue]] = search.start_queues(device, 0)
        self.enc_proj: Optional[torch.Tensor] = None
        self.received = 0
        self.decided = 0
        self.final = False
        self._final_hyps: Optional[List[Hypothesis]] = None

    def append(self, enc_proj: torch.Tensor, final: bool) -> None:
        """(n, J) frames, checked (:meth:`StreamingBeamSearch.append`)."""
        n, start = enc_proj.size(0), self.received
        if n:
            buf = self.enc_proj
            if buf is None:
                buf = enc_proj.new_zeros(0, enc_proj.size(1))
            buf = self.enc_proj = frames_with_room(buf, start, start + n, self.first)
            buf[start : start + n] = enc_proj
            self.received = start + n
        self.final = self.final or final

    def advance(self) -> None:
        """Expand every frame the frames received decide (all once final)."""
        N = self.received
        # queues up to frame N: len(queues) - 1 is N, and T once final
        self.queues.extend(dict() for _ in range(N + 1 - len(self.queues)))
        stop = N if self.final else max(N - self.lookahead + 1, self.decided)
        if stop > self.decided:
            self.search.run_frames(self.queues, self.enc_proj, self.decided, stop)
            self.decided = stop

    def done(self) -> bool:
        return self.final and self.decided >= self.received

    def hypotheses(self) -> List[Hypothesis]:
        """The n-best list (once :meth:`done`)."""
        if self._final_hyps is None:
            self._final_hyps = self.search.final_hypotheses(self.queues)
        return self._final_hyps

    def provisional(self) -> List[int]:
        """The best labels if the stream ended at the last frame received."""
        if self.final:
            return self.hypotheses()[0].labels
        N = self.received
        queues = [
            None if q is None else {k: dataclasses.replace(h) for k, h in q.items()}
            for q in self.queues
        ]
        queues.extend(dict() for _ in range(N + 1 - len(queues)))
        if N > self.decided:
            self.search.run_frames(queues, self.enc_proj, self.decided, N)
        return self.search.final_hypotheses(queues)[0].labels


class StreamingBeamSearch(StreamingSearch):
    """The beam search over ``batch`` streams, each row its own stream (the search
    runs one utterance at a time; module docstring).

    Args:
        search: A :class:`~espnet_multiblank.decoding.BeamSearch` (any lattice,
            LM fusion included) with ``beam_sync="frame"``.
        batch: Rows: streams decoded side by side.
        device: Where it runs.

    Attributes: those of :class:`StreamingSearch` (``lookahead``: R + 1;
    ``received``: a list; ``tokens``: empty, a beam decides its labels when the
    stream ends).
    """

    search_class = BeamSearch

    def __init__(self, search: BeamSearch, batch: int, device):
        super().__init__(search, batch, device)
        if search.beam_sync != "frame":
            # the step-pruned rule has no per-frame state to resume (yet)
            raise ValueError(
                "streaming beam search runs the frame-synchronous rule: "
                f"transducer_conf.beam_sync must be 'frame', got {search.beam_sync!r}"
            )
        self._streams = [self._start() for _ in range(batch)]

    def _start(self) -> _BeamStream:
        return _BeamStream(
            self.search, self.lookahead, self.device, self.initial_frames
        )

    @property
    def received(self) -> List[int]:
        return [stream.received for stream in self._streams]

    @property
    def tokens(self) -> List[List[int]]:
        return [[] for _ in range(self.batch)]

    def reset(self, rows: Sequence[int]) -> None:
        for r in rows:
            self._streams[r] = self._start()

    def append(self, row: int, enc_proj: torch.Tensor, final: bool = False) -> None:
        stream = self._streams[row]
        if stream.final:
            raise ValueError(f"row {row}: its stream has ended (reset it first)")
        J = None if stream.enc_proj is None else stream.enc_proj.size(1)
        _check_frames("enc_proj", enc_proj, J)
        stream.append(enc_proj, final)

    def end(self, row: int) -> None:
        self._streams[row].final = True

    @torch.no_grad()
    def advance(self) -> None:
        for stream in self._streams:
            stream.advance()

    def done(self, row: int) -> bool:
        return self._streams[row].done()

    def hypotheses(self, row: int) -> List[Hypothesis]:
        if not self.done(row):
            raise ValueError(
                f"row {row} is not complete: its stream has not ended (append "
                "final, advance)"
            )
        return self._streams[row].hypotheses()

    def hypothesis(self, row: int) -> Hypothesis:
        return self.hypotheses(row)[0]

    @torch.no_grad()
    def provisional(self, rows: Optional[Sequence[int]] = None) -> List[List[int]]:
        """Each row's best labels if its stream ended at the last frame received
        (a copy of its queues run to the end). Only ``rows`` (default: all) are
        run; the others give no labels (none is decided)."""
        wanted = range(self.batch) if rows is None else set(rows)
        return [
            stream.provisional() if r in wanted else []
            for r, stream in enumerate(self._streams)
        ]


def streaming_class(search) -> Optional[type]:
    """The :class:`StreamingSearch` that streams ``search``: a beam search's
    :class:`StreamingBeamSearch`, a label-looping search's
    :class:`StreamingGreedySearch`, a frame-looping search's
    :class:`StreamingRowGreedySearch`; None for another search
    (:func:`streamable` gives one that streams)."""
    for kind in (StreamingBeamSearch, StreamingGreedySearch, StreamingRowGreedySearch):
        if isinstance(search, kind.search_class):
            return kind
    return None


def streaming_rows(search, batch: int, device) -> StreamingSearch:
    """``search``'s streaming search (:func:`streaming_class`) over ``batch`` rows
    on ``device``.

    Raises:
        TypeError: a search that does not stream.
    """
    kind = streaming_class(search)
    if kind is None:
        raise TypeError(f"{type(search).__name__} has no streaming search")
    return kind(search, batch, device)


def streamable(search, one_loop: bool):
    """The search that streams in place of the offline ``search`` (the same
    hypotheses): a greedy search as the label-looping search, or with ``one_loop``
    as the frame-looping one, whose one-utterance loop is the faster for a single
    stream; any other search as it is.

    A frame-looping search becomes label-looping with a window of one frame (which
    decides each frame as soon as it may: a window of W frames waits for W - 1
    more); a label-looping search keeps its window.
    """
    if isinstance(search, LabelLoopingGreedySearch):
        return GreedySearch(**search.settings()) if one_loop else search
    if isinstance(search, GreedySearch) and not one_loop:
        looping = greedy_search_class(search.lattice, loop_labels=True)
        return looping(**search.settings(window=1))
    return search
