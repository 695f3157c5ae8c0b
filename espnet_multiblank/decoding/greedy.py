"""Greedy search (frame-looping) of every lattice, one utterance and batched.

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

It stops when t == T. The batched version takes the same step for every active
utterance at once (one joint call; one prediction-network call for the rows that
emitted a label); each utterance has its own t and leaves when it reaches its T. Both
choose the same symbols (tested).

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
as frames arrive, with a :class:`StepCache` that its provisional copies share.
"""

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from espnet_multiblank.decoding.base import TransducerSearch
from espnet_multiblank.decoding.fusion import FusionState
from espnet_multiblank.decoding.hypothesis import BatchedHyps, Hypothesis
from espnet_multiblank.decoding.tables import RowNodes

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


class GreedySearch(TransducerSearch):
    """Greedy search of every lattice (see the module docstring): one utterance
    at a time with :meth:`search_one`, and B at once with :meth:`search_batch`,
    which takes one step for every active utterance per iteration: one joint
    call, :meth:`TransducerSearch.row_arcs` for every row, one prediction-network
    call for the rows that emitted a label; each utterance advances by its own
    number of frames and leaves when it reaches its T_b.

    Args: those of :class:`~espnet_multiblank.decoding.base.TransducerSearch`
    (``blank_decision``: ``"total"`` (default) or ``"symbol"``). With a TDT
    (``stepper.vocab_size`` = V + D) ``max_sym_per_frame`` counts the labels that
    stay (duration 0) at one frame; after that every emission moves on.
    """

    batched = True

    def search(self, enc_out: torch.Tensor) -> List[Hypothesis]:
        return [self.search_one(enc_out)]

    def search_one(self, enc_out: torch.Tensor) -> Hypothesis:
        """Greedy search for one utterance (a plain Python loop: no batch overhead).

        Args:
            enc_out: (T, D_enc) encoder output.
        """
        return self._one_projected(self.stepper.project_enc(enc_out))

    @torch.no_grad()
    def search_projected(
        self, enc_proj: torch.Tensor, enc_lens: torch.Tensor
    ) -> List[Hypothesis]:
        """:meth:`search_one` for each of B utterances, on encoder frames already
        projected by ``stepper.project_enc`` (what a stream decides on).

        Args:
            enc_proj: (B, T_max, J) projected encoder frames.
            enc_lens: (B,) long, frames of each utterance.
        """
        return [
            self._one_projected(enc_proj[b, :n])
            for b, n in enumerate(enc_lens.tolist())
        ]

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
        """Greedy search for B utterances at once (the same symbols as
        :meth:`search_one`, tested).

        Args:
            enc_out: (B, T_max, D_enc) padded encoder output.
            enc_lens: (B,) encoder lengths T_b.

        Returns:
            B hypotheses, in input order.
        """
        device = enc_out.device
        table = self.table(device)
        stepper = self.stepper
        B = enc_out.size(0)
        lens = enc_lens.to(device=device, dtype=torch.long)
        enc_proj = stepper.project_enc(enc_out)  # (B, T_max, J)
        dec_proj, state = self.start(B, device)  # (B, J)
        lm = self.start_lm(B, device)
        fusion = self.fusion
        hyps = BatchedHyps(B, device)

        active = (hyps.frame < lens).nonzero().squeeze(1)
        while active.numel() > 0:
            t = hyps.frame[active]  # (A,)
            nodes = RowNodes(
                enc_proj[active, t],
                dec_proj[active],
                t,
                lens[active],
                hyps.num_sym[active],
                None if lm is None else lm.labels[active],
            )
            arcs = self.row_arcs(table, nodes)
            is_label = arcs.is_label
            lm_part = None
            if lm is not None:  # timing: the labels' acoustic part
                lm_part = lm.labels[active].gather(1, arcs.symbol.unsqueeze(1))[:, 0]
            hyps.record(active, arcs.symbol, arcs.frames, arcs.score, is_label, lm_part)
            if bool(is_label.any()):
                rows = active[is_label]
                labels = arcs.symbol[is_label]
                new_proj, new_state = stepper.step(
                    labels, stepper.select_state(state, rows)
                )
                dec_proj[rows] = new_proj
                stepper.scatter_state(state, rows, new_state)
                if lm is not None:
                    fusion.scatter(
                        lm, rows, fusion.step(labels, fusion.select(lm, rows))
                    )
            active = (hyps.frame < lens).nonzero().squeeze(1)

        if lm is not None:  # every hypothesis is complete: the end of the sentence
            hyps.score += lm.end.double()
        return [
            hyps.hypothesis(
                b,
                self.blank_id,
                stepper.select_state(state, torch.tensor([b], device=device)),
                dec_proj[b],
                (
                    None
                    if lm is None
                    else fusion.select(lm, torch.tensor([b], device=device))
                ),
            )
            for b in range(B)
        ]
