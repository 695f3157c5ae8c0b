"""Independent oracles for the TDT loss tests, written from ``docs/lattice.md``
(sections 1 and 3) without looking at (or importing) the package's TDT code.

* :func:`enumerate_tdt_paths` lists EVERY complete path of one utterance: at node
  (t, u) a step emits the label ``y_u`` (while u < L) with any duration ``e_j``, landing
  on (t + e_j, u + 1), which must be a frame < T_b; or the blank with a duration
  ``e_j >= 1``, landing on (t + e_j, u): a frame < T_b continues the path, exactly T_b
  after the last label completes it, anything else leads nowhere. With T_b = 0 the
  empty path is complete iff L = 0.
* :func:`tdt_brute_force_costs` sums the probabilities of those paths in float64
  (token log-prob ``log_softmax(z[:V]) - sigma`` plus duration log-prob
  ``log_softmax(z[V:])`` per step) and differentiates the sum with autograd; FastEmit
  and clamp are applied as docs/lattice.md section 3.4 defines them.
* :func:`tdt_forward_log_prob`: a float64 NumPy forward recursion in raster order
  (t outer, u inner) for shapes too long to enumerate; checked against the enumeration.

Only meant for tiny shapes (T <= ~7, L <= 3, D <= 4): the number of paths grows
exponentially.
"""

import math
from functools import lru_cache
from typing import List, Sequence, Tuple

import numpy as np
import torch

Step = Tuple[int, int, int, int]  # (t, u, token, duration slot j)


def enumerate_tdt_paths(
    T_b: int, labels: Sequence[int], blank: int, durations: Sequence[int]
) -> List[Tuple[Step, ...]]:
    """All complete paths of one utterance, each a tuple of steps ``(t, u, k, j)``."""
    labels = tuple(int(y) for y in labels)
    durations = tuple(int(d) for d in durations)
    if T_b == 0:
        return [()] if not labels else []
    return list(_paths_from(0, 0, T_b, labels, blank, durations))


@lru_cache(maxsize=None)
def _paths_from(t, u, T_b, labels, blank, durations):
    L = len(labels)
    out = []
    for j, e in enumerate(durations):
        if u < L and t + e < T_b:  # a label must land on a frame
            for rest in _paths_from(t + e, u + 1, T_b, labels, blank, durations):
                out.append(((t, u, labels[u], j),) + rest)
        if e >= 1:  # a blank never has duration 0
            if t + e < T_b:
                for rest in _paths_from(t + e, u, T_b, labels, blank, durations):
                    out.append(((t, u, blank, j),) + rest)
            elif t + e == T_b and u == L:
                out.append(((t, u, blank, j),))
    return tuple(out)


def tdt_path_log_prob(tok, dur, paths) -> torch.Tensor:
    """log sum over ``paths`` of exp(sum over steps of tok[t,u,k] + dur[t,u,j]).

    Args:
        tok: (T, U, V) token log-probs (sigma subtracted).
        dur: (T, U, D) duration log-probs.
    Returns:
        0-d tensor differentiable w.r.t. tok and dur; -inf when there is no path.
    """
    if not paths:
        return tok.new_tensor(-math.inf) + 0.0 * (tok.sum() + dur.sum())
    scores = []
    for path in paths:
        s = tok.new_zeros(())
        for t, u, k, j in path:
            s = s + tok[t, u, k] + dur[t, u, j]
        scores.append(s)
    return torch.logsumexp(torch.stack(scores), dim=0)


def tdt_brute_force_costs(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens,
    label_lens,
    blank: int,
    durations: Sequence[int],
    sigma: float = 0.0,
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-utterance TDT costs and gradients by enumeration, float64 on the CPU.

    Args:
        acts: (B, T, U, V + D) raw logits.
    Returns:
        costs: (B,) float64 ``-(1 + lambda) log P_b`` (+inf without a path).
        grads: (B, T, U, V + D) float64 ``d cost_b / d acts_b``: the gradient of
            ``-log P_b``, plus with FastEmit ``lambda * w(t,u) * (p - onehot(y_u))`` on
            the token logits only (``w(t,u) = d log P / d tok(t,u,y_u)``, the label
            occupancy); then clipped to [-clamp, clamp] (token and duration logits)
            when clamp > 0. Zero for an impossible utterance.
    """
    acts = acts.detach().to("cpu", torch.float64)
    B, T, U, VD = acts.shape
    D = len(durations)
    V = VD - D
    costs = torch.zeros(B, dtype=torch.float64)
    grads = torch.zeros(B, T, U, VD, dtype=torch.float64)
    for b in range(B):
        T_b, L_b = int(act_lens[b]), int(label_lens[b])
        y = [int(v) for v in labels[b, :L_b]]
        paths = enumerate_tdt_paths(T_b, y, blank, durations)
        if not paths:
            costs[b] = math.inf
            continue
        x = acts[b].clone().requires_grad_(True)
        tok = torch.log_softmax(x[..., :V], dim=-1) - sigma
        dur = torch.log_softmax(x[..., V:], dim=-1)
        log_p = tdt_path_log_prob(tok, dur, paths)
        if not paths[0]:  # the empty path: P = 1, no gradient
            costs[b] = 0.0
            continue
        d_x, d_tok = torch.autograd.grad(log_p, (x, tok))
        g = -d_x
        if fastemit_lambda > 0:
            p = torch.softmax(acts[b, ..., :V], dim=-1)
            for u in range(L_b):
                onehot = torch.zeros(V, dtype=torch.float64)
                onehot[y[u]] = 1.0
                w = d_tok[:, u, y[u]]  # (T,)
                g[:, u, :V] += fastemit_lambda * w[:, None] * (p[:, u, :] - onehot)
        if clamp > 0:
            g = g.clamp(-clamp, clamp)
        costs[b] = -(1.0 + fastemit_lambda) * float(log_p.detach())
        grads[b] = g
    return costs, grads


def tdt_forward_log_prob(
    acts: torch.Tensor,
    labels: Sequence[int],
    T_b: int,
    L_b: int,
    blank: int,
    durations: Sequence[int],
    sigma: float = 0.0,
) -> float:
    """log P of one utterance by the forward recursion (t outer, u inner), NumPy.

    ``a[t, u]`` sums the partial paths reaching node (t, u) (t < T_b); log P sums the
    blanks that land exactly on T_b from row L_b.

    Args:
        acts: (T, U, V + D) raw logits of one utterance.
    """
    if T_b == 0:
        return 0.0 if L_b == 0 else -math.inf
    D = len(durations)
    x = acts[:T_b, : L_b + 1].to(torch.float64)
    V = x.shape[-1] - D
    tok = (torch.log_softmax(x[..., :V], dim=-1) - sigma).numpy()
    dur = torch.log_softmax(x[..., V:], dim=-1).numpy()
    a = np.full((T_b, L_b + 1), -np.inf)
    a[0, 0] = 0.0
    for t in range(T_b):
        for u in range(L_b + 1):
            acc = a[t, u]
            for j, e in enumerate(durations):
                s = t - e
                if s < 0:
                    continue
                if e >= 1:
                    acc = np.logaddexp(acc, a[s, u] + tok[s, u, blank] + dur[s, u, j])
                if u >= 1:
                    y = labels[u - 1]
                    acc = np.logaddexp(
                        acc, a[s, u - 1] + tok[s, u - 1, y] + dur[s, u - 1, j]
                    )
            a[t, u] = acc
    out = -np.inf
    for j, e in enumerate(durations):
        if e >= 1 and T_b - e >= 0:
            s = T_b - e
            out = np.logaddexp(out, a[s, L_b] + tok[s, L_b, blank] + dur[s, L_b, j])
    return float(out)
