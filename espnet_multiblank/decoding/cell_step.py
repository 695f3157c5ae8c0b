"""One label through an RNN prediction network, the way a CPU likes it.

A search advances the prediction network by one label for A rows at a time (A = 1
in the one-utterance loops and in every stream). On a CPU that step is bound by
reading the weights: a one-layer LSTM of H units reads W_ih (4H, E) and W_hh
(4H, H) for every label, and in a stream, where the encoder runs between two
labels, they come from memory, not from the cache. :class:`CellStep` reads less:

* the first layer's input projection depends on the label alone, so it is a table,
  ``table[v] = W_ih @ embed[v] + b_ih (+ b_hh for an LSTM)``, shape (V, 4H) (or
  (V, 3H) for a GRU), built once per set of weights: a step reads one row of it
  instead of W_ih;
* the recurrent weights (and a deeper layer's input weights) are kept transposed,
  (H, 4H) contiguous, so that ``h @ W_hh^T`` runs as a plain row-major product;
  torch's CPU kernel for the transposed layout ``torch.nn.functional.linear`` uses
  is about twice as slow on one row when the weights are not in the cache
  (``bench/decode_steps.py``).

The gates are then computed as ``torch.lstm_cell`` / ``torch.gru_cell`` define
them (PyTorch's LSTM and GRU equations), with the same values up to float32
rounding (a different summation order), not bit for bit: every search uses this
step, so a search is still exact against itself (streaming against offline,
batch against one utterance where those are tested bit for bit).

The tables and transposed copies are rebuilt whenever a weight changes (its
storage or its in-place version counter: an optimizer step, ``load_state_dict``,
``.to()``), so a search built once and used between training steps sees the new
weights (with gradients on, as outside the searches, they are built anew through
autograd for each call, so that gradients reach the parameters). Used on CPU
tensors of float32 / float64 only; other devices and dtypes
(a GPU runs ``torch.lstm_cell``'s fused kernel; half precision) and embeddings that
are not a plain ``nn.Embedding`` (or have hooks) take the per-layer fused cells.
A table larger than twice W_ih (V > 2E) is not built: the embedding is looked up
and projected through the transposed W_ih instead.

Notation: A = rows, V = labels, E = embedding size, H = units, N = layers.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch.nn.modules import module as _module

RNNState = Tuple[torch.Tensor, Optional[torch.Tensor]]  # ((N, A, H), (N, A, H)|None)
Weights = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def hooked(*modules: Any) -> bool:
    """Whether a forward hook (global or on one of ``modules``) would see their
    module calls; the fast paths that skip those calls are not taken then."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def fast_path(x: torch.Tensor) -> bool:
    """The transposed / table paths: float32 / float64 CPU tensors."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


class _Layer:
    """One layer's weights as :class:`CellStep` uses them.

    Attributes:
        table: (V, G) input projection per label (layer 0), or None.
        w_ih_t: (E_in, G) transposed input weights (when there is no table).
        b_in: (G,) bias added to the input projection (when there is no table).
        w_hh_t: (H, G) transposed recurrent weights.
        b_hh: (G,) recurrent bias (GRU only; an LSTM's is folded into the input's).
    """

    def __init__(
        self,
        table: Optional[torch.Tensor],
        w_ih_t: Optional[torch.Tensor],
        b_in: Optional[torch.Tensor],
        w_hh_t: torch.Tensor,
        b_hh: Optional[torch.Tensor],
    ):
        self.table, self.w_ih_t, self.b_in = table, w_ih_t, b_in
        self.w_hh_t, self.b_hh = w_hh_t, b_hh


class CellStep:
    """Advance an RNN prediction network of one-layer LSTM / GRU modules by one
    label per row.

    Args:
        embed: The prediction network's label embedding (V, E).
        cells: Per layer ``(w_ih, w_hh, b_ih, b_hh)`` (PyTorch's layout:
            (G, E_in), (G, H), (G,), (G,), G = 4H for an LSTM, 3H for a GRU).
        lstm: LSTM cells (else GRU).
    """

    def __init__(self, embed: Any, cells: Sequence[Weights], lstm: bool):
        self.embed = embed
        self.cells = list(cells)
        self.lstm = lstm
        self._params: List[torch.Tensor] = [t for w in self.cells for t in w]
        weight = getattr(embed, "weight", None)
        self.plain_embed = (
            type(embed) is torch.nn.Embedding
            and embed.max_norm is None  # max_norm renormalises rows when looked up
            and isinstance(weight, torch.Tensor)
        )
        if self.plain_embed:
            self._params.append(weight)
        self._derived = Derived(self._params, self._build)

    def __call__(
        self, labels: torch.Tensor, state: RNNState
    ) -> Tuple[torch.Tensor, RNNState]:
        """Args:
            labels: (A,) long.
            state: ((N, A, H), (N, A, H) for an LSTM else None).

        Returns:
            ((A, H) last layer's output, the new state: new tensors).
        """
        if not fast_path(self.cells[0][1]):
            return self.fused(labels, state)
        layers = self._current_layers()
        h_prev, c_prev = state
        hs: List[torch.Tensor] = []
        cs: List[torch.Tensor] = []
        x: Optional[torch.Tensor] = None
        for n, layer in enumerate(layers):
            if layer.table is not None:
                gi = layer.table.index_select(0, labels.view(-1))  # (A, G)
            else:
                if x is None:
                    x = self.embed(labels.view(-1))
                gi = torch.addmm(layer.b_in, x, layer.w_ih_t)
            if self.lstm:
                h, c = _lstm_gates(gi, h_prev[n], c_prev[n], layer.w_hh_t)
                cs.append(c)
            else:
                h = _gru_gates(gi, h_prev[n], layer.w_hh_t, layer.b_hh)
            hs.append(h)
            x = h
        return x, (_stack(hs), _stack(cs) if self.lstm else None)

    def fused(
        self, labels: torch.Tensor, state: RNNState
    ) -> Tuple[torch.Tensor, RNNState]:
        """The same step with ``torch.lstm_cell`` / ``torch.gru_cell`` per layer (one
        fused op per layer on a GPU)."""
        x = self.embed(labels.view(-1))  # (A, E)
        h_prev, c_prev = state
        hs, cs = [], []
        for n, weights in enumerate(self.cells):
            if self.lstm:
                h, c = torch.lstm_cell(x, (h_prev[n], c_prev[n]), *weights)
                cs.append(c)
            else:
                h = torch.gru_cell(x, h_prev[n], *weights)
            hs.append(h)
            x = h
        return x, (torch.stack(hs), torch.stack(cs) if cs else None)

    # ------------------------------------------------------------------ weights

    def _current_layers(self) -> List[_Layer]:
        # a forward hook on the embedding would not see a table lookup
        return self._derived.get((hooked(self.embed),))

    def _build(self, with_hooks: bool) -> List[_Layer]:
        layers = []
        for n, (w_ih, w_hh, b_ih, b_hh) in enumerate(self.cells):
            rows = None
            vocab, dim = self.embed.weight.shape if self.plain_embed else (0, 0)
            if n == 0 and not with_hooks and self.plain_embed and vocab <= 2 * dim:
                rows = torch.nn.functional.linear(self.embed.weight, w_ih, b_ih)
                if self.lstm:
                    rows += b_hh
            b_in = None
            if rows is None:
                b_in = b_ih + b_hh if self.lstm else b_ih.clone()
            layers.append(
                _Layer(
                    table=rows,
                    w_ih_t=None if rows is not None else w_ih.t().contiguous(),
                    b_in=b_in,
                    w_hh_t=w_hh.t().contiguous(),
                    b_hh=None if self.lstm else b_hh.clone(),
                )
            )
        return layers


class Derived:
    """Tensors derived from some parameters (a table, transposed copies), rebuilt
    when one of them has changed: another storage, dtype or in-place version (an
    optimizer step, ``load_state_dict``, ``.to()``).

    Args:
        params: The parameters the tensors are derived from.
        build: ``build(*extra)`` -> the derived tensors (run without autograd).
    """

    def __init__(self, params: Sequence[torch.Tensor], build: Callable[..., Any]):
        self.params = list(params)
        self.build = build
        self._key: Optional[tuple] = None
        self._value: Any = None

    def get(self, extra: tuple = ()) -> Any:
        """The derived tensors for the parameters as they are now; ``extra``: more
        of the key, passed to ``build``. With gradients on and a parameter that
        wants one, they are built anew through autograd (the same values), so that
        a gradient reaches the parameters; the searches run without gradients."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.params):
            return self.build(*extra)
        key = extra + tuple((p.data_ptr(), p._version, p.dtype) for p in self.params)
        if key != self._key:
            with torch.no_grad():
                self._value = self.build(*extra)
            self._key = key
        return self._value


class RowLinear:
    """``x @ W^T + b`` of an ``nn.Linear`` for a few rows, with W kept transposed
    ((in, out) contiguous: about 1.5 times faster than ``linear``'s layout on one
    row whose weights are not in the cache) on float32 / float64 CPU tensors; the
    module itself elsewhere and when it has hooks. The same values within float32
    rounding.
    """

    def __init__(self, linear: torch.nn.Linear):
        self.linear = linear
        self.plain = type(linear) is torch.nn.Linear and linear.bias is not None
        if self.plain:
            self._derived = Derived(
                [linear.weight, linear.bias],
                lambda: (linear.weight.t().contiguous(), linear.bias),
            )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(A, in) -> (A, out)."""
        lin = self.linear
        if not self.plain or x.dim() != 2 or not fast_path(x) or hooked(lin):
            return lin(x)
        w_t, b = self._derived.get()
        return torch.addmm(b, x, w_t)


def _lstm_gates(
    gi: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, w_hh_t: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's LSTM cell from the input projection ``gi`` (A, 4H), both biases
    included: gates i, f, g, o in that order."""
    gates = gi.addmm_(h0, w_hh_t)  # gi is this step's own tensor
    hidden = h0.shape[1]
    sig = torch.sigmoid(gates)  # i, f, (unused), o
    c = torch.addcmul(
        sig[:, hidden : 2 * hidden] * c0,
        sig[:, :hidden],
        torch.tanh(gates[:, 2 * hidden : 3 * hidden]),
    )
    h = sig[:, 3 * hidden :] * torch.tanh(c)
    return h, c


def _gru_gates(
    gi: torch.Tensor, h0: torch.Tensor, w_hh_t: torch.Tensor, b_hh: torch.Tensor
) -> torch.Tensor:
    """PyTorch's GRU cell from the input projection ``gi`` (A, 3H), b_ih included:
    gates r, z, n in that order."""
    gh = torch.addmm(b_hh, h0, w_hh_t)
    hidden = h0.shape[1]
    rz = torch.sigmoid(gi[:, : 2 * hidden] + gh[:, : 2 * hidden])
    n = torch.tanh(
        torch.addcmul(gi[:, 2 * hidden :], rz[:, :hidden], gh[:, 2 * hidden :])
    )
    return torch.lerp(n, h0, rz[:, hidden:])


def _stack(rows: List[torch.Tensor]) -> torch.Tensor:
    return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)
