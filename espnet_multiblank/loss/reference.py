"""Pure-PyTorch backends of the losses: the oracles of the tests.

Exact and differentiable with ordinary autograd, on any device and dtype; vectorised
over the batch and over anti-diagonals ``n = t + u`` (one Python step per diagonal), so
they are slow but simple. They are the float64 oracles of the tests and the fallback
for devices that Numba cannot target. One function per lattice family (the
recursions differ); the loss path picks it from the family record
(``espnet_multiblank.loss.families``).

Diagonals are stored as (B, T) tensors indexed by t (u = n - t), cells outside the
grid, and "log 0", holding a large negative finite number (not -inf, so that autograd
through logsumexp never produces NaN).

Each computes log P by the forward recursion of its lattice in ``docs/lattice.md``
(multi-blank RNN-T: section 2, :func:`reference_costs`; TDT: section 3.2,
:func:`tdt_reference_costs`) and the cost ``-(1 + fastemit_lambda) log P``.

In the multi-blank lattice every cell on diagonal n depends only on diagonals n-1 and
n-d_i, so a diagonal is one vectorised step. Every TDT step moves the path from
diagonal ``n`` to a later one (a label with duration ``e`` to ``n + e + 1``, a blank
with duration ``e >= 1`` to ``n + e``), even a label with duration 0, so a diagonal
depends only on earlier diagonals.

In both, rows of padding (t >= T_b or u > L_b) are replaced by zeros before the
log-softmax, so that whatever they hold (NaN included) never reaches the result or
the gradient.

The same recursions run the lattice stage on rows (:func:`rows_lattice`, the torch
lattice runner of the family records): log P from the rows' log-probs, the
occupancies by autograd.
"""

from typing import List, Sequence

import torch

from espnet_multiblank.autograd import LogSoftmaxGradModification
from espnet_multiblank.loss.options import LossOptions, TDTOptions
from espnet_multiblank.loss.rows import RowsLayout, fill_coefficients

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


def _fastemit_costs(log_p, lp_label, lam: float) -> torch.Tensor:
    """``-(1 + lam) log P`` whose autograd gradient is FastEmit's: the label steps'
    log-probs ``lp_label`` (B, T, U) weighted by 1 + lam, the normaliser's part by
    ``gamma + lam W_label``. +inf with an exactly zero gradient where log P is "log
    0" (an impossible utterance)."""
    impossible = log_p <= _NEG / 2
    if lam > 0 and torch.is_grad_enabled() and lp_label.requires_grad:
        # W_label(t,u) = d log P / d lp_label(t,u): occupancy of the label steps
        (w,) = torch.autograd.grad(
            log_p.sum(), lp_label, retain_graph=True, allow_unused=True
        )
        if w is None:  # no frames at all (T = 0): no label step
            w = torch.zeros_like(lp_label)
        surrogate = (w * lp_label).sum(dim=(1, 2))
        cost = -log_p - lam * (surrogate - surrogate.detach()) - lam * log_p.detach()
    else:
        cost = -(1.0 + lam) * log_p
    return torch.where(impossible, torch.full_like(cost, float("inf")), cost)


def _no_frames(steps: torch.Tensor, label_lens: torch.Tensor) -> torch.Tensor:
    """log P (B,) of a batch with no frames at all (T = 0), from its step log-probs
    ``steps`` (B, 0, U, ...): only the empty path of a label-less utterance (log P 0;
    "log 0" otherwise), still part of ``steps``' autograd graph."""
    B = steps.shape[0]
    zero = torch.zeros((B,), dtype=steps.dtype, device=steps.device)
    zero = zero + 0.0 * steps.sum()  # (empty) still part of the graph
    return torch.where(label_lens == 0, zero, torch.full_like(zero, _NEG))


def _first_diagonal(B: int, T: int, like: torch.Tensor) -> torch.Tensor:
    """alpha on diagonal 0 (B, T) indexed by t: 0 at (0, 0), "log 0" elsewhere."""
    t_idx = torch.arange(T, device=like.device)
    first = torch.full((B, T), _NEG, dtype=like.dtype, device=like.device)
    return torch.where(t_idx[None, :] == 0, torch.zeros_like(first), first)


def _complete_paths(alphas, act_lens, label_lens, ends) -> torch.Tensor:
    """log P (B,) from the alpha diagonals (each (B, T), indexed by t) and the final
    steps ``ends``: pairs ``(d, lp)`` of a step of d frames from (T_b - d, L_b) that
    lands exactly on T_b, with log-prob ``lp(b, t, u)`` (index tensors); T_b = 0: 0
    without labels, else "log 0"."""
    alpha_all = torch.stack(alphas, dim=1)  # (B, n_diag, T) indexed [b, t + u, t]
    n_diag = alpha_all.shape[1]
    b_idx = torch.arange(alpha_all.shape[0], device=alpha_all.device)
    terms = []
    for d, lp in ends:
        t_from = act_lens - d
        ok = t_from >= 0
        tf = t_from.clamp(min=0)
        a = alpha_all[b_idx, (tf + label_lens).clamp(max=n_diag - 1), tf]
        x = a + lp(b_idx, tf, label_lens)
        terms.append(torch.where(ok, x, torch.full_like(x, _NEG)))
    log_p = torch.logsumexp(torch.stack(terms), dim=0)
    # T_b = 0: the empty path is complete iff there are no labels.
    empty = act_lens == 0
    log_p = torch.where(empty & (label_lens == 0), torch.zeros_like(log_p), log_p)
    log_p = torch.where(empty & (label_lens > 0), torch.full_like(log_p, _NEG), log_p)
    return log_p


# ------------------------------------------------------------ multi-blank RNN-T
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
    if T == 0:
        return _no_frames(lp_blank, label_lens)
    n_diag = T + U - 1
    diag_blank = [_diagonal(lp_blank, n) for n in range(n_diag)]
    diag_label = [_diagonal(lp_label, n) for n in range(n_diag)]
    diag_big = [[_diagonal(x, n) for n in range(n_diag)] for x in lp_big]
    t_idx = torch.arange(T, device=lp_blank.device)

    alphas = [_first_diagonal(B, T, lp_blank)]
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

    # final readout: the blanks from row u = L_b that land exactly on t = T_b
    steps = zip([lp_blank] + list(lp_big), [1] + list(durations))
    ends = [(d, lambda b, t, u, lp=lp: lp[b, t, u]) for lp, d in steps]
    return _complete_paths(alphas, act_lens, label_lens, ends)


def _without_padding(acts, act_lens, label_lens):
    """``acts`` (B, T, U, V') with the rows of padding (t >= T_b or u > L_b) replaced
    by zeros, so that whatever they hold (NaN included) reaches neither the costs nor
    the gradient (autograd of ``where``: exactly 0 there)."""
    B, T, U = acts.shape[:3]
    t = torch.arange(T, device=acts.device)
    u = torch.arange(U, device=acts.device)
    valid = (t[None, :, None] < act_lens[:, None, None]) & (
        u[None, None, :] <= label_lens[:, None, None]
    )
    return torch.where(valid[..., None], acts, acts.new_zeros(()))


def _multiblank_log_p(acts, labels, act_lens, label_lens, opts, clamp: float):
    """(log P (B,), label log-probs lp(t, u, y_u) (B, T, U)) of the multi-blank
    lattice."""
    acts = _without_padding(acts, act_lens, label_lens)
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
    log_p = log_likelihood(
        lp_blank, lp_label, lp_big, opts.big_blank_durations, act_lens, label_lens
    )
    return log_p, lp_label


def _costs(log_p_of, acts, labels, act_lens, label_lens, opts, clamp: float):
    """The costs of either lattice from its ``log_p_of(acts, labels, act_lens,
    label_lens, opts, clamp) -> (log P, label log-probs)`` (half logits computed in
    float32)."""
    if acts.dtype in (torch.float16, torch.bfloat16):
        acts = acts.float()
    log_p, lp_label = log_p_of(acts, labels, act_lens, label_lens, opts, clamp)
    cost = _fastemit_costs(log_p, lp_label, opts.fastemit_lambda)
    return cost + 0.0  # no -0.0 for the empty path


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
        (B,) costs (float, +0.0 for T_b = 0 = L_b); +inf for an impossible utterance
        (T_b = 0 < L_b), whose gradient is 0. With FastEmit the autograd gradient is
        NeMo's FastEmit gradient (the label transitions weighted by 1 + lambda plus
        lambda * w_label(t,u) * p(t,u,.)), while the value is ``-(1 + lambda) log P``.
    """
    return _costs(_multiblank_log_p, acts, labels, act_lens, label_lens, opts, clamp)


# -------------------------------------------------------------------------- TDT
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
    if T == 0:
        return _no_frames(blank_arcs, label_lens)
    n_diag = T + U - 1
    diag_blank = [_diagonal(blank_arcs, n) for n in range(n_diag)]  # (B, T, D) each
    diag_label = [_diagonal(label_arcs, n) for n in range(n_diag)]
    t_idx = torch.arange(T, device=dev)

    first = _first_diagonal(B, T, blank_arcs)
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

    # final readout: the blanks from row L_b that land exactly on t = T_b
    ends = [
        (e, lambda b, t, u, j=j: blank_arcs[b, t, u, j])
        for j, e in enumerate(durations)
        if e >= 1
    ]
    return _complete_paths(alphas, act_lens, label_lens, ends)


def _tdt_log_p(acts, labels, act_lens, label_lens, opts: TDTOptions, clamp):
    """(log P (B,), token label log-probs tok(t, u, y_u) (B, T, U)) of the TDT
    lattice."""
    B, T, U, VD = acts.shape
    D = opts.num_durations
    V = VD - D
    acts = _without_padding(acts, act_lens, label_lens)
    if clamp > 0:
        acts = LogSoftmaxGradModification.apply(acts, clamp)
    tok = (torch.log_softmax(acts[..., :V], dim=-1) - opts.sigma).clamp(min=_NEG)
    dur = torch.log_softmax(acts[..., V:], dim=-1).clamp(min=_NEG)
    lab = torch.zeros((B, U), dtype=torch.long, device=acts.device)
    if labels.shape[1] > 0:
        lab[:, : labels.shape[1]] = labels
    tok_label = torch.gather(tok, 3, lab[:, None, :, None].expand(B, T, U, 1))[..., 0]
    tok_blank = tok[..., opts.blank]
    log_p = tdt_log_likelihood(
        tok_blank[..., None] + dur,
        tok_label[..., None] + dur,
        opts.durations,
        act_lens,
        label_lens,
    )
    return log_p, tok_label


def tdt_reference_costs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts: TDTOptions,
    clamp: float = 0.0,
) -> torch.Tensor:
    """:func:`reference_costs` of the TDT lattice: ``acts`` (B, T, U, V + D), one
    log-softmax over the V token logits and one over the D duration logits; +inf
    (with zero gradient) for every utterance without a complete path; ``opts.omega``
    is ignored as ``opts.clamp`` is. With FastEmit the autograd gradient is NeMo's TDT
    FastEmit gradient (the token gradient of the label steps weighted by 1 + lambda
    plus ``lambda * W_label(t,u) * p(t,u,:)``; the duration gradient unchanged)."""
    return _costs(_tdt_log_p, acts, labels, act_lens, label_lens, opts, clamp)


# ---------------------------------------------------------- the lattice on rows
def multiblank_rows_log_likelihood(opts: LossOptions, steps, act_lens, label_lens):
    """log P of a multi-blank lattice from the step slots (B, T, U, N + 2) of rows
    (``loss/rows.py``: blank, label, big blanks; sigma included)."""
    return log_likelihood(
        steps[..., 0],
        steps[..., 1],
        [steps[..., 2 + i] for i in range(opts.num_big_blanks)],
        opts.big_blank_durations,
        act_lens,
        label_lens,
    )


def tdt_rows_log_likelihood(opts: TDTOptions, steps, act_lens, label_lens):
    """log P of a TDT lattice from the step slots (B, T, U, D + 2) of rows (blank,
    label, then the D duration log-probs)."""
    dur = steps[..., 2:]
    return tdt_log_likelihood(
        steps[..., :1] + dur,
        steps[..., 1:2] + dur,
        opts.durations,
        act_lens,
        label_lens,
    )


def rows_lattice(
    layout: RowsLayout,
    rows: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    need_grad: bool,
    log_likelihood_of,
    fastemit_lambda: float,
) -> torch.Tensor:
    """The lattice stage on rows (the contract of ``loss/rows.py``) by the recursions
    of this module, on any device; the occupancies by autograd: W of a step = d log P
    / d (its log-prob).

    Args:
        layout: the rows' layout; rows: (B, T, U, width) float64 tensor, its valid
            rows overwritten as the contract says when ``need_grad``.
        act_lens, label_lens: (B,) int64 tensors on its device.
        log_likelihood_of: ``(steps, act_lens, label_lens) -> (B,) log P`` of the
            lattice from the step slots (B, T, U, num_steps).
        fastemit_lambda: for the coefficient slots.
    Returns:
        log_p: (B,) float64 tensor (0 for T_b = 0 = L_b, -inf when impossible).
    """
    B, T, U, _ = rows.shape
    if T == 0:  # every T_b = 0: the empty path (log P = 0) or impossible
        zero = torch.zeros((B,), dtype=torch.float64, device=rows.device)
        return torch.where(label_lens == 0, zero, float("-inf"))
    K = layout.num_steps
    t = torch.arange(T, device=rows.device)
    u = torch.arange(U, device=rows.device)
    valid = (t.view(1, T, 1) < act_lens.view(B, 1, 1)) & (
        u.view(1, 1, U) <= label_lens.view(B, 1, 1)
    )
    # padding may hold anything (NaN included) and -inf marks the missing label of the
    # last row: both become the finite "log 0" of the recursions
    lp = torch.where(valid[..., None], rows[..., :K], _NEG).clamp(min=_NEG)
    with torch.enable_grad():
        lp = lp.detach().requires_grad_(need_grad)
        log_p = log_likelihood_of(lp, act_lens, label_lens)
        possible = log_p > _NEG / 2
        if need_grad:
            (occ,) = torch.autograd.grad(
                torch.where(possible, log_p, 0.0).sum(), lp, allow_unused=True
            )
    log_p = torch.where(possible, log_p.detach(), float("-inf"))
    if need_grad:
        keep = (valid & possible.view(B, 1, 1))[..., None]
        rows[..., :K] = torch.where(
            keep, occ if occ is not None else 0.0, rows[..., :K]
        )
        fill_coefficients(layout, rows, log_p, fastemit_lambda)
    return log_p
