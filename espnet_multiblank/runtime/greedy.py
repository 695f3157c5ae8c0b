"""Greedy search for every lattice, batched and streaming (NumPy + ONNX Runtime).

The plug-in's greedy search (``mb_greedy`` / ``tdt_greedy``), step for step: each
utterance sits at a frame t with the prediction network's output for its labels so
far and takes the arc :class:`~.step_rule.StepRule` chooses; a blank arc moves t on,
a label advances the prediction network (and moves t by its duration, for a TDT).

Frame-looping, batched: a round runs the joint network once on every utterance's
current frame (one ONNX Runtime call for all), takes each utterance's step, and runs
the prediction network once for the utterances that emitted a label. A frame that a
big blank or a duration jumps over is never evaluated: that is where multi-blank and
TDT models save time, as in the paper.

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
from espnet_multiblank.search_defaults import SEARCH_DEFAULTS

#: the plug-in's greedy search per lattice kind, whose defaults (the plug-in's one
#: table, also behind conf/decode/) the runtime's greedy search takes
GREEDY_SEARCH = {"multiblank": "mb_greedy", "tdt": "tdt_greedy"}
#: max_sym_per_frame of the "nemo" rule: sherpa-onnx's max_symbols_per_frame (RNN-T)
#: and max_tokens_per_frame (TDT)
NEMO_MAX_SYM = {"multiblank": 10, "tdt": 5}


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


def step_run(
    run: GreedyRun, row: List[float], rule: StepRule, known: int, final: bool
) -> str:
    """Take the step of ``run`` at its frame, from that frame's log-probabilities.

    Args:
        run: The utterance.
        row: The V' log-probabilities of (its frame, its prediction output).
        rule: The decision.
        known: N, frames received (the utterance's T when ``final``).
        final: No frame will follow the N received.

    Returns:
        ``"label"`` (a label was emitted: the prediction network must step),
        ``"blank"``, or ``"wait"`` (the step needs more frames).
    """
    t = run.frame
    room = known - t
    R1 = rule.free_room
    pending = None
    if final or room >= R1:
        step = rule.decide(row, room, run.num_sym)
    else:  # T >= N decides: taken when every such T agrees
        options = [rule.decide(row, r, run.num_sym) for r in range(room, R1 + 1)]
        if any(o[:3] != options[0][:3] for o in options[1:]):
            return "wait"
        step = options[0]
        pending = {r: o.score for r, o in zip(range(room, R1 + 1), options)}
    run.take(step, pending)
    return "label" if step.is_label else "blank"


class GreedySearch:
    """Greedy search over a batch of encoded utterances.

    Args:
        model: The exported model.
        blank_decision: ``"total"``, ``"symbol"`` (default: the plug-in's for the
            lattice: ``mb_greedy`` / ``tdt_greedy`` in the plug-in's table of search
            defaults, ``search_defaults.SEARCH_DEFAULTS``) or ``"nemo"`` (NeMo's and
            sherpa-onnx's rule, :mod:`.step_rule`; its ``max_sym_per_frame``
            default: :data:`NEMO_MAX_SYM`).
        max_sym_per_frame: Labels that may stay at one frame (default: the
            plug-in's for the lattice).
    """

    def __init__(
        self,
        model: ExportedModel,
        blank_decision: Optional[str] = None,
        max_sym_per_frame: Optional[int] = None,
    ):
        kind = model.lattice.kind
        table = SEARCH_DEFAULTS[GREEDY_SEARCH[kind]]
        decision, max_sym = table["blank_decision"], table["max_sym_per_frame"]
        if blank_decision == "nemo":
            max_sym = NEMO_MAX_SYM[kind]
        self.model = model
        self.rule = StepRule(
            model.lattice,
            model.info.joint_size,
            decision if blank_decision is None else blank_decision,
            max_sym if max_sym_per_frame is None else max_sym_per_frame,
        )

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
        """Take every step the frames received allow, for several runs at once:
        per round one joint-network call for every run's frame and one
        prediction-network call for the runs that emitted a label.

        Args:
            runs: The runs.
            frames: Per run, (N_b', J) float32 projected encoder frames (at least
                its ``known`` ones).
            known: Per run, N_b, frames received.
            final: The runs' utterances end after their N_b frames.
        """
        model, rule = self.model, self.rule
        active = [b for b in range(len(runs)) if runs[b].frame < known[b]]
        while active:
            enc = np.stack([frames[b][runs[b].frame] for b in active])
            dec = np.stack([runs[b].dec_proj for b in active])
            rows = model.log_probs(enc, dec).tolist()
            stepping, still = [], []
            for b, row in zip(active, rows):
                outcome = step_run(runs[b], row, rule, known[b], final)
                if outcome == "label":
                    stepping.append(b)
                if outcome != "wait" and runs[b].frame < known[b]:
                    still.append(b)
            if stepping:
                labels = np.array([runs[b].labels[-1] for b in stepping], np.int64)
                state = model.concat_states([runs[b].state for b in stepping])
                dec, state = model.step(labels, state)
                for i, b in enumerate(stepping):
                    runs[b].dec_proj = dec[i]
                    runs[b].state = model.select_state(state, slice(i, i + 1))
            active = still
