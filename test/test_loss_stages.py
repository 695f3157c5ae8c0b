"""The stage interface of ``espnet_multiblank.loss.stages`` (CPU).

* :func:`run_lattice` gives exactly what the kernels give when called directly
  (pass 1 then pass 2, the arrays compared bit for bit), for both families, with and
  without the gradient, serial and parallel;
* the documented meaning of the rows after the lattice stage: the gradient written
  from them with the module docstring's formula (``r = 1``: the coefficients
  themselves) equals the float64 PyTorch reference's autograd gradient;
* the contract is checked (width, dtype, lengths) instead of read out of bounds.
"""

import numpy as np
import pytest
import torch

from espnet_multiblank.loss import stages
from espnet_multiblank.loss.cpu import driver as cpu_driver
from espnet_multiblank.loss.cpu import kernels, tdt_kernels
from espnet_multiblank.loss.options import make_options, make_tdt_options
from espnet_multiblank.loss.reference import reference_costs, tdt_reference_costs

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
    blanks = {opts.blank} | set(getattr(opts, "big_blank_ids", ()))
    ids = np.array([k for k in range(V) if k not in blanks], np.int64)
    labels = ids[g.integers(0, len(ids), (B, U - 1))]
    return opts, acts, labels


def _direct(name, opts, acts, labels, need_grad, parallel):
    """Pass 1 and pass 2 called directly on the kernels (no driver, no stages)."""
    B, T, U, width = acts.shape
    if name == "tdt":
        K = len(opts.durations) + 4
        fwd, lat = tdt_kernels.tdt_rows_forward, tdt_kernels.tdt_lattice
        symbols = width - len(opts.durations)
        durations = np.asarray(opts.durations, np.int64)
    else:
        K = len(opts.big_blank_durations) + 3
        fwd, lat = kernels.rows_forward, kernels.lattice
        symbols = np.asarray(opts.big_blank_ids, np.int64)
        durations = np.asarray(opts.big_blank_durations, np.int64)
    if not parallel:
        fwd, lat = cpu_driver._serial_twin(fwd), cpu_driver._serial_twin(lat)
    rows = np.zeros((B, T, U, K))
    bad = np.zeros(B, np.uint8)
    args = (ACT_LENS, LABEL_LENS, opts.blank, symbols, opts.sigma, False, acts)
    fwd(acts, labels, *args, rows, bad)
    assert not bad.any()
    extracted = rows.copy()
    log_p = np.empty(B)
    # the TDT lattice also takes the number of groups of utterances, as the driver
    # chooses it
    extra = (_tdt_groups(B, U, parallel),) if name == "tdt" else ()
    lam = opts.fastemit_lambda
    lat(rows, ACT_LENS, LABEL_LENS, durations, lam, need_grad, *extra, log_p)
    return extracted, rows, log_p


def _tdt_groups(B, U, parallel):
    return cpu_driver._tdt_groups(B, U, parallel)


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("need_grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_run_lattice_equals_the_kernels(name, need_grad, parallel, monkeypatch):
    opts, acts, labels = _inputs(name)
    if parallel:
        monkeypatch.setattr(cpu_driver, "PARALLEL_MIN_ELEMENTS", 0)
        prev = torch.get_num_threads()
        torch.set_num_threads(2)
    try:
        extracted, want_rows, want_lp = _direct(
            name, opts, acts, labels, need_grad, parallel
        )
        rows, exps, bad = stages.extract_rows(
            opts, acts, labels, ACT_LENS, LABEL_LENS, store_exps=False
        )
        assert exps is None and not bad.any()
        valid = _valid(rows.shape)
        np.testing.assert_array_equal(rows[valid], extracted[valid])
        log_p = stages.run_lattice(opts, rows, ACT_LENS, LABEL_LENS, need_grad)
    finally:
        if parallel:
            torch.set_num_threads(prev)
    np.testing.assert_array_equal(log_p, want_lp)
    np.testing.assert_array_equal(rows[valid], want_rows[valid])
    assert log_p[2] == 0.0  # T_b = 0 = L_b
    assert np.isfinite(log_p).all()


def _valid(shape):
    B, T, U, _ = shape
    t = np.arange(T)[None, :, None]
    u = np.arange(U)[None, None, :]
    return (t < ACT_LENS[:, None, None]) & (u <= LABEL_LENS[:, None, None])


def _softmax(x):
    return torch.softmax(torch.from_numpy(x), dim=-1).numpy()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_rows_after_the_lattice_give_the_gradient(name):
    """r = 1 in the coefficient slots, run_lattice with the gradient, then the
    module docstring's formula: the gradient of the reference (autograd, float64)."""
    opts, acts, labels = _inputs(name, seed=1)
    rows, _, _ = stages.extract_rows(
        opts, acts, labels, ACT_LENS, LABEL_LENS, store_exps=False
    )
    tdt = name == "tdt"
    D = len(opts.durations) if tdt else 0
    n_coef = 2 if tdt else 1
    rows[..., -n_coef:] = 1.0
    log_p = stages.run_lattice(opts, rows, ACT_LENS, LABEL_LENS, need_grad=True)
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
                if tdt:
                    g[V:] = r[-1] * _softmax(acts[b, t, u, V:]) - r[2 : 2 + D]
                else:
                    for i, k in enumerate(opts.big_blank_ids):
                        g[k] -= r[2 + i]
                grad[b, t, u] = g
    x = torch.from_numpy(acts).requires_grad_(True)
    lab = torch.from_numpy(labels)
    al, ll = torch.from_numpy(ACT_LENS), torch.from_numpy(LABEL_LENS)
    ref = tdt_reference_costs if tdt else reference_costs
    costs = ref(x, lab, al, ll, opts)
    (want,) = torch.autograd.grad(costs.sum(), x)
    np.testing.assert_allclose(-(1 + lam) * log_p, costs.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(grad, want.numpy(), rtol=1e-8, atol=1e-10)


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
