"""Pure-PyTorch backend of the TDT loss (``docs/lattice.md`` section 3).

Exact and differentiable with ordinary autograd, on any device and dtype; vectorised
over the batch and over anti-diagonals ``n = t + u``. Every TDT step moves the path
from diagonal ``n`` to a later one (a label with duration ``e`` to ``n + e + 1``, a
blank with duration ``e >= 1`` to ``n + e``), even a label with duration 0, so a
diagonal depends only on earlier diagonals and is one vectorised step. It is slow but
simple: the float64 oracle of the tests and the fallback for devices that Numba cannot
target.

With ``tok(t,u,k) = log_softmax(z[:V])[k] - sigma`` and
``dur(t,u,j) = log_softmax(z[V:])[j]``::

    alpha(0,0) = 0
    alpha(t,u) = LSE( alpha(t-e_j,u)   + tok(t-e_j,u,blank)     + dur(t-e_j,u,j)
                                                         [e_j >= 1, t >= e_j],
                      alpha(t-e_j,u-1) + tok(t-e_j,u-1,y_{u-1}) + dur(t-e_j,u-1,j)
                                                         [u >= 1, t >= e_j] )
    log P = LSE over j with e_j >= 1, T_b >= e_j of
            alpha(T_b-e_j,L_b) + tok(T_b-e_j,L_b,blank) + dur(T_b-e_j,L_b,j)
    cost  = -(1 + fastemit_lambda) * log P

Diagonals are stored as (B, T) tensors indexed by t (u = n - t); cells outside the
grid, and "log 0", hold a large negative finite number (not -inf, so that autograd
through logsumexp never produces NaN). Rows of padding (t >= T_b or u > L_b) are
replaced by zeros before the log-softmax, so that whatever they hold (NaN included)
never reaches the result or the gradient.
"""

from typing import Sequence

import torch

from espnet_multiblank.autograd import LogSoftmaxGradModification
from espnet_multiblank.loss.tdt_options import TDTOptions

_NEG = -1e30  # "log 0" that stays finite under addition


def _diagonal(x: torch.Tensor, n: int) -> torch.Tensor:
    """x: (B, T, U, ...) -> (B, T, ...) with out[:, t] = x[:, t, n - t] (NEG outside
    the grid)."""
    B, T, U = x.shape[:3]
    t = torch.arange(T, device=x.device)
    u = n - t
    inside = (u >= 0) & (u < U)
    vals = x[:, t, u.clamp(0, U - 1)]
    inside = inside.view((1, T) + (1,) * (vals.dim() - 2))
    return torch.where(inside, vals, torch.full_like(vals, _NEG))


def _shift_t(x: torch.Tensor, d: int) -> torch.Tensor:
    """(B, T) -> (B, T) with out[:, t] = x[:, t - d] (NEG for t < d); d >= 0."""
    if d == 0:
        return x
    if d >= x.shape[1]:
        return torch.full_like(x, _NEG)
    return torch.cat([torch.full_like(x[:, :d], _NEG), x[:, :-d]], dim=1)


def tdt_log_likelihood(
    blank_arcs: torch.Tensor,
    label_arcs: torch.Tensor,
    durations: Sequence[int],
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
) -> torch.Tensor:
    """log P per utterance from the step log-probs.

    Args:
        blank_arcs: (B, T, U, D) ``tok(t,u,blank) + dur(t,u,j)`` (sigma included).
        label_arcs: (B, T, U, D) ``tok(t,u,y_u) + dur(t,u,j)`` (the last column unused).
        durations: the D durations e_j.
        act_lens, label_lens: (B,) int64.
    Returns:
        (B,) log P; a large negative number (<= NEG / 2) for an impossible utterance.
    """
    B, T, U, D = blank_arcs.shape
    dev = blank_arcs.device
    if T == 0:  # no frames at all: only the empty path of a label-less utterance
        zero = torch.zeros((B,), dtype=blank_arcs.dtype, device=dev)
        zero = zero + 0.0 * blank_arcs.sum()  # (empty) still part of the graph
        return torch.where(label_lens == 0, zero, torch.full_like(zero, _NEG))
    n_diag = T + U - 1
    diag_blank = [_diagonal(blank_arcs, n) for n in range(n_diag)]  # (B, T, D) each
    diag_label = [_diagonal(label_arcs, n) for n in range(n_diag)]
    t_idx = torch.arange(T, device=dev)

    first = torch.full((B, T), _NEG, dtype=blank_arcs.dtype, device=dev)
    first = torch.where(t_idx[None, :] == 0, torch.zeros_like(first), first)
    alphas = [first]
    for n in range(1, n_diag):
        terms = []
        for j, e in enumerate(durations):
            if e >= 1 and n - e >= 0:  # blank from (t - e, u): diagonal n - e
                src = n - e
                terms.append(_shift_t(alphas[src] + diag_blank[src][..., j], e))
            if n - 1 - e >= 0:  # label from (t - e, u - 1): diagonal n - 1 - e
                src = n - 1 - e
                terms.append(_shift_t(alphas[src] + diag_label[src][..., j], e))
        u = n - t_idx
        inside = (u >= 0) & (u < U)
        if terms:
            alpha = torch.logsumexp(torch.stack(terms), dim=0)
            alpha = torch.where(inside[None, :], alpha, torch.full_like(alpha, _NEG))
        else:
            alpha = torch.full_like(first, _NEG)
        alphas.append(alpha.clamp(min=_NEG))

    # Final readout: blanks from row L_b that land exactly on t = T_b.
    alpha_all = torch.stack(alphas, dim=1)  # (B, n_diag, T) indexed [b, t + u, t]
    b_idx = torch.arange(B, device=dev)
    ends = []
    for j, e in enumerate(durations):
        if e < 1:
            continue
        t_from = act_lens - e
        ok = t_from >= 0
        tf = t_from.clamp(min=0)
        a = alpha_all[b_idx, (tf + label_lens).clamp(max=n_diag - 1), tf]
        x = a + blank_arcs[b_idx, tf, label_lens, j]
        ends.append(torch.where(ok, x, torch.full_like(x, _NEG)))
    log_p = torch.logsumexp(torch.stack(ends), dim=0)
    # T_b = 0: the empty path is complete iff there are no labels.
    empty = act_lens == 0
    log_p = torch.where(empty & (label_lens == 0), torch.zeros_like(log_p), log_p)
    log_p = torch.where(empty & (label_lens > 0), torch.full_like(log_p, _NEG), log_p)
    return log_p


def _step_log_probs(acts, labels, act_lens, label_lens, opts: TDTOptions, clamp):
    """(token label log-probs (B,T,U), blank arcs (B,T,U,D), label arcs (B,T,U,D))."""
    B, T, U, VD = acts.shape
    D = opts.num_durations
    V = VD - D
    t = torch.arange(T, device=acts.device)
    u = torch.arange(U, device=acts.device)
    valid = (t[None, :, None] < act_lens[:, None, None]) & (
        u[None, None, :] <= label_lens[:, None, None]
    )
    acts = torch.where(valid[..., None], acts, acts.new_zeros(()))
    if clamp > 0:
        acts = LogSoftmaxGradModification.apply(acts, clamp)
    tok = (torch.log_softmax(acts[..., :V], dim=-1) - opts.sigma).clamp(min=_NEG)
    dur = torch.log_softmax(acts[..., V:], dim=-1).clamp(min=_NEG)
    lab = torch.zeros((B, U), dtype=torch.long, device=acts.device)
    if labels.shape[1] > 0:
        lab[:, : labels.shape[1]] = labels
    tok_label = torch.gather(tok, 3, lab[:, None, :, None].expand(B, T, U, 1))[..., 0]
    tok_blank = tok[..., opts.blank]
    return tok_label, tok_blank[..., None] + dur, tok_label[..., None] + dur


def tdt_reference_costs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    clamp: float = 0.0,
) -> torch.Tensor:
    """Per-utterance TDT costs ``-(1 + lambda) log P``, differentiable by autograd.

    Args:
        acts: (B, T, U, V + D) raw logits (computed in acts.dtype; half -> float32).
        labels: (B, L) int64, L <= U - 1, padding already replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: the loss options (``opts.clamp`` and ``opts.omega`` are ignored here:
            pass ``clamp`` to clip d cost_b / d acts_b elementwise through a
            LogSoftmaxGradModification before the log-softmaxes).
    Returns:
        (B,) costs; +inf (with zero gradient) for an impossible utterance. With
        FastEmit the autograd gradient is NeMo's TDT FastEmit gradient (the token
        gradient of the label steps weighted by 1 + lambda plus
        ``lambda * W_label(t,u) * p(t,u,:)``; the duration gradient unchanged), while
        the value is ``-(1 + lambda) log P``.
    """
    if acts.dtype in (torch.float16, torch.bfloat16):
        acts = acts.float()
    tok_label, blank_arcs, label_arcs = _step_log_probs(
        acts, labels, act_lens, label_lens, opts, clamp
    )
    log_p = tdt_log_likelihood(
        blank_arcs, label_arcs, opts.durations, act_lens, label_lens
    )
    lam = opts.fastemit_lambda
    impossible = log_p <= _NEG / 2
    if lam > 0 and torch.is_grad_enabled() and tok_label.requires_grad:
        # W_label(t,u) = d log P / d tok(t,u,y_u): occupancy of the label steps
        (w,) = torch.autograd.grad(log_p.sum(), tok_label, retain_graph=True)
        surrogate = (w * tok_label).sum(dim=(1, 2))
        cost = -log_p - lam * (surrogate - surrogate.detach()) - lam * log_p.detach()
    else:
        cost = -(1.0 + lam) * log_p
    cost = torch.where(impossible, torch.full_like(cost, float("inf")), cost)
    return cost + 0.0  # no -0.0 for the empty path
