"""The prediction and joint networks as the searches see them.

A search never touches the networks directly: it asks a :class:`Stepper` to project
encoder frames, to advance the prediction network by one label for A rows at once, to
evaluate the joint network for A (frame, prediction) pairs, and to gather / scatter
rows of the prediction network's state. :class:`JointStepper` implements it for an
RNN prediction network and a joint network with ESPnet's attribute names (duck-typed:
nothing is imported from ESPnet); another network pair only needs another stepper.

Notation: T = encoder frames, D_enc / D_dec = encoder / prediction-network output size,
J = joint space size, V = joint output size, A = rows of a step (active utterances or
hypotheses), N = prediction-network layers, H = its units.
"""

from abc import ABC, abstractmethod
from typing import Any, List, Optional, Tuple

import torch
from torch.nn.functional import linear as _linear

from espnet_multiblank.decoding.cell_step import CellStep, RowLinear, hooked

State = Any  # whatever the stepper keeps per row; JointStepper: RNNState
RNNState = Tuple[torch.Tensor, Optional[torch.Tensor]]  # ((N, A, H), (N, A, H)|None)


class RowStates(ABC):
    """State operations on rows: what the searches need of every per-row state (a
    :class:`Stepper`'s prediction network, a fused language model's)."""

    @abstractmethod
    def select_state(self, state: State, idx: torch.Tensor) -> State:
        """Rows ``idx`` ((A,) long) of a state."""

    @abstractmethod
    def cat_states(self, states: List[State]) -> State:
        """Concatenate states along the row axis."""

    @abstractmethod
    def scatter_state(self, state: State, idx: torch.Tensor, rows: State) -> None:
        """Write ``rows`` (A rows) into ``state`` at ``idx`` ((A,) long), in place."""

    def where_state(self, mask: torch.Tensor, new: State, old: State) -> State:
        """Row ``a`` of ``new`` where ``mask[a]``, else of ``old`` (a new state).

        The label-looping search keeps a fixed batch and merges with a mask so that it
        never waits for the device; this default goes through row indices (a host
        sync), owners whose state is made of tensors override it with
        ``torch.where``.

        Args:
            mask: (A,) bool.
            new, old: States of the same A rows.
        """
        return where_by_rows(self, mask, new, old)


class Stepper(RowStates):
    """Interface between the searches and a prediction + joint network pair.

    Attributes:
        vocab_size: V, the number of joint-network outputs (every blank included).
    """

    vocab_size: int

    def prepare(self, device: torch.device) -> None:
        """Called once per search call with the encoder output's device."""

    @abstractmethod
    def project_enc(self, enc_out: torch.Tensor) -> torch.Tensor:
        """Encoder output (..., D_enc) -> the joint network's encoder input (..., J)."""

    @abstractmethod
    def joint(self, enc_proj: torch.Tensor, dec_proj: torch.Tensor) -> torch.Tensor:
        """Raw joint-network logits (A, V) for (A, J) projected encoder frames and
        (A, J) projected prediction-network outputs."""

    def joint_many(
        self, enc_proj: torch.Tensor, dec_proj: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`joint` for a call over many frames at once, (A, W, J) and
        (A, 1, J) -> (A, W, V) (the label-synchronous rule); the same logits
        within float32 rounding."""
        return self.joint(enc_proj, dec_proj)

    def log_probs(self, enc_proj: torch.Tensor, dec_proj: torch.Tensor) -> torch.Tensor:
        """Plain log-softmax of :meth:`joint`, (A, V) float32 (decoding applies no
        sigma)."""
        return torch.log_softmax(self.joint(enc_proj, dec_proj).float(), dim=-1)

    @abstractmethod
    def init_state(self, batch: int) -> State:
        """State of ``batch`` rows before the start symbol."""

    @abstractmethod
    def step(self, labels: torch.Tensor, state: State) -> Tuple[torch.Tensor, State]:
        """Advance A rows by one symbol each.

        Args:
            labels: (A,) long, the symbol each row emits.
            state: the rows' states.

        Returns:
            (A, J) projected prediction-network outputs and the new state (a new
            object: ``state`` is not modified).
        """


def where_by_rows(owner: Any, mask: torch.Tensor, new: Any, old: Any) -> Any:
    """Row ``a`` of ``new`` where ``mask[a]``, else of ``old``, through ``owner``'s
    ``select_state`` and ``scatter_state`` (a :class:`Stepper` or a language model's
    adapter): a copy of ``old`` with the rows of ``mask`` overwritten."""
    idx = mask.nonzero().squeeze(1)
    out = owner.select_state(old, torch.arange(mask.numel(), device=mask.device))
    owner.scatter_state(out, idx, owner.select_state(new, idx))
    return out


class JointStepper(Stepper):
    """Stepper for an RNN prediction network and a joint network (ESPnet's layout).

    The prediction network needs ``embed`` (an embedding), ``init_state(batch)``,
    ``rnn_forward(emb (A, 1, E), state)``, ``odim`` and optionally ``set_device``
    (ESPnet's ``TransducerDecoder``). When the joint network has ``lin_enc`` and
    ``lin_dec`` (ESPnet's ``JointNetwork``) the encoder frames are projected once per
    utterance and every prediction once per label, and the joint network is called with
    ``no_projection=True``, which computes exactly ``lin_out(act(lin_enc(e) +
    lin_dec(d)))`` as in training; any other joint network is called as
    ``joint(enc, dec)``.

    In eval mode, a prediction network made of one-layer unidirectional LSTM/GRU
    modules (what ``TransducerDecoder`` builds) is stepped by
    :class:`~espnet_multiblank.decoding.cell_step.CellStep` (on a CPU: the first
    layer's input projection looked up per label, the recurrent weights transposed;
    elsewhere ``torch.lstm_cell`` / ``torch.gru_cell``, one fused op per layer)
    instead of a full ``nn.LSTM`` call per label (the same function within float32
    rounding: dropout is the identity in eval mode; ``bench/decode_steps.py`` times
    each).

    Args:
        decoder: The prediction network.
        joint_network: The joint network.
        vocab_size: V; default ``decoder.odim``.
    """

    def __init__(self, decoder: Any, joint_network: Any, vocab_size: int = 0):
        self.decoder = decoder
        self.joint_network = joint_network
        self.vocab_size = int(vocab_size or getattr(decoder, "odim", 0))
        if self.vocab_size < 1:
            raise ValueError(
                "vocab_size must be the joint network's output size (>= 1); the "
                "decoder has no odim to take it from"
            )
        self.project = hasattr(joint_network, "lin_enc") and hasattr(
            joint_network, "lin_dec"
        )
        if self.project:
            self.lin_dec = RowLinear(joint_network.lin_dec)
        self.cells = rnn_cells(decoder)
        self.lstm = self.cells is not None and isinstance(
            decoder.decoder[0], torch.nn.LSTM
        )
        self.cell_step = (
            CellStep(decoder.embed, self.cells, self.lstm)
            if self.cells is not None
            else None
        )
        #: ESPnet's own JointNetwork with a tanh and a linear output layer (joint())
        self.plain_tanh = (
            self.project
            and type(joint_network).__name__ == "JointNetwork"
            and type(joint_network).__module__ == "espnet2.asr_transducer.joint_network"
            and type(getattr(joint_network, "joint_activation", None)) is torch.nn.Tanh
            and type(getattr(joint_network, "lin_out", None)) is torch.nn.Linear
        )
        if self.plain_tanh:
            self._joint_parts = (
                joint_network,
                joint_network.joint_activation,
                joint_network.lin_out,
            )

    def prepare(self, device: torch.device) -> None:
        if hasattr(self.decoder, "set_device"):
            self.decoder.set_device(device)

    def project_enc(self, enc_out: torch.Tensor) -> torch.Tensor:
        return self.joint_network.lin_enc(enc_out) if self.project else enc_out

    def _project_dec(self, dec_out: torch.Tensor) -> torch.Tensor:
        return self.lin_dec(dec_out) if self.project else dec_out

    def joint(self, enc_proj: torch.Tensor, dec_proj: torch.Tensor) -> torch.Tensor:
        if self.project:
            jn = self.joint_network
            if self.plain_tanh and not hooked(*self._joint_parts):
                # ESPnet's forward with no_projection=True, without its three module
                # calls: the same ops on the same tensors (the same numbers), about
                # half the time of a one-row call on a CPU
                lin_out = self._joint_parts[2]
                hidden = torch.tanh(enc_proj + dec_proj)
                return _linear(hidden, lin_out.weight, lin_out.bias)
            return jn(enc_proj, dec_proj, no_projection=True)
        return self.joint_network(enc_proj, dec_proj)

    def joint_many(
        self, enc_proj: torch.Tensor, dec_proj: torch.Tensor
    ) -> torch.Tensor:
        """With ESPnet's tanh joint network on float32 CPU tensors, tanh as
        2 sigmoid(2 x) - 1 in place: torch's CPU tanh takes about 3 times as long
        as that (bench/RESULTS.md), and on the label rule's rows x frames it is the
        largest part of a step; within 2e-7 of torch.tanh."""
        act = getattr(self.joint_network, "joint_activation", None)
        if not (
            self.project
            and isinstance(act, torch.nn.Tanh)
            and enc_proj.device.type == "cpu"
            and enc_proj.dtype == torch.float32
        ):
            return self.joint(enc_proj, dec_proj)
        hidden = enc_proj + dec_proj
        hidden.mul_(2.0)
        torch.sigmoid(hidden, out=hidden)
        hidden.mul_(2.0).sub_(1.0)
        return self.joint_network.lin_out(hidden)

    def init_state(self, batch: int) -> RNNState:
        # in the networks' dtype: ESPnet's decoder makes float32 zeros whatever the
        # model was cast to (--dtype float16 / bfloat16)
        h, c = self.decoder.init_state(batch)
        dtype = self.decoder.embed.weight.dtype
        return h.to(dtype), (None if c is None else c.to(dtype))

    def step(
        self, labels: torch.Tensor, state: RNNState
    ) -> Tuple[torch.Tensor, RNNState]:
        if self.cells is not None and not self.decoder.training:
            return self._cell_step(labels, state)
        emb = self.decoder.embed(labels.view(-1, 1))  # (A, 1, E)
        dec_out, new_state = self.decoder.rnn_forward(emb, state)  # (A, 1, D_dec)
        return self._project_dec(dec_out[:, 0]), new_state

    def _cell_step(
        self, labels: torch.Tensor, state: RNNState
    ) -> Tuple[torch.Tensor, RNNState]:
        x, new_state = self.cell_step(labels, state)  # (A, H)
        return self._project_dec(x), new_state

    def select_state(self, state: RNNState, idx: torch.Tensor) -> RNNState:
        h, c = state
        return h[:, idx], (c[:, idx] if c is not None else None)

    def cat_states(self, states: List[RNNState]) -> RNNState:
        h = torch.cat([s[0] for s in states], dim=1)
        c = None if states[0][1] is None else torch.cat([s[1] for s in states], dim=1)
        return h, c

    def scatter_state(self, state: RNNState, idx: torch.Tensor, rows: RNNState) -> None:
        state[0][:, idx] = rows[0]
        if state[1] is not None:
            state[1][:, idx] = rows[1]

    def where_state(self, mask: torch.Tensor, new: RNNState, old: RNNState) -> RNNState:
        keep = mask.view(1, -1, 1)  # (1, A, 1) against (N, A, H)
        h = torch.where(keep, new[0], old[0])
        c = None if old[1] is None else torch.where(keep, new[1], old[1])
        return h, c


def rnn_cells(decoder: Any) -> Optional[List[Tuple[torch.Tensor, ...]]]:
    """Per-layer cell weights of an RNN prediction network, or None.

    Returns ``[(w_ih, w_hh, b_ih, b_hh), ...]`` when ``decoder.decoder`` is a
    ``ModuleList`` of one-layer, unidirectional ``torch.nn.LSTM`` (or all
    ``torch.nn.GRU``) with biases and no projection, as ESPnet's ``TransducerDecoder``
    builds; None for anything else (stepped through ``rnn_forward``).
    """
    layers = getattr(decoder, "decoder", None)
    if not isinstance(layers, torch.nn.ModuleList) or not hasattr(decoder, "embed"):
        return None
    cells = []
    for rnn in layers:
        if (
            type(rnn) not in (torch.nn.LSTM, torch.nn.GRU)
            or rnn.num_layers != 1
            or rnn.bidirectional
            or not rnn.bias
            or getattr(rnn, "proj_size", 0)
        ):
            return None
        cells.append(
            (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
        )
    if not cells or len({type(rnn) for rnn in layers}) != 1:
        return None
    return cells
