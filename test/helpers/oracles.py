"""Independent oracles for the multi-blank RNN-T loss tests.

Everything here follows ``docs/lattice.md`` directly and is written without looking
at (or importing) ``espnet_multiblank.loss.reference``:

* :func:`enumerate_paths` lists EVERY path of the definition (label, standard blank, big
  blanks landing exactly on ``T_b``; overshooting steps are not allowed);
* :func:`brute_force_log_prob` sums ``exp`` of the path scores in float64, with
  ``lp = log_softmax(logits) - sigma``;
* :func:`brute_force_costs` returns the per-utterance costs ``-(1 + lambda) log P`` and
  the per-utterance gradients ``d cost_b / d logits_b`` (autograd on the enumerated
  sum), with the FastEmit term of docs/lattice.md built explicitly and the clamp applied
  per utterance;
* :func:`reduce_oracle` applies a reduction and its gradient weights;
* :func:`diagonal_log_prob`: a float64 NumPy alpha recursion (one vectorised step per
  anti-diagonal, the terminal frame t = T_b kept as an extra row), for long utterances
  where enumeration is impossible; checked against the enumeration on tiny cases;
* :func:`standard_equal_logits_cost`: closed form for the standard loss with all-equal
  logits.

Only meant for tiny shapes (T <= ~9, U <= 4): the number of paths grows exponentially.
"""

import math
from functools import lru_cache
from typing import List, Sequence, Tuple

import numpy as np
import torch

Step = Tuple[int, int, int]  # (t, u, symbol)


def enumerate_paths(
    T_b: int, labels: Sequence[int], blank: int, durations: Sequence[int]
) -> List[Tuple[Step, ...]]:
    """All complete paths of one utterance, each a tuple of emitted ``(t, u, k)``.

    A path starts at (0, 0); at (t, u) with t < T_b it emits label ``labels[u]`` (if
    u < L) -> (t, u + 1), the standard blank -> (t + 1, u), or big blank i (index
    ``blank - 1 - i``) -> (t + d_i, u) provided ``t + d_i <= T_b``. It is complete when
    it is at t = T_b with u = L. With T_b = 0 the empty path is complete iff L = 0.
    """
    labels = tuple(int(y) for y in labels)
    durations = tuple(int(d) for d in durations)
    return list(_paths_from(0, 0, T_b, labels, blank, durations))


@lru_cache(maxsize=None)
def _paths_from(t, u, T_b, labels, blank, durations):
    L = len(labels)
    if t == T_b:
        return ((),) if u == L else ()
    out = []
    if u < L:
        for rest in _paths_from(t, u + 1, T_b, labels, blank, durations):
            out.append(((t, u, labels[u]),) + rest)
    moves = [(blank, 1)] + [(blank - 1 - i, d) for i, d in enumerate(durations)]
    for k, d in moves:
        if t + d <= T_b:
            for rest in _paths_from(t + d, u, T_b, labels, blank, durations):
                out.append(((t, u, k),) + rest)
    return tuple(out)


def brute_force_log_prob(
    lp: torch.Tensor, paths: List[Tuple[Step, ...]]
) -> torch.Tensor:
    """log sum over ``paths`` of exp(sum of ``lp[t, u, k]`` over the path's steps).

    Args:
        lp: (T, U, V) emission log-probs of one utterance (sigma already subtracted).
        paths: output of :func:`enumerate_paths`.
    Returns:
        0-d tensor, differentiable w.r.t. ``lp``; -inf when there is no path.
    """
    if not paths:
        return lp.new_tensor(float("-inf")) + 0.0 * lp.sum()
    T, U, V = lp.shape
    flat = torch.cat([lp.reshape(-1), lp.new_zeros(1)])  # last entry: padding (log 1)
    pad = flat.shape[0] - 1
    longest = max(len(p) for p in paths)
    index = torch.full((len(paths), max(longest, 1)), pad, dtype=torch.long)
    for j, path in enumerate(paths):
        for s, (t, u, k) in enumerate(path):
            index[j, s] = (t * U + u) * V + k
    scores = flat[index.to(lp.device)].sum(dim=1)
    return torch.logsumexp(scores, dim=0)


def brute_force_costs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int,
    durations: Sequence[int] = (),
    sigma: float = 0.0,
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-utterance costs and gradients by path enumeration, in float64 on the CPU.

    Returns:
        costs: (B,) float64, ``-(1 + lambda) log P_b`` (+inf when no path exists).
        grads: (B, T, U, V) float64, ``d cost_b / d logits_b`` as docs/lattice.md
            defines it: the exact gradient of ``-log P_b`` plus, with FastEmit,
            ``lambda * w(t,u) * (p(t,u,:) - onehot(y_u))`` where
            ``w(t,u) = d log P_b / d lp(t,u,y_u)`` (the label-transition occupancy),
            i.e. the label term times (1 + lambda) plus lambda * w * p; then clipped to
            [-clamp, clamp] when clamp > 0. Zero for an impossible utterance.
    """
    acts = acts.detach().to("cpu", torch.float64)
    B, T, U, V = acts.shape
    costs = torch.zeros(B, dtype=torch.float64)
    grads = torch.zeros(B, T, U, V, dtype=torch.float64)
    for b in range(B):
        T_b, L_b = int(act_lens[b]), int(label_lens[b])
        y = [int(v) for v in labels[b, :L_b]]
        paths = enumerate_paths(T_b, y, blank, durations)
        if not paths:
            costs[b] = float("inf")
            continue
        x = acts[b].clone().requires_grad_(True)
        lp = torch.log_softmax(x, dim=-1) - sigma
        log_p = brute_force_log_prob(lp, paths)
        d_acts, d_lp = torch.autograd.grad(log_p, (x, lp))
        g = -d_acts  # d(-log P)/d logits
        if fastemit_lambda > 0:
            p = torch.softmax(acts[b], dim=-1)
            for u in range(L_b):
                onehot = torch.zeros(V, dtype=torch.float64)
                onehot[y[u]] = 1.0
                w = d_lp[:, u, y[u]]  # (T,): label-transition occupancy at (t, u)
                g[:, u, :] += fastemit_lambda * w[:, None] * (p[:, u, :] - onehot)
        if clamp > 0:
            g = g.clamp(-clamp, clamp)
        costs[b] = -(1.0 + fastemit_lambda) * float(log_p.detach())
        grads[b] = g
    return costs, grads


def reduction_weights_oracle(reduction: str, label_lens: torch.Tensor) -> torch.Tensor:
    """(B,) float64 CPU weights w_b such that the reduced loss is sum_b w_b cost_b
    (each reduction's definition written out, not the package's code)."""
    label_lens = label_lens.cpu()
    B = label_lens.shape[0]
    if reduction in ("none", "sum"):
        return torch.ones(B, dtype=torch.float64)
    if reduction in ("mean", "mean_batch"):  # ESPnet's mean, NeMo's mean_batch
        return torch.full((B,), 1.0 / B, dtype=torch.float64)
    if reduction == "mean_volume":  # NeMo's: sum of costs / sum of label counts
        total = float(label_lens.to(torch.float64).sum())
        return torch.full((B,), 1.0 / max(total, 1.0), dtype=torch.float64)
    if reduction == "mean_label_normalized":  # NeMo's mean
        L = label_lens.to(torch.float64).clamp(min=1.0)
        return 1.0 / (B * L)
    raise ValueError(reduction)


def reduce_oracle(
    costs: torch.Tensor,
    grads: torch.Tensor,
    label_lens: torch.Tensor,
    reduction: str,
    grad_out: torch.Tensor = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reduced loss and its gradient w.r.t. the logits.

    For ``reduction == "none"`` the gradient is that of ``(costs * grad_out).sum()``
    (``grad_out`` defaults to ones).
    """
    w = reduction_weights_oracle(reduction, label_lens.cpu())
    if reduction == "none":
        if grad_out is not None:
            w = w * grad_out.to("cpu", torch.float64)
        return costs, grads * w.view(-1, 1, 1, 1)
    total = (costs * w).sum()
    return total, grads * w.view(-1, 1, 1, 1)


def standard_equal_logits_cost(T_b: int, L_b: int, V: int) -> float:
    """Standard RNN-T cost with all-equal logits: every emission has probability 1/V and
    every path has T_b + L_b steps; there are C(T_b - 1 + L_b, L_b) paths (the labels
    are distributed over the T_b frames, the last blank comes last)."""
    if T_b == 0:
        return 0.0 if L_b == 0 else math.inf
    log_paths = (
        math.lgamma(T_b + L_b) - math.lgamma(L_b + 1) - math.lgamma(T_b)
    )  # log C(T_b - 1 + L_b, L_b)
    return (T_b + L_b) * math.log(V) - log_paths


def diagonal_log_prob(
    acts: torch.Tensor,
    labels: Sequence[int],
    T_b: int,
    L_b: int,
    blank: int,
    durations: Sequence[int] = (),
    sigma: float = 0.0,
) -> float:
    """log P of one utterance by the forward recursion, in float64 NumPy.

    ``a[t, u]`` is the log-weight of all partial paths reaching (t, u); the row t = T_b
    holds the arrivals on the final frame (reached only by blanks, no label emitted
    there), so that log P = a[T_b, L_b]. Cells on the anti-diagonal t + u = n depend on
    diagonals n - 1 and n - d_i only: each diagonal is one vectorised step.

    Args:
        acts: (T, U, V) raw logits of one utterance (any float dtype).
    """
    if T_b == 0:
        return 0.0 if L_b == 0 else -math.inf
    U_b = L_b + 1
    x = acts[:T_b, :U_b].to(torch.float64)
    lp = (torch.log_softmax(x, dim=-1) - sigma).numpy()
    lb = lp[:, :, blank]
    big = [lp[:, :, blank - 1 - i] for i in range(len(durations))]
    y = np.asarray(list(labels)[:L_b], dtype=np.int64)
    ly = np.take_along_axis(lp[:, :L_b, :], y[None, :, None], axis=2)[..., 0]
    a = np.full((T_b + 1, U_b), -np.inf)
    a[0, 0] = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        for n in range(1, T_b + U_b):
            t = np.arange(max(0, n - U_b + 1), min(n, T_b) + 1)
            u = n - t
            acc = np.full(t.shape, -np.inf)
            m = t >= 1  # standard blank from (t - 1, u)
            acc[m] = np.logaddexp(acc[m], a[t[m] - 1, u[m]] + lb[t[m] - 1, u[m]])
            m = (u >= 1) & (t < T_b)  # label y_{u-1} from (t, u - 1)
            acc[m] = np.logaddexp(acc[m], a[t[m], u[m] - 1] + ly[t[m], u[m] - 1])
            for lbb, d in zip(big, durations):
                m = t >= d  # big blank from (t - d, u)
                acc[m] = np.logaddexp(acc[m], a[t[m] - d, u[m]] + lbb[t[m] - d, u[m]])
            a[t, u] = acc
    return float(a[T_b, L_b])
