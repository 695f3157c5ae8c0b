"""Brute-force oracle of the lattice stage: log P and the occupancy of every step
straight from rows (the contract of ``espnet_multiblank/loss/rows.py``), by
enumerating the paths of ``oracles.py`` / ``tdt_oracles.py`` (written from
docs/lattice.md). Tiny shapes only. :func:`random_planes` makes test rows."""

import math

import torch
from oracles import enumerate_paths
from tdt_oracles import enumerate_tdt_paths

from espnet_multiblank.loss.families import family_of


def brute_force_planes(case_kind, rows, act_lens, label_lens, labels, durations):
    """(log_p (B,), occupancies (B, T, U, K)) from planes ``rows`` (B, T, U, width)
    float64 by enumeration: the occupancy of a step = sum over the paths taking it of
    P(path) / P. ``case_kind``: "tdt" or "multiblank"; ``durations``: the TDT or
    big-blank durations."""
    B, T, U, width = rows.shape
    tdt_kind = case_kind == "tdt"
    K = width - (2 if tdt_kind else 1)
    log_p = torch.full((B,), -math.inf, dtype=torch.float64)
    occ = torch.zeros((B, T, U, K), dtype=torch.float64)
    BLANK = -1  # a symbol id that is no label: the enumerators take it as the blank
    for b in range(B):
        T_b, L_b = int(act_lens[b]), int(label_lens[b])
        y = [int(v) for v in labels[b, :L_b]]
        if tdt_kind:
            paths = enumerate_tdt_paths(T_b, y, BLANK, durations)
        else:
            paths = enumerate_paths(T_b, y, BLANK, durations)
        scores = []
        slots = []
        for path in paths:
            s, used = 0.0, []
            for step in path:
                t, u, k = step[:3]
                tok = 0 if k == BLANK else 1
                if tdt_kind:
                    used += [(t, u, tok), (t, u, 2 + step[3])]
                    s += float(rows[b, t, u, tok] + rows[b, t, u, 2 + step[3]])
                else:  # big blank i has id BLANK - 1 - i
                    slot = tok if k >= BLANK else 2 + (BLANK - 1 - k)
                    used.append((t, u, slot))
                    s += float(rows[b, t, u, slot])
            scores.append(s)
            slots.append(used)
        if not scores:
            continue
        lp = torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0)
        log_p[b] = lp
        for s, used in zip(scores, slots):
            for t, u, k in used:
                occ[b, t, u, k] += math.exp(s - float(lp))
    return log_p, occ


def random_planes(opts, act_lens, label_lens, T, U, seed):
    """(B, T, U, width) float64 planes: random log-probs (TDT: a random duration
    distribution), -inf label on the last row, random r > 0, NaN in padding."""
    gen = torch.Generator().manual_seed(seed)
    B = len(act_lens)
    layout = family_of(opts).layout(opts)
    width = layout.width
    rows = torch.full((B, T, U, width), math.nan, dtype=torch.float64)
    K = layout.num_steps
    for b, (T_b, L_b) in enumerate(zip(act_lens, label_lens)):
        n = (T_b, L_b + 1)
        vals = -3.0 * torch.rand(*n, width, generator=gen, dtype=torch.float64)
        if layout.num_durations:  # a distribution over the durations
            vals[..., 2:K] = torch.log_softmax(vals[..., 2:K] * 2, dim=-1)
        vals[:, L_b, 1] = -math.inf
        vals[..., K:] = 0.5 + torch.rand(*n, width - K, generator=gen)
        rows[b, :T_b, : L_b + 1] = vals
    return rows
