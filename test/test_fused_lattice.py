"""The lattice stage of the fused loss on planes (``fused/loss_package.py``):

the CPU Numba lattice (the dense loss's kernels) and the pure-PyTorch planes lattice
(the oracle of the fused tests and the fallback on other devices) against path
enumeration on random planes (log P, every occupancy, the coefficient slots), and
against each other on shapes too large to enumerate. Padding rows hold NaN: the
contract says they are never read.
"""

import math

import numpy as np
import pytest
import torch
from helpers.planes_oracle import brute_force_planes, random_planes

from espnet_multiblank.fused import loss_package as lp

# (kind, durations, act_lens, label_lens, fastemit_lambda)
TINY = [
    ("multiblank", (), (5, 3, 0, 0), (2, 1, 0, 2), 0.0),
    ("multiblank", (), (5, 4), (3, 0), 0.4),
    ("multiblank", (2, 4), (6, 5, 1), (2, 1, 1), 0.3),
    ("multiblank", (3, 2), (7, 2), (1, 2), 0.0),
    ("tdt", (0, 1, 2, 3, 4), (5, 4, 0), (2, 3, 0), 0.25),
    ("tdt", (2, 3), (5, 1, 4), (1, 0, 2), 0.0),  # T_b = 1 is impossible
    ("tdt", (1, 0), (3, 4), (2, 1), 0.5),
]


def _opts(kind, durations, lam):
    if kind == "tdt":
        return lp.make_tdt_options(0, durations, fastemit_lambda=lam)
    return lp.make_options(len(durations), durations, fastemit_lambda=lam)


def _lens(act_lens, label_lens):
    return torch.tensor(act_lens), torch.tensor(label_lens)


def run_cpu(opts, rows, al, ll, need_grad):
    r = rows.numpy().copy()
    log_p = lp.run_lattice_cpu(opts, r, al.numpy(), ll.numpy(), need_grad)
    return torch.from_numpy(log_p), torch.from_numpy(r)


def run_torch(opts, rows, al, ll, need_grad):
    r = rows.clone()
    return lp.run_lattice_torch(opts, r, al, ll, need_grad), r


RUNNERS = {"cpu": run_cpu, "torch": run_torch}


def expected_rows(opts, rows, occ, log_p, al, ll):
    """The contract's rows after the lattice: occupancies, then the coefficients."""
    out = rows.clone()
    K = lp.num_steps(opts)
    lam = opts.fastemit_lambda
    for b in range(rows.shape[0]):
        if not math.isfinite(float(log_p[b])):
            continue
        T_b, U_b = int(al[b]), int(ll[b]) + 1
        o = occ[b, :T_b, :U_b]
        out[b, :T_b, :U_b, :K] = o
        gamma = o[..., :2].sum(-1) if lp.is_tdt(opts) else o.sum(-1)
        r = rows[b, :T_b, :U_b]
        out[b, :T_b, :U_b, K] = (gamma + lam * o[..., 1]) * r[..., K]
        if lp.is_tdt(opts):
            out[b, :T_b, :U_b, K + 1] = gamma * r[..., K + 1]
    return out


def _valid(rows, al, ll):
    B, T, U = rows.shape[:3]
    t = torch.arange(T).view(1, T, 1)
    u = torch.arange(U).view(1, 1, U)
    return (t < al.view(B, 1, 1)) & (u <= ll.view(B, 1, 1))


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("case", TINY, ids=lambda c: f"{c[0]}{list(c[1])}")
def test_lattice_matches_enumeration(runner, case):
    kind, durations, act_lens, label_lens, lam = case
    opts = _opts(kind, durations, lam)
    T, U = max(act_lens), max(label_lens) + 1
    rows = random_planes(opts, act_lens, label_lens, T, U, seed=len(act_lens))
    al, ll = _lens(act_lens, label_lens)
    labels = torch.arange(1, U).repeat(len(act_lens), 1)  # any ids: planes only
    want_lp, occ = brute_force_planes(kind, rows, al, ll, labels, durations)
    if durations == (2, 3):  # the case has an impossible utterance
        assert not torch.isfinite(want_lp[1])
    log_p, got = RUNNERS[runner](opts, rows, al, ll, True)
    finite = torch.isfinite(want_lp)
    assert torch.equal(torch.isfinite(log_p), finite), (log_p, want_lp)
    assert torch.allclose(log_p[finite], want_lp[finite], rtol=1e-12, atol=1e-12)
    assert (log_p[~finite] == -math.inf).all()
    want = expected_rows(opts, rows, occ, want_lp, al, ll)
    keep = _valid(rows, al, ll) & finite.view(-1, 1, 1)
    assert torch.allclose(got[keep], want[keep], rtol=1e-10, atol=1e-12)
    # costs only: the same log P, the rows untouched
    log_p2, untouched = RUNNERS[runner](opts, rows, al, ll, False)
    assert torch.equal(log_p2[finite], log_p[finite])
    valid = _valid(rows, al, ll)
    assert torch.equal(untouched[valid], rows[valid])


@pytest.mark.parametrize(
    "kind,durations",
    [("multiblank", ()), ("multiblank", (2, 4, 8)), ("tdt", (0, 1, 2, 3, 4))],
)
def test_numba_and_torch_lattices_agree(kind, durations):
    """Shapes beyond enumeration (ragged, T up to 40, U up to 9): the two runners
    give the same log P and rows."""
    opts = _opts(kind, durations, 0.1)
    act_lens, label_lens = (40, 33, 17, 1), (8, 5, 0, 1)
    rows = random_planes(opts, act_lens, label_lens, 40, 9, seed=3)
    al, ll = _lens(act_lens, label_lens)
    lp_c, rows_c = run_cpu(opts, rows, al, ll, True)
    lp_t, rows_t = run_torch(opts, rows, al, ll, True)
    assert torch.allclose(lp_c, lp_t, rtol=1e-12, atol=1e-10)
    keep = _valid(rows, al, ll) & torch.isfinite(lp_c).view(-1, 1, 1)
    assert torch.allclose(rows_c[keep], rows_t[keep], rtol=1e-9, atol=1e-12)
    # the occupancies of the steps leaving the start node sum to 1
    K = lp.num_steps(opts)
    first = rows_c[:, 0, 0, :2] if lp.is_tdt(opts) else rows_c[:, 0, 0, :K]
    assert np.allclose(first.sum(-1).numpy(), 1.0, atol=1e-12)


def test_empty_batch_and_no_frames():
    opts = _opts("multiblank", (), 0.0)
    rows = torch.empty((2, 0, 2, lp.planes_width(opts)), dtype=torch.float64)
    al, ll = _lens((0, 0), (0, 1))
    for runner in RUNNERS.values():
        log_p, _ = runner(opts, rows, al, ll, True)
        assert log_p.tolist() == [0.0, -math.inf]
