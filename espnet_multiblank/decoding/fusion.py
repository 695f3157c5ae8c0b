"""Shallow fusion: language models that score the labels a transducer search emits.

A search with a :class:`ShallowFusion` ranks its arcs by the fused score

    acoustic log-probability + sum_i w_i * log P_i(label | labels so far)

for every label arc, while a blank arc (the standard blank, a big blank, a TDT blank of
any duration) and a TDT label's duration leave the language models untouched: their
state is a function of the labels only. When a hypothesis is complete (it has reached
the last frame) ``sum_i w_i * log P_i(</s> | labels)`` is added once, so a final score
is ``acoustic + sum_i w_i * log P_i(labels </s>)``: the weighted log-probability of
the whole sentence.

A language model is a :class:`TokenLM`: it maps the search's token ids itself (the
ESPnet glue builds them from token lists,
:mod:`espnet_multiblank.espnet.inference.lm_fusion`). :class:`ShallowFusion` sums the
weighted scores of one or more of them and sets the columns of the blanks to exactly
0, so no language model can score a blank whatever it returns there.

Notation: A = rows (hypotheses or utterances), V = the search's token count (the joint
network's outputs without a TDT's duration logits).
"""

import math
from abc import abstractmethod
from numbers import Real
from typing import Any, List, NamedTuple, Sequence, Tuple

import torch

from espnet_multiblank.decoding.stepper import RowStates

State = Any  # whatever a TokenLM keeps per row


class TokenLM(RowStates):
    """A language model over the search's token ids (and the row operations on its
    state, :class:`~espnet_multiblank.decoding.stepper.RowStates`).

    Attributes:
        vocab_size: V, the tokens it scores (ids ``0 .. V - 1``; the columns of the
            blanks are ignored).
    """

    vocab_size: int

    @abstractmethod
    def start(
        self, batch: int, device: torch.device
    ) -> Tuple[torch.Tensor, torch.Tensor, State]:
        """The state of ``batch`` rows after the start of the sentence.

        Returns:
            (batch, V) float32 ``log P(k | <s>)`` of every token k, (batch,) float32
            ``log P(</s> | <s>)``, and the state.
        """

    @abstractmethod
    def step(
        self, labels: torch.Tensor, state: State
    ) -> Tuple[torch.Tensor, torch.Tensor, State]:
        """Advance A rows by one label each.

        Args:
            labels: (A,) long, the label each row emitted (rows whose result is
                discarded by :meth:`where_state` may hold a blank: the result only
                has to be computable).
            state: The rows' states (not modified).

        Returns:
            (A, V) float32 next-label log-probabilities, (A,) float32 end-of-sentence
            log-probabilities, and the new state.
        """


class FusionState(NamedTuple):
    """What the fusion knows about A rows.

    Attributes:
        labels: (A, V) float32, the weighted score every token would get as the next
            label (0 at the blanks).
        end: (A,) float32, the weighted end-of-sentence score.
        states: One state per language model.
    """

    labels: torch.Tensor
    end: torch.Tensor
    states: Tuple[State, ...]


def check_weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


class ShallowFusion:
    """One or more :class:`TokenLM` with their weights, as the searches use them.

    Args:
        lms: The language models (each with ``vocab_size`` V).
        weights: One weight per model (any finite number; 0 makes the model score
            nothing: its scores are not multiplied, so even ``-inf`` ones leave the
            search unchanged).
        blank_ids: The blanks of the lattice: their columns are 0.
        names: Names for messages (default ``lm0``, ``lm1``, ...).
    """

    def __init__(
        self,
        lms: Sequence[TokenLM],
        weights: Sequence[float],
        blank_ids: Sequence[int],
        names: Sequence[str] = (),
    ):
        lms, weights = list(lms), list(weights)
        names = list(names) or [f"lm{i}" for i in range(len(lms))]
        if not lms or len(weights) != len(lms) or len(names) != len(lms):
            raise ValueError(
                "ShallowFusion needs one weight and one name per language model, got "
                f"{len(lms)} models, {len(weights)} weights, {len(names)} names"
            )
        for lm, name in zip(lms, names):
            if not isinstance(lm, TokenLM):
                raise TypeError(
                    f"{name} must be an espnet_multiblank.decoding.TokenLM, got "
                    f"{type(lm).__name__}"
                )
        sizes = {lm.vocab_size for lm in lms}
        if len(sizes) != 1:
            raise ValueError(
                f"the language models score different vocabularies: {sorted(sizes)}"
            )
        self.vocab_size = sizes.pop()
        self.lms = lms
        self.names = names
        self.weights = [check_weight(f"{n} weight", w) for n, w in zip(names, weights)]
        blank_ids = sorted(set(int(b) for b in blank_ids))
        if any(b < 0 or b >= self.vocab_size for b in blank_ids):
            raise ValueError(
                f"blank ids {blank_ids} are not all in [0, {self.vocab_size})"
            )
        self.blank_ids = blank_ids
        self._keep = torch.ones(self.vocab_size, dtype=torch.bool)
        self._keep[blank_ids] = False

    def _combine(self, outs, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        labels = end = None
        for w, (lp, eos) in zip(self.weights, outs):
            if w == 0.0:
                continue
            lp, eos = w * lp.float(), w * eos.float()
            labels = lp if labels is None else labels + lp
            end = eos if end is None else end + eos
        A = outs[0][0].size(0)
        if labels is None:
            labels = torch.zeros(A, self.vocab_size, device=device)
            end = torch.zeros(A, device=device)
        keep = self._keep.to(labels.device)
        return torch.where(keep, labels, torch.zeros_like(labels)), end

    def start(self, batch: int, device: torch.device) -> FusionState:
        """The fusion state of ``batch`` rows at the start of the sentence."""
        outs, states = [], []
        for lm in self.lms:
            lp, eos, state = lm.start(batch, device)
            outs.append((lp, eos))
            states.append(state)
        labels, end = self._combine(outs, device)
        return FusionState(labels, end, tuple(states))

    def step(self, labels: torch.Tensor, state: FusionState) -> FusionState:
        """Advance A rows by one label each (``labels``: (A,) long)."""
        outs, states = [], []
        for lm, s in zip(self.lms, state.states):
            lp, eos, new = lm.step(labels, s)
            outs.append((lp, eos))
            states.append(new)
        scores, end = self._combine(outs, labels.device)
        return FusionState(scores, end, tuple(states))

    def select(self, state: FusionState, idx: torch.Tensor) -> FusionState:
        """Rows ``idx`` ((A,) long)."""
        return FusionState(
            state.labels[idx],
            state.end[idx],
            tuple(lm.select_state(s, idx) for lm, s in zip(self.lms, state.states)),
        )

    def cat(self, states: List[FusionState]) -> FusionState:
        """Concatenate along the row axis."""
        return FusionState(
            torch.cat([s.labels for s in states]),
            torch.cat([s.end for s in states]),
            tuple(
                lm.cat_states([s.states[i] for s in states])
                for i, lm in enumerate(self.lms)
            ),
        )

    def scatter(self, state: FusionState, idx: torch.Tensor, rows: FusionState):
        """Write ``rows`` into ``state`` at ``idx``, in place."""
        state.labels[idx] = rows.labels
        state.end[idx] = rows.end
        for lm, s, r in zip(self.lms, state.states, rows.states):
            lm.scatter_state(s, idx, r)

    def where(self, mask: torch.Tensor, new: FusionState, old: FusionState):
        """Row ``a`` of ``new`` where ``mask[a]`` ((A,) bool), else of ``old``."""
        return FusionState(
            torch.where(mask.unsqueeze(1), new.labels, old.labels),
            torch.where(mask, new.end, old.end),
            tuple(
                lm.where_state(mask, n, o)
                for lm, n, o in zip(self.lms, new.states, old.states)
            ),
        )
