"""Greedy search for every lattice, batched and streaming (NumPy + ONNX Runtime).

The plug-in's greedy search (``mb_greedy`` / ``tdt_greedy``), step for step: each
utterance sits at a frame t with the prediction network's output for its labels so
far and takes the arc :class:`~.step_rule.StepRule` chooses; a blank arc moves t on,
a label advances the prediction network (and moves t by its duration, for a TDT).

The order of work is label-looping (Bataev et al. 2024): the joint network is run on
a window of the frames ahead of each utterance with its current prediction output
(one ONNX Runtime call for all utterances), the decisions walk over the window
until a label is emitted (or the window is used up), and one prediction-network
call serves every utterance that emitted a label. The decisions are those of the
frame-by-frame search; only the number of runtime calls changes.

Streaming (:meth:`GreedyRun.advance` with ``final=False``): with N frames received,
a step at frame t is taken when N - t > R (the longest arc), or when every length
T >= N the utterance may turn out to have gives it the same arc (else it waits for
more frames). The steps taken are the offline search's on the same frames, so a
stream's final hypothesis is the offline one.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from espnet_multiblank.runtime.model import ExportedModel, State
from espnet_multiblank.runtime.step_rule import Step, StepRule

#: frames of the joint network's window per utterance and round
WINDOW = 16

#: the plug-in's greedy defaults per lattice kind (conf/decode/mb_greedy.yaml,
#: tdt_greedy.yaml): (blank_decision, max_sym_per_frame)
GREEDY_DEFAULTS = {"multiblank": ("total", 1), "tdt": ("total", 10)}


@dataclass
class GreedyRun:
    """One utterance's greedy search so far.

    Attributes:
        frame: t, the next frame to decide at.
        num_sym: Labels emitted at ``frame``.
        labels: Token ids emitted.
        timing: Per label ``(frame, frames covered, score)``.
        score: Sum of the steps' scores (``pending`` not included).
        frames_skipped: Frames whose joint output no step read (``frames - 1`` per
            arc over more than one frame), as the plug-in counts them.
        big_blank_emissions: Blank arcs over more than one frame.
        pending: Steps of a stream taken before the utterance's length was known:
            ``(frame, {min(T - frame, R + 1): score})``.
        dec_proj: (J,) the prediction network's projected output.
        state: The prediction network's state (rows of 1).
    """

    dec_proj: np.ndarray
    state: State
    frame: int = 0
    num_sym: int = 0
    labels: List[int] = field(default_factory=list)
    timing: List[Tuple[int, int, float]] = field(default_factory=list)
    score: float = 0.0
    frames_skipped: int = 0
    big_blank_emissions: int = 0
    pending: List[Tuple[int, Dict[int, float]]] = field(default_factory=list)
    needs_step: bool = False

    def take(self, step: Step, score=None) -> None:
        """Apply a step at :attr:`frame` (``score``: a dict by room while the
        length is not known)."""
        t = self.frame
        value = step.score if score is None else 0.0
        if score is not None:
            self.pending.append((t, score))
        else:
            self.score += value
        if step.is_label:
            self.labels.append(step.symbol)
            self.timing.append((t, step.frames, step.score))
            self.needs_step = True
        if step.frames == 0:
            self.num_sym += 1
            return
        self.frame = t + step.frames
        self.num_sym = 0
        if step.frames > 1:
            self.frames_skipped += step.frames - 1
            if not step.is_label:
                self.big_blank_emissions += 1

    def resolve(self, length: int, rule: StepRule) -> None:
        """Add the pending steps' scores once the length T is known."""
        for t, scores in self.pending:
            self.score += scores[min(length - t, rule.free_room)]
        self.pending = []


def walk(
    run: GreedyRun,
    lp: np.ndarray,
    start: int,
    rule: StepRule,
    known: int,
    final: bool,
) -> str:
    """Take the steps of ``run`` on a window of log-probabilities.

    Args:
        run: The utterance (at frame ``start``).
        lp: (W, V') float32 log-probabilities of frames ``start .. start + W - 1``
            with the run's current prediction output.
        rule: The decision.
        known: N, frames received (the utterance's T when ``final``).
        final: No frame will follow the N received.

    Returns:
        ``"label"`` (a label was emitted: the prediction network must step),
        ``"window"`` (the window is used up), ``"end"`` (t reached T) or
        ``"wait"`` (a step needs more frames).
    """
    free = rule.free(lp) if lp.shape[0] else None
    W = lp.shape[0]
    R1 = rule.free_room
    while True:
        t = run.frame
        if final and t >= known:
            return "end"
        i = t - start
        if i >= W:
            return "window"
        room = known - t
        guarded = run.num_sym >= rule.max_sym
        pending = None
        if room >= R1 and not guarded:
            step = Step(
                bool(free[0][i]), int(free[1][i]), int(free[2][i]), float(free[3][i])
            )
        elif final or room >= R1:
            step = rule.decide(lp[i], room, guarded)
        else:  # T >= N decides: taken when every such T agrees
            options = [rule.decide(lp[i], r, guarded) for r in range(room, R1 + 1)]
            if any(o[:3] != options[0][:3] for o in options[1:]):
                return "wait"
            step = options[0]
            pending = {r: o.score for r, o in zip(range(room, R1 + 1), options)}
        run.take(step, pending)
        if step.is_label:
            return "label"


class GreedySearch:
    """Greedy search over a batch of encoded utterances.

    Args:
        model: The exported model.
        blank_decision: ``"total"`` or ``"symbol"`` (default: the plug-in's for the
            lattice, :data:`GREEDY_DEFAULTS`).
        max_sym_per_frame: Labels that may stay at one frame (default: the
            plug-in's for the lattice).
        window: Frames per utterance and joint-network call.
    """

    def __init__(
        self,
        model: ExportedModel,
        blank_decision: Optional[str] = None,
        max_sym_per_frame: Optional[int] = None,
        window: int = WINDOW,
    ):
        kind = model.lattice.kind
        decision, max_sym = GREEDY_DEFAULTS[kind]
        self.model = model
        self.rule = StepRule(
            model.lattice,
            model.info.joint_size,
            decision if blank_decision is None else blank_decision,
            max_sym if max_sym_per_frame is None else max_sym_per_frame,
        )
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.window = window

    def start(self, count: int) -> List[GreedyRun]:
        """``count`` fresh runs (the prediction network after the blank)."""
        model = self.model
        blank = np.full(count, model.info.blank_id, np.int64)
        dec, state = model.step(blank, model.initial_state(count))
        return [
            GreedyRun(dec[b], model.select_state(state, slice(b, b + 1)))
            for b in range(count)
        ]

    def search(self, enc_proj: np.ndarray, lengths: np.ndarray) -> List[GreedyRun]:
        """Decode a padded batch: (B, T, J) float32 frames, (B,) int64 lengths."""
        runs = self.start(enc_proj.shape[0])
        self.advance(runs, list(enc_proj), [int(n) for n in lengths], final=True)
        for run, n in zip(runs, lengths):
            run.resolve(int(n), self.rule)
        return runs

    def advance(
        self,
        runs: List[GreedyRun],
        frames: List[np.ndarray],
        known: List[int],
        final: bool,
    ) -> None:
        """Take every step the frames received allow, for several runs at once.

        Args:
            runs: The runs.
            frames: Per run, (N_b', J) float32 projected encoder frames (at least
                its ``known`` ones).
            known: Per run, N_b, frames received.
            final: The runs' utterances end after their N_b frames.
        """
        model, rule, W = self.model, self.rule, self.window
        active = [b for b in range(len(runs)) if runs[b].frame < known[b]]
        while active:
            enc_rows, dec_rows, spans = [], [], []
            for b in active:
                run = runs[b]
                stop = min(run.frame + W, known[b])
                enc_rows.append(frames[b][run.frame : stop])
                spans.append((run.frame, stop - run.frame))
            for b, (_, w) in zip(active, spans):
                dec_rows.append(
                    np.broadcast_to(runs[b].dec_proj, (w,) + runs[b].dec_proj.shape)
                )
            lp = model.log_probs(
                np.concatenate(enc_rows), np.ascontiguousarray(np.concatenate(dec_rows))
            )
            stepping, still = [], []
            offset = 0
            for b, (start, w) in zip(active, spans):
                outcome = walk(
                    runs[b], lp[offset : offset + w], start, rule, known[b], final
                )
                offset += w
                if outcome == "label":
                    stepping.append(b)
                if outcome in ("label", "window") and runs[b].frame < known[b]:
                    still.append(b)
            if stepping:
                labels = np.array([runs[b].labels[-1] for b in stepping], np.int64)
                state = model.concat_states([runs[b].state for b in stepping])
                dec, state = model.step(labels, state)
                for i, b in enumerate(stepping):
                    runs[b].dec_proj = dec[i]
                    runs[b].state = model.select_state(state, slice(i, i + 1))
                    runs[b].needs_step = False
            active = still
