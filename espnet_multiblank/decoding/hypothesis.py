"""Search hypotheses: one per utterance or beam entry."""

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import torch

#: one label's timing: (frame where it was emitted, frames its arc covers, the arc's
#: acoustic log-probability); see :attr:`Hypothesis.timing`
TokenTiming = Tuple[int, int, float]


@dataclass
class Hypothesis:
    """A path of a search through the duration lattice (``docs/lattice.md``).

    Attributes:
        score: Log-probability of the path (beam search: log-sum over the alignments
            of the same labels merged into this hypothesis).
        yseq: The prediction network's start symbol (the standard blank), then the
            emitted labels; never a blank after the first entry. ``yseq[1:]`` is the
            transcript's token ids.
        dec_state: Prediction-network state after ``yseq`` (the stepper's type).
        dec_proj: Prediction-network output after ``yseq``, projected by the stepper.
            (J,)
        frame: Frames consumed; the path is complete when ``frame == T``.
        num_sym_frame: Labels emitted at ``frame`` so far (``max_sym_per_frame``).
        big_blank_emissions: Emissions on the path that covered more than one frame
            (big blanks).
        frames_skipped: Frames whose joint network the path never evaluated: the sum
            of ``frames - 1`` over those emissions.
        lm_state: The fused language models after ``yseq``
            (:class:`~espnet_multiblank.decoding.fusion.FusionState` of one row), or
            None without an LM. With an LM, ``score`` is the fused score (the
            weighted LM scores of the labels added, and of the end of the sentence
            once the path is complete).
        timing: One :data:`TokenTiming` per label of ``yseq[1:]``: the frame t at
            which it was emitted (frames consumed before it: big blanks and TDT
            durations counted), the frames its arc covers (a TDT label's duration;
            0 for a label of a standard or multi-blank lattice, which stays at t)
            and the arc's acoustic log-probability as the search scored it, the
            language models' part left out (a TDT label: token plus duration term).
            Beam search: those of the best-scoring alignment merged into the
            hypothesis.
    """

    score: float
    yseq: List[int]
    dec_state: Any = None
    dec_proj: Optional[torch.Tensor] = None
    frame: int = 0
    num_sym_frame: int = 0
    big_blank_emissions: int = 0
    frames_skipped: int = 0
    lm_state: Any = None
    timing: List[TokenTiming] = field(default_factory=list)

    @property
    def labels(self) -> List[int]:
        """The emitted labels (``yseq`` without the start symbol)."""
        return self.yseq[1:]

    def advance(self, frames: int, is_label: bool = False) -> None:
        """Count an emission that covers ``frames`` >= 1 frames (in place): the frame
        moves on, the label count of the new frame starts at 0, and an emission over
        more than one frame is a big blank (unless ``is_label``) that skips
        ``frames - 1`` frames."""
        self.frame += frames
        self.num_sym_frame = 0
        if frames > 1:
            self.frames_skipped += frames - 1
            if not is_label:
                self.big_blank_emissions += 1
