"""The stage interface of ``espnet_multiblank.loss.stages`` and the rows of
``espnet_multiblank.loss.rows``.

* the lattice stage (:func:`stages.run_lattice`) of every runner (the CPU Numba
  kernels, serial and parallel; the CUDA kernels in the simulator and on a GPU; the
  PyTorch recursion) against path enumeration on random rows: log P, every
  occupancy, the coefficient slots; the runners against each other on shapes too
  large to enumerate. Padding rows hold NaN: the contract says they are never read;
* the documented meaning of the rows after the lattice stage: the gradient written
  from them with the contract's formula (``r = 1``: the coefficients themselves)
  equals the float64 PyTorch reference's autograd gradient, serial and parallel;
* the contract is checked (width, dtype, lengths) instead of read out of bounds.
"""

import math

import devices
import numpy as np
import pytest
import torch
from helpers.planes_oracle import brute_force_planes, random_planes

from espnet_multiblank.loss import stages
from espnet_multiblank.loss.cpu import driver as cpu_driver
from espnet_multiblank.loss.families import family_of
from espnet_multiblank.loss.options import make_options, make_tdt_options
from espnet_multiblank.loss.reference import reference_costs, tdt_reference_costs

RUNNERS = devices.params("cpu", "sim", "cuda", backends=("numba", "torch"))

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


@pytest.fixture
def parallel_kernels(monkeypatch):
    """The CPU kernels' parallel versions on small problems (two torch threads)."""
    monkeypatch.setattr(cpu_driver, "PARALLEL_MIN_ELEMENTS", 0)
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(prev)


def _opts(kind, durations, lam):
    if kind == "tdt":
        return make_tdt_options(0, durations, fastemit_lambda=lam)
    return make_options(len(durations), durations, fastemit_lambda=lam)


def _lens(act_lens, label_lens, device="cpu"):
    return (
        torch.tensor(act_lens, device=device),
        torch.tensor(label_lens, device=device),
    )


def run(device, backend, opts, rows, al, ll, need_grad):
    """(log_p, rows after the stage) of ``run_lattice`` on a copy of ``rows`` on the
    test device (numpy rows for the CPU Numba kernels)."""
    if device == "cpu" and backend == "numba":
        r = rows.numpy().copy()
        log_p = stages.run_lattice(opts, r, al.numpy(), ll.numpy(), need_grad)
        return torch.from_numpy(log_p), torch.from_numpy(r)
    dev = devices.torch_device(device)
    r = rows.to(dev, copy=True)
    al, ll = al.to(dev), ll.to(dev)
    log_p = stages.run_lattice(opts, r, al, ll, need_grad, backend=backend)
    assert log_p.device == r.device and log_p.dtype == torch.float64
    return log_p.cpu(), r.cpu()


def expected_rows(opts, rows, occ, log_p, al, ll):
    """The contract's rows after the lattice: occupancies, then the coefficients."""
    layout = family_of(opts).layout(opts)
    out = rows.clone()
    K, S = layout.num_steps, layout.num_token_steps
    lam = opts.fastemit_lambda
    for b in range(rows.shape[0]):
        if not math.isfinite(float(log_p[b])):
            continue
        T_b, U_b = int(al[b]), int(ll[b]) + 1
        o = occ[b, :T_b, :U_b]
        out[b, :T_b, :U_b, :K] = o
        gamma = o[..., :S].sum(-1)  # a TDT's duration slots split the same paths
        r = rows[b, :T_b, :U_b]
        out[b, :T_b, :U_b, K] = (gamma + lam * o[..., 1]) * r[..., K]
        if layout.num_durations:
            out[b, :T_b, :U_b, K + 1] = gamma * r[..., K + 1]
    return out


def _valid(rows, al, ll):
    B, T, U = rows.shape[:3]
    t = torch.arange(T).view(1, T, 1)
    u = torch.arange(U).view(1, 1, U)
    return (t < al.view(B, 1, 1)) & (u <= ll.view(B, 1, 1))


def _check_against_enumeration(device, backend, case):
    kind, durations, act_lens, label_lens, lam = case
    opts = _opts(kind, durations, lam)
    T, U = max(act_lens), max(label_lens) + 1
    rows = random_planes(opts, act_lens, label_lens, T, U, seed=len(act_lens))
    al, ll = _lens(act_lens, label_lens)
    labels = torch.arange(1, U).repeat(len(act_lens), 1)  # any ids: rows only
    want_lp, occ = brute_force_planes(kind, rows, al, ll, labels, durations)
    if durations == (2, 3):  # the case has an impossible utterance
        assert not torch.isfinite(want_lp[1])
    log_p, got = run(device, backend, opts, rows, al, ll, True)
    finite = torch.isfinite(want_lp)
    assert torch.equal(torch.isfinite(log_p), finite), (log_p, want_lp)
    assert torch.allclose(log_p[finite], want_lp[finite], rtol=1e-12, atol=1e-12)
    assert (log_p[~finite] == -math.inf).all()
    want = expected_rows(opts, rows, occ, want_lp, al, ll)
    keep = _valid(rows, al, ll) & finite.view(-1, 1, 1)
    assert torch.allclose(got[keep], want[keep], rtol=1e-10, atol=1e-12)
    # costs only: the same log P, the rows untouched
    log_p2, untouched = run(device, backend, opts, rows, al, ll, False)
    assert torch.equal(log_p2[finite], log_p[finite])
    valid = _valid(rows, al, ll)
    assert torch.equal(untouched[valid], rows[valid])


@pytest.mark.parametrize("device,backend", RUNNERS)
@pytest.mark.parametrize("case", TINY, ids=lambda c: f"{c[0]}{list(c[1])}")
def test_lattice_matches_enumeration(device, backend, case):
    _check_against_enumeration(device, backend, case)


@pytest.mark.parametrize("case", TINY, ids=lambda c: f"{c[0]}{list(c[1])}")
def test_parallel_lattice_matches_enumeration(case, parallel_kernels):
    _check_against_enumeration("cpu", "numba", case)


@pytest.mark.parametrize(
    "device,backend", devices.params("cpu", "cuda", backends=("numba",))
)
@pytest.mark.parametrize(
    "kind,durations",
    [("multiblank", ()), ("multiblank", (2, 4, 8)), ("tdt", (0, 1, 2, 3, 4))],
)
def test_numba_and_torch_lattices_agree(device, backend, kind, durations):
    """Shapes beyond enumeration (ragged, T up to 40, U up to 9): the Numba runner
    of the device and the PyTorch recursion give the same log P and rows."""
    opts = _opts(kind, durations, 0.1)
    act_lens, label_lens = (40, 33, 17, 1), (8, 5, 0, 1)
    rows = random_planes(opts, act_lens, label_lens, 40, 9, seed=3)
    al, ll = _lens(act_lens, label_lens)
    lp_n, rows_n = run(device, backend, opts, rows, al, ll, True)
    lp_t, rows_t = run(device, "torch", opts, rows, al, ll, True)
    assert torch.allclose(lp_n, lp_t, rtol=1e-12, atol=1e-10)
    keep = _valid(rows, al, ll) & torch.isfinite(lp_n).view(-1, 1, 1)
    assert torch.allclose(rows_n[keep], rows_t[keep], rtol=1e-9, atol=1e-12)
    # the occupancies of the steps leaving the start node sum to 1
    S = family_of(opts).layout(opts).num_token_steps
    assert np.allclose(rows_n[:, 0, 0, :S].sum(-1).numpy(), 1.0, atol=1e-12)


@pytest.mark.parametrize("device,backend", RUNNERS)
def test_empty_batch_and_no_frames(device, backend):
    opts = _opts("multiblank", (), 0.0)
    width = family_of(opts).layout(opts).width
    rows = torch.empty((2, 0, 2, width), dtype=torch.float64)
    al, ll = _lens((0, 0), (0, 1))
    log_p, _ = run(device, backend, opts, rows, al, ll, True)
    assert log_p.tolist() == [0.0, -math.inf]
    empty = torch.empty((0, 3, 2, width), dtype=torch.float64)
    none = torch.empty((0,), dtype=torch.int64)
    log_p, _ = run(device, backend, opts, empty, none, none, True)
    assert log_p.shape == (0,)


# ------------------------------------------------------------- the dense stages
# (name, opts, V' = logits per row, token logits V)
FAMILIES = {
    "standard": (make_options(0, (), "none", 0.3, 0.0, 0.05), 7, 7),
    "multiblank": (make_options(3, (2, 4, 8), "none", 0.2, 0.0, 0.05), 9, 9),
    "tdt": (make_tdt_options(1, (0, 2, 1, 3), "none", 0.05, 0.0, 0.3, 0.0), 10, 6),
}
ACT_LENS = np.array([9, 6, 0, 1, 7], np.int64)
LABEL_LENS = np.array([4, 2, 0, 0, 4], np.int64)


def _inputs(name, seed=0):
    opts, width, V = FAMILIES[name]
    B, T, U = len(ACT_LENS), 9, 5
    g = np.random.default_rng(seed)
    acts = g.standard_normal((B, T, U, width)).astype(np.float64)
    blanks = set(opts.lattice.blank_ids)
    ids = np.array([k for k in range(V) if k not in blanks], np.int64)
    labels = ids[g.integers(0, len(ids), (B, U - 1))]
    return opts, acts, labels


def _softmax(x):
    return torch.softmax(torch.from_numpy(x), dim=-1).numpy()


def _check_rows_give_the_gradient(name):
    opts, acts, labels = _inputs(name, seed=1)
    rows, exps, bad = stages.extract_rows(
        opts, acts, labels, ACT_LENS, LABEL_LENS, store_exps=False
    )
    assert exps is None and not bad.any()
    layout = family_of(opts).layout(opts)
    D = layout.num_durations
    n_coef = layout.num_parts
    rows[..., -n_coef:] = 1.0
    log_p = stages.run_lattice(opts, rows, ACT_LENS, LABEL_LENS, need_grad=True)
    assert log_p[2] == 0.0  # T_b = 0 = L_b
    B, T, U, width = acts.shape
    V = width - D
    grad = np.zeros_like(acts)
    lam = opts.fastemit_lambda
    for b in range(B):
        for t in range(ACT_LENS[b]):
            for u in range(LABEL_LENS[b] + 1):
                r = rows[b, t, u]
                g = np.zeros(width)
                g[:V] = r[-n_coef] * _softmax(acts[b, t, u, :V])
                g[opts.blank] -= r[0]
                if u < LABEL_LENS[b]:
                    g[labels[b, u]] -= (1 + lam) * r[1]
                if D:
                    g[V:] = r[-1] * _softmax(acts[b, t, u, V:]) - r[2 : 2 + D]
                else:
                    for i, k in enumerate(opts.big_blank_ids):
                        g[k] -= r[2 + i]
                grad[b, t, u] = g
    x = torch.from_numpy(acts).requires_grad_(True)
    lab = torch.from_numpy(labels)
    al, ll = torch.from_numpy(ACT_LENS), torch.from_numpy(LABEL_LENS)
    ref = tdt_reference_costs if D else reference_costs
    costs = ref(x, lab, al, ll, opts)
    (want,) = torch.autograd.grad(costs.sum(), x)
    np.testing.assert_allclose(-(1 + lam) * log_p, costs.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(grad, want.numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_rows_after_the_lattice_give_the_gradient(name):
    """r = 1 in the coefficient slots, run_lattice with the gradient, then the
    contract's formula: the gradient of the reference (autograd, float64)."""
    _check_rows_give_the_gradient(name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_rows_after_the_lattice_give_the_gradient_parallel(name, parallel_kernels):
    """The same with the parallel kernels of the extract and lattice stages."""
    _check_rows_give_the_gradient(name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_contract_is_checked(name):
    opts, acts, labels = _inputs(name)
    rows, _, _ = stages.extract_rows(
        opts, acts, labels, ACT_LENS, LABEL_LENS, store_exps=False
    )
    with pytest.raises(ValueError, match=r"rows\.shape\[3\]"):
        stages.run_lattice(opts, rows[..., :-1].copy(), ACT_LENS, LABEL_LENS, False)
    with pytest.raises(TypeError, match="rows"):
        stages.run_lattice(
            opts, np.zeros(rows.shape, np.float32), ACT_LENS, LABEL_LENS, False
        )
    with pytest.raises(ValueError, match="contiguous"):
        stages.run_lattice(opts, np.asfortranarray(rows), ACT_LENS, LABEL_LENS, False)
    with pytest.raises(ValueError, match="act_lens"):
        stages.run_lattice(opts, rows, ACT_LENS + 1, LABEL_LENS, False)
    with pytest.raises(ValueError, match="label_lens"):
        stages.run_lattice(opts, rows, ACT_LENS, LABEL_LENS + 1, False)
    with pytest.raises(TypeError, match="label_lens"):
        stages.run_lattice(opts, rows, ACT_LENS, LABEL_LENS.astype(np.int32), False)
    with pytest.raises(TypeError, match="opts"):
        stages.run_lattice(object(), rows, ACT_LENS, LABEL_LENS, False)
    with pytest.raises(ValueError, match="backend"):
        stages.run_lattice(opts, torch.from_numpy(rows), None, None, False, backend="x")
