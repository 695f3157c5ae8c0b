"""Pure-PyTorch backend of the multi-blank RNN-T loss.

Exact and differentiable with ordinary autograd, on any device and dtype; vectorised
over the batch and over anti-diagonals ``n = t + u`` (one Python step per diagonal), so
it is slow but simple. It is the float64 oracle of the tests and the fallback for
devices that Numba cannot target.

Recursion (``lp(t,u,k) = log_softmax(acts[b,t,u])[k] - sigma``, LSE = log-sum-exp)::

    alpha(0,0) = 0
    alpha(t,u) = LSE( alpha(t-1,u)   + lp(t-1,u,blank),
                      alpha(t,u-1)   + lp(t,u-1,y_{u-1})          [u >= 1],
                      alpha(t-d_i,u) + lp(t-d_i,u,blank-1-i)      [t >= d_i] )
    log P = LSE( alpha(T-1,U-1) + lp(T-1,U-1,blank),
                 alpha(T-d_i,U-1) + lp(T-d_i,U-1,blank-1-i)   [T >= d_i] )
    cost = -(1 + fastemit_lambda) * log P

Every cell on diagonal n depends only on diagonals n-1 and n-d_i, so a diagonal is one
vectorised step. Diagonals are stored as (B, T) tensors indexed by t (u = n - t), cells
outside the grid holding a large negative finite number (not -inf, so that autograd
through logsumexp never produces NaN).
"""

from typing import List

import torch

from espnet_multiblank.autograd import LogSoftmaxGradModification
from espnet_multiblank.loss.options import LossOptions

_NEG = -1e30  # "log 0" that stays finite under addition


def _diagonal(x: torch.Tensor, n: int) -> torch.Tensor:
    """x: (B, T, U) -> (B, T) with out[:, t] = x[:, t, n - t] (NEG outside the grid)."""
    B, T, U = x.shape
    t = torch.arange(T, device=x.device)
    u = n - t
    inside = (u >= 0) & (u < U)
    vals = x[:, t, u.clamp(0, U - 1)]
    return torch.where(inside[None, :], vals, torch.full_like(vals, _NEG))


def _shift_t(x: torch.Tensor, d: int) -> torch.Tensor:
    """(B, T) -> (B, T) with out[:, t] = x[:, t - d] (NEG for t < d)."""
    if d >= x.shape[1]:
        return torch.full_like(x, _NEG)
    return torch.cat([torch.full_like(x[:, :d], _NEG), x[:, :-d]], dim=1)


def log_likelihood(
    lp_blank: torch.Tensor,
    lp_label: torch.Tensor,
    lp_big: List[torch.Tensor],
    durations,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
) -> torch.Tensor:
    """log P per utterance from the emission log-probs (sigma already subtracted).

    Args:
        lp_blank: (B, T, U) log-prob of the standard blank.
        lp_label: (B, T, U) log-prob of label y_u at (t, u) (the last column unused).
        lp_big: N tensors (B, T, U), log-prob of big blank i.
        durations: N ints.
        act_lens, label_lens: (B,) int64.
    Returns:
        (B,) log P (-inf-like large negative for impossible utterances).
    """
    B, T, U = lp_blank.shape
    if T == 0:  # no frames at all: only the empty path of a label-less utterance
        zero = torch.zeros((B,), dtype=lp_blank.dtype, device=lp_blank.device)
        return torch.where(label_lens == 0, zero, torch.full_like(zero, _NEG))
    n_diag = T + U - 1
    diag_blank = [_diagonal(lp_blank, n) for n in range(n_diag)]
    diag_label = [_diagonal(lp_label, n) for n in range(n_diag)]
    diag_big = [[_diagonal(x, n) for n in range(n_diag)] for x in lp_big]
    t_idx = torch.arange(T, device=lp_blank.device)

    first = torch.full((B, T), _NEG, dtype=lp_blank.dtype, device=lp_blank.device)
    first = torch.where(t_idx[None, :] == 0, torch.zeros_like(first), first)
    alphas = [first]
    for n in range(1, n_diag):
        prev = alphas[n - 1]
        terms = [
            _shift_t(prev + diag_blank[n - 1], 1),  # from (t-1, u) by blank
            prev + diag_label[n - 1],  # from (t, u-1) by label y_{u-1}
        ]
        for i, d in enumerate(durations):
            if n - d >= 0:
                terms.append(_shift_t(alphas[n - d] + diag_big[i][n - d], d))
        alpha = torch.logsumexp(torch.stack(terms), dim=0)
        # keep cells outside the grid at NEG (u = n - t must be in [0, U))
        u = n - t_idx
        inside = (u >= 0) & (u < U)
        alphas.append(torch.where(inside[None, :], alpha, torch.full_like(alpha, _NEG)))

    # Final readout: transitions that land exactly on t = T_b from row u = U_b - 1.
    alpha_all = torch.stack(alphas, dim=1)  # (B, n_diag, T) indexed [b, t + u, t]
    b_idx = torch.arange(B, device=lp_blank.device)
    u_last = label_lens
    ends = []
    for lp, d in [(lp_blank, 1)] + list(zip(lp_big, durations)):
        t_from = act_lens - d
        ok = t_from >= 0
        tf = t_from.clamp(min=0)
        a = alpha_all[b_idx, (tf + u_last).clamp(max=n_diag - 1), tf]
        e = a + lp[b_idx, tf, u_last]
        ends.append(torch.where(ok, e, torch.full_like(e, _NEG)))
    log_p = torch.logsumexp(torch.stack(ends), dim=0)
    # T_b = 0: the empty path is complete iff there are no labels.
    empty = act_lens == 0
    log_p = torch.where(empty & (label_lens == 0), torch.zeros_like(log_p), log_p)
    log_p = torch.where(empty & (label_lens > 0), torch.full_like(log_p, _NEG), log_p)
    return log_p


def _emission_log_probs(acts, labels, opts: LossOptions, clamp: float):
    if clamp > 0:
        acts = LogSoftmaxGradModification.apply(acts, clamp)
    lp = torch.log_softmax(acts, dim=-1) - opts.sigma  # (B, T, U, V)
    B, T, U, V = lp.shape
    lab = torch.zeros((B, U), dtype=torch.long, device=acts.device)
    if labels.shape[1] > 0:
        lab[:, : labels.shape[1]] = labels
    lp_label = torch.gather(lp, 3, lab[:, None, :, None].expand(B, T, U, 1))[..., 0]
    lp_blank = lp[..., opts.blank]
    lp_big = [lp[..., k] for k in opts.big_blank_ids]
    return lp_blank, lp_label, lp_big


def reference_costs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: LossOptions,
    clamp: float = 0.0,
) -> torch.Tensor:
    """Per-utterance costs ``-(1 + lambda) log P``, differentiable by autograd.

    Args:
        acts: (B, T, U, V) raw logits, float (computed in acts.dtype, half -> float32).
        labels: (B, L) int64, L <= U - 1, padding already replaced by valid ids.
        act_lens, label_lens: (B,) int64.
        opts: the loss options (``opts.clamp`` is ignored here: pass ``clamp`` to put a
            LogSoftmaxGradModification before the log-softmax).
    Returns:
        (B,) costs; +inf for an impossible utterance (T_b = 0 < L_b), whose gradient
        is 0. With FastEmit the autograd gradient is NeMo's FastEmit gradient (the label
        transitions weighted by 1 + lambda plus lambda * w_label(t,u) * p(t,u,.)), while
        the value is ``-(1 + lambda) log P``.
    """
    if acts.dtype in (torch.float16, torch.bfloat16):
        acts = acts.float()
    lp_blank, lp_label, lp_big = _emission_log_probs(acts, labels, opts, clamp)
    log_p = log_likelihood(
        lp_blank, lp_label, lp_big, opts.big_blank_durations, act_lens, label_lens
    )
    lam = opts.fastemit_lambda
    impossible = log_p <= _NEG / 2
    if lam > 0 and torch.is_grad_enabled() and lp_label.requires_grad:
        # w(t,u) = d log P / d lp_label(t,u): occupancy of the label transitions.
        (w,) = torch.autograd.grad(log_p.sum(), lp_label, retain_graph=True)
        surrogate = (w * lp_label).sum(dim=(1, 2))
        cost = -log_p - lam * (surrogate - surrogate.detach()) - lam * log_p.detach()
    else:
        cost = -(1.0 + lam) * log_p
    # impossible: +inf cost and exactly zero gradient
    cost = torch.where(impossible, torch.full_like(cost, float("inf")), cost)
    return cost
