"""The fused joint + loss against the dense path, brute force and gradcheck.

Oracles (``helpers/fused_cases.py``): the dense path (materialised float64 logits and
the project's float64 PyTorch loss), path enumeration on tiny cases, and
``torch.autograd.gradcheck`` in float64.

The tests run on the loss tests' devices (``helpers/devices.py``), each path named by
the ``backend`` parameter (``fused_cases.PATHS``): the CPU (``numba``: the Numba tile
kernels and the CPU lattice kernels; ``torch``: torch tile operations and the PyTorch
lattice), the CUDA simulator (``numba``: the CUDA path as "auto" picks it, the Triton
tile kernels in Triton's interpreter and the CUDA lattice kernels simulated, on CPU
tensors: ``conftest.py`` runs them in its subprocess, where CPU tensors get the CUDA
kernels and ``TRITON_INTERPRET=1`` is set) and a real GPU (skipped without one, with
the reason; ``numba``: Triton tiles and the CUDA lattice). ``torch-tiles``, torch
tile operations with the Numba lattice (the CUDA path before the Triton kernels,
still the fallback without Triton), runs in :func:`test_matches_dense_path`. Each
body is written once for every lattice.
"""

import math

import devices
import pytest
import torch
from helpers import fused_cases as fc

from espnet_multiblank import fused_transducer_loss
from espnet_multiblank.fused import FusedTransducerLoss

BACKENDS = ("numba", "torch")
F64 = dict(rtol=1e-9, atol=1e-10)
F32 = dict(rtol=2e-4, atol=2e-5)
F32_ULPS = dict(rtol=1e-5, atol=1e-7)  # float32 sums in another order

#: every device; the simulator runs the Numba backend (its CUDA kernels) only
device_backends = pytest.mark.parametrize(
    "device,backend", devices.params("cpu", "sim", "cuda", backends=BACKENDS)
)
#: the CPU and a GPU (tests of many calls, too slow for the simulator)
no_sim_backends = pytest.mark.parametrize(
    "device,backend", devices.params("cpu", "cuda", backends=BACKENDS)
)
cpu_backends = pytest.mark.parametrize("backend", BACKENDS)
#: every path on every device (the torch tile operations beside the Numba lattice
#: too: on the CPU, in the simulator and on a GPU)
all_paths = pytest.mark.parametrize(
    "device,backend",
    devices.params("cpu", "sim", "cuda", backends=BACKENDS + ("torch-tiles",))
    + [pytest.param("sim", "torch-tiles", marks=devices.marks("sim"), id="sim-tt")],
)


def _inputs(case, dtype, device, **kw):
    return fc.make_inputs(case, dtype, device=devices.torch_device(device), **kw)


LATTICE_CASES = {
    "standard": fc.standard(sigma=0.05),
    "multiblank": fc.multiblank(sigma=0.05, fastemit_lambda=0.1),
    "tdt": fc.tdt(sigma=0.05, fastemit_lambda=0.1),
}


@all_paths
@pytest.mark.parametrize("kind", sorted(LATTICE_CASES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_dense_path(kind, dtype, device, backend):
    """Costs and the gradients of enc, pred, weight and bias equal the dense path's
    (float64 dense; float32 inputs within float32 tolerance)."""
    case = LATTICE_CASES[kind]
    inputs = _inputs(case, dtype, device)
    got = fc.fused_loss(case, inputs, "none", path=backend)
    want = fc.dense_loss(case, inputs, "none")
    fc.assert_same_results(got, want, **(F64 if dtype == torch.float64 else F32))
    for g, x in zip(got[1], inputs):
        assert g.dtype == x.dtype and g.shape == x.shape


TINY = [
    fc.standard("std-tiny", act_lens=(3, 2), label_lens=(2, 1), T=3, U=3, J=4, V=5),
    fc.standard(
        "std-fastemit-clamp",
        act_lens=(4, 3),
        label_lens=(2, 2),
        T=4,
        U=3,
        J=4,
        V=5,
        fastemit_lambda=0.3,
        clamp=0.05,
        sigma=0.1,
    ),
    fc.multiblank(
        "mb-tiny", act_lens=(5, 4), label_lens=(2, 1), T=5, U=3, J=4, V=7, big=(2, 3)
    ),
    fc.multiblank(
        "mb-fastemit",
        act_lens=(6, 3),
        label_lens=(1, 2),
        T=6,
        U=3,
        J=3,
        V=6,
        big=(3, 2),
        fastemit_lambda=0.2,
        sigma=0.05,
    ),
    fc.tdt(
        "tdt-tiny",
        act_lens=(4, 3),
        label_lens=(2, 1),
        T=4,
        U=3,
        J=4,
        V=5,
        tdt=(0, 1, 2),
    ),
    fc.tdt(
        "tdt-clamp-fastemit",
        act_lens=(5, 2),
        label_lens=(1, 1),
        T=5,
        U=2,
        J=3,
        V=4,
        tdt=(2, 0, 1),
        fastemit_lambda=0.4,
        clamp=0.02,
        sigma=0.1,
    ),
]


@device_backends
@pytest.mark.parametrize("case", TINY, ids=lambda c: c.name)
def test_matches_brute_force(case, device, backend):
    """Tiny cases against path enumeration (float64), chained into the inputs."""
    inputs = _inputs(case, torch.float64, device)
    for reduction in ("none", "mean_volume"):
        got = fc.fused_loss(case, inputs, reduction, path=backend)
        want = fc.brute_force_loss(case, inputs, reduction)
        fc.assert_same_results(got, want, rtol=1e-8, atol=1e-10, what=reduction)


@no_sim_backends
@pytest.mark.parametrize("kind", sorted(fc.LATTICES))
def test_gradcheck(kind, device, backend):
    """torch.autograd.gradcheck in float64 (no FastEmit or clamp: those change the
    gradient on purpose)."""
    case = fc.LATTICES[kind](
        act_lens=(3, 2), label_lens=(2, 1), T=3, U=3, J=3, V=6, sigma=0.05
    )
    if kind == "multiblank":
        case = fc.LATTICES[kind](
            act_lens=(4, 2), label_lens=(1, 1), T=4, U=2, J=3, V=5, big=(2,)
        )
    inputs = _inputs(case, torch.float64, device)
    params = fc.leaves(inputs)

    def f(enc, pred, weight, bias):
        return fused_transducer_loss(
            enc,
            pred,
            weight,
            bias,
            *inputs[4:],
            reduction="none",
            **fc.PATHS[backend],
            **case.fused_kwargs(),
        )

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7)


def _tile_bytes(case, rows, dtype=torch.float64):
    """tile_bytes that gives tiles of ``rows`` rows."""
    per_row = (case.Vp + 3 * case.J) * torch.empty((), dtype=dtype).element_size()
    return rows * per_row


@device_backends
@pytest.mark.parametrize("kind", sorted(LATTICE_CASES))
def test_tile_size_invariance(kind, device, backend):
    """1-row tiles, tiles that end inside frames, one tile for everything: the same
    results (float64, to rounding)."""
    case = LATTICE_CASES[kind]
    inputs = _inputs(case, torch.float64, device)
    one = fc.fused_loss(case, inputs, "sum", path=backend, tile_bytes=1 << 30)
    for rows in (1, 3, 7):
        got = fc.fused_loss(
            case, inputs, "sum", path=backend, tile_bytes=_tile_bytes(case, rows)
        )
        fc.assert_same_results(got, one, rtol=1e-12, atol=1e-13, what=f"R={rows}")


@no_sim_backends
@pytest.mark.parametrize("reduction", fc.REDUCTIONS)
@pytest.mark.parametrize("incoming", ["one", "0.7", "negative", "amp"])
def test_reductions_and_incoming_gradients(reduction, incoming, device, backend):
    case = LATTICE_CASES["multiblank"]
    inputs = _inputs(case, torch.float32, device)
    if reduction == "none":
        g = torch.linspace(0.5, 2.0, case.B)
        g = {"one": g, "0.7": 0.7 * g, "negative": -g, "amp": g * 65536.0}[incoming]
    else:
        g = {"one": 1.0, "0.7": 0.7, "negative": -2.5, "amp": 65536.0 / 3}[incoming]
        g = torch.tensor(g)
    g = g.to(devices.torch_device(device))
    got = fc.fused_loss(case, inputs, reduction, g, path=backend)
    want = fc.dense_loss(case, inputs, reduction, g)
    scale = float(g.abs().max())
    fc.assert_same_results(got, want, rtol=2e-4, atol=2e-5 * scale)


@device_backends
@pytest.mark.parametrize("kind", sorted(LATTICE_CASES))
def test_clamp_matches_dense_clamped_gradient(kind, device, backend):
    """An active clamp (most logit gradients clipped) gives the dense path's clamped
    gradient, before the reduction weight and the incoming gradient."""
    case = LATTICE_CASES[kind]
    inputs = _inputs(case, torch.float64, device)
    g_in = torch.tensor(-3.0, device=devices.torch_device(device))
    plain = fc.dense_loss(case, inputs, "mean", g_in)
    want = fc.dense_loss(case, inputs, "mean", g_in, clamp=0.01)
    assert (want[1][2] - plain[1][2]).abs().max() > 1e-3  # the clamp is active
    got = fc.fused_loss(case, inputs, "mean", g_in, path=backend, clamp=0.01)
    fc.assert_same_results(got, want, **F64)


@device_backends
@pytest.mark.parametrize("kind", sorted(LATTICE_CASES))
def test_padding_is_never_read(kind, device, backend):
    """NaN in the padding of enc (t >= T_b) and pred (u > L_b), garbage label ids:
    the results of zero padding, and exactly zero gradient in the padding."""
    case = LATTICE_CASES[kind]
    clean = _inputs(case, torch.float32, device, padding="zero")
    dirty = _inputs(case, torch.float32, device, padding="nan")
    want = fc.fused_loss(case, clean, "mean", path=backend)
    got = fc.fused_loss(case, dirty, "mean", path=backend)
    # bit for bit, except on a GPU: its index_add_ (the gradients' scatter) adds with
    # atomics in no fixed order, so two identical calls can round differently (seen
    # on an H200); a value read from the padding would be NaN, not a rounding
    exact = devices.torch_device(device) != "cuda"
    fc.assert_same_results(got, want, **(dict(rtol=0, atol=0) if exact else F32_ULPS))
    d_enc, d_pred = got[1][:2]
    for b, (T_b, L_b) in enumerate(zip(case.act_lens, case.label_lens)):
        assert torch.count_nonzero(d_enc[b, T_b:]) == 0
        assert torch.count_nonzero(d_pred[b, L_b + 1 :]) == 0
        assert torch.count_nonzero(d_enc[b, :T_b]) > 0


@device_backends
def test_impossible_and_empty_utterances(device, backend):
    """T_b = 0 < L_b and a TDT without a fitting duration cost +inf with zero
    gradient; T_b = 0 = L_b costs 0; the other utterances are unaffected."""
    case = fc.tdt(act_lens=(5, 0, 1, 0, 4), label_lens=(2, 1, 0, 0, 1), tdt=(2, 3))
    inputs = _inputs(case, torch.float64, device)
    got = fc.fused_loss(case, inputs, "none", path=backend)
    assert got[0][1] == math.inf and got[0][2] == math.inf and got[0][3] == 0.0
    want = fc.dense_loss(case, inputs, "none")
    fc.assert_same_results(got, want, **F64)
    keep = torch.tensor([0, 4], device=devices.torch_device(device))
    sub = fc.tdt(act_lens=(5, 4), label_lens=(2, 1), tdt=(2, 3))
    sub_inputs = [x[keep] if x is not None and x.dim() > 0 else x for x in inputs[:2]]
    sub_inputs += list(inputs[2:4]) + [
        inputs[4][keep],
        inputs[5][keep],
        inputs[6][keep],
    ]
    alone = fc.fused_loss(sub, sub_inputs, "none", path=backend)
    assert torch.allclose(alone[0], got[0][keep], rtol=1e-12)
    assert torch.allclose(alone[1][2], got[1][2], rtol=1e-10, atol=1e-12)
    # a reduced loss with an impossible utterance is +inf, its gradient finite
    mean = fc.fused_loss(case, inputs, "mean", path=backend)
    assert mean[0] == math.inf
    assert all(torch.isfinite(g).all() for g in mean[1])


@no_sim_backends
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", sorted(LATTICE_CASES))
def test_half_precision_inputs(kind, dtype, device, backend):
    """Half-precision inputs are computed in float32: the dense float64 path on the
    same (rounded) values, gradients in the input dtype."""
    case = LATTICE_CASES[kind]
    inputs = _inputs(case, dtype, device)
    got = fc.fused_loss(case, inputs, "mean", path=backend)
    want = fc.dense_loss(case, inputs, "mean")
    assert got[0].dtype == torch.float32
    for g, x in zip(got[1], inputs):
        assert g.dtype == dtype
    eps = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    fc.assert_close("loss", got[0], want[0], 1e-5, 1e-5)
    for name, g, w in zip(fc.GRAD_NAMES, got[1], want[1]):
        fc.assert_close(name, g, w, eps, 1e-5)


def test_mixed_dtypes():
    """bfloat16 projections with a float32 output layer (autocast's pattern): float32
    compute, each gradient in its input's dtype."""
    case = LATTICE_CASES["standard"]
    inputs = list(fc.make_inputs(case, torch.float32))
    inputs[0] = inputs[0].to(torch.bfloat16)
    inputs[1] = inputs[1].to(torch.bfloat16)
    got = fc.fused_loss(case, inputs, "mean")
    want = fc.dense_loss(case, inputs, "mean")
    assert [g.dtype for g in got[1]] == [torch.bfloat16] * 2 + [torch.float32] * 2
    fc.assert_close("loss", got[0], want[0], 1e-5, 1e-5)
    for name, g, w in zip(fc.GRAD_NAMES, got[1], want[1]):
        fc.assert_close(name, g, w, 2.0**-8, 2e-5)


def _espnet_activation(name):
    from espnet2.asr_transducer.activation import get_activation

    return get_activation(name)


# the names ESPnet's get_activation knows, and torch's gelu
ESPNET_ACTIVATIONS = [
    "relu",
    "identity",
    "leaky_relu",
    "hardtanh",
    "selu",
    "swish",
    "mish",
]


@cpu_backends
@pytest.mark.parametrize(
    "name", ESPNET_ACTIVATIONS + ["gelu"] + ["espnet:" + n for n in ESPNET_ACTIVATIONS]
)
def test_activations(name, backend):
    """Every accepted activation, by name and as ESPnet's get_activation module,
    gives the dense path's results with the same activation."""
    if name.startswith("espnet:"):
        activation = _espnet_activation(name[7:])
    else:
        activation = name
    case = fc.standard(activation="tanh", wscale=3.0, scale=1.5)
    inputs = fc.make_inputs(case, torch.float64)
    got = fc.fused_loss(case, inputs, "none", path=backend, activation=activation)
    want = fc.dense_loss(case, inputs, "none", activation=activation)
    tanh = fc.dense_loss(case, inputs, "none")
    assert not torch.allclose(want[0], tanh[0])  # the activation matters
    fc.assert_same_results(got, want, **F64)


def test_espnet_only_activations():
    for name in ("ftswish", "smish"):
        case = fc.standard(activation=name)
        inputs = fc.make_inputs(case, torch.float64)
        got = fc.fused_loss(case, inputs, "none")
        want = fc.dense_loss(case, inputs, "none", activation=_espnet_activation(name))
        fc.assert_same_results(got, want, **F64)


def test_inplace_relu_module():
    case = fc.standard()
    inputs = fc.make_inputs(case, torch.float64)
    mod = torch.nn.ReLU(inplace=True)
    got = fc.fused_loss(case, inputs, "none", activation=mod)
    want = fc.dense_loss(case, inputs, "none", activation="relu")
    fc.assert_same_results(got, want, **F64)
    assert mod.inplace  # the caller's module is left as it was


@device_backends
def test_omega(device, backend):
    """omega = 1: the plain RNN-T loss on the token logits (as tdt_loss), zero
    gradient for the duration rows of weight and bias; omega draws one
    torch.rand(()) per call, like tdt_loss."""
    case = fc.tdt(sigma=0.05, fastemit_lambda=0.1)
    inputs = _inputs(case, torch.float64, device)
    got = fc.fused_loss(case, inputs, "mean", path=backend, omega=1.0)
    want = fc.dense_loss(case, inputs, "mean", omega=1.0)
    fc.assert_same_results(got, want, **F64)
    V = case.V
    assert torch.count_nonzero(got[1][2][V:]) == 0
    assert torch.count_nonzero(got[1][3][V:]) == 0
    plain = fc.fused_loss(case, inputs, "mean", path=backend)
    assert not torch.allclose(plain[0], got[0])
    for seed in range(2 if device == "sim" else 4):
        torch.manual_seed(seed)
        a = fc.fused_loss(case, inputs, "mean", path=backend, omega=0.5)[0]
        torch.manual_seed(seed)
        b = fc.dense_loss(case, inputs, "mean", omega=0.5)[0]
        assert torch.allclose(a, b, **F64)


def test_forward_only_module_and_retain_graph():
    """No gradient wanted: the costs; the Module form; a second backward
    (retain_graph) gives the same gradients; no double backward."""
    case = LATTICE_CASES["multiblank"]
    inputs = fc.make_inputs(case, torch.float64)
    want = fc.dense_loss(case, inputs, "mean")
    kw = case.fused_kwargs()
    with torch.no_grad():
        loss = fused_transducer_loss(*inputs, reduction="mean", **kw)
    assert torch.allclose(loss, want[0], **F64)
    crit = FusedTransducerLoss(reduction="mean", **kw)
    assert "tanh" in repr(crit)
    params = fc.leaves(inputs)
    loss = crit(*params, *inputs[4:])
    g1 = torch.autograd.grad(loss, params, retain_graph=True)
    g2 = torch.autograd.grad(loss * 0.7, params, retain_graph=True)
    for a, b, w in zip(g1, g2, want[1]):
        assert torch.allclose(a * 0.7, w, **F64)
        assert torch.allclose(b, w, **F64)
    (g,) = torch.autograd.grad(loss, params[0], create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_only_some_inputs_need_grad():
    case = LATTICE_CASES["tdt"]
    inputs = fc.make_inputs(case, torch.float64)
    want = fc.dense_loss(case, inputs, "sum", torch.tensor(1.0))
    w = inputs[2].clone().requires_grad_(True)
    loss = fused_transducer_loss(
        inputs[0],
        inputs[1],
        w,
        inputs[3],
        *inputs[4:],
        reduction="sum",
        **case.fused_kwargs(),
    )
    (g,) = torch.autograd.grad(loss, w)
    assert torch.allclose(g, want[1][2], **F64)


def test_no_bias_and_non_contiguous_inputs():
    case = fc.multiblank(bias=False)
    inputs = list(fc.make_inputs(case, torch.float32))
    want = fc.dense_loss(case, inputs, "mean")
    # the same values through strided views
    inputs[0] = inputs[0].transpose(1, 2).contiguous().transpose(1, 2)
    inputs[2] = inputs[2].t().contiguous().t()
    inputs[4] = inputs[4].to(torch.int32)
    inputs[5] = inputs[5].to(torch.int32)
    assert not inputs[0].is_contiguous()
    got = fc.fused_loss(case, inputs, "mean")
    assert got[1][3] is None
    fc.assert_same_results(got, want, **F32)


def test_empty_batch_and_all_empty_utterances():
    case = fc.standard(act_lens=(0, 0), label_lens=(0, 1), T=3, U=2)
    inputs = fc.make_inputs(case, torch.float32)
    got = fc.fused_loss(case, inputs, "none")
    assert got[0].tolist() == [0.0, math.inf]
    assert all(torch.count_nonzero(g) == 0 for g in got[1])
    empty = fc.standard(act_lens=(), label_lens=(), T=3, U=2)
    inputs = fc.make_inputs(empty, torch.float32)
    for reduction in fc.REDUCTIONS:
        loss, grads = fc.fused_loss(empty, inputs, reduction)
        assert loss.numel() == 0 if reduction == "none" else float(loss) == 0.0


def test_numba_threads_unchanged():
    import numba

    before = numba.get_num_threads()
    case = fc.standard(act_lens=(40, 30), label_lens=(9, 5), T=40, U=10, J=16, V=40)
    inputs = fc.make_inputs(case, torch.float32)
    with_threads = torch.get_num_threads()
    fc.fused_loss(case, inputs, "mean")
    assert numba.get_num_threads() == before
    assert torch.get_num_threads() == with_threads


def test_larger_ragged_batch_float32():
    """A batch of medium utterances (many tiles, frames split between tiles) in
    float32, against the float64 dense path."""
    case = fc.multiblank(
        act_lens=(60, 41, 7, 33),
        label_lens=(11, 0, 6, 9),
        T=60,
        U=12,
        J=32,
        V=50,
        sigma=0.05,
        fastemit_lambda=0.05,
    )
    inputs = fc.make_inputs(case, torch.float32)
    want = fc.dense_loss(case, inputs, "mean_volume")
    for backend in BACKENDS:
        got = fc.fused_loss(
            case,
            inputs,
            "mean_volume",
            path=backend,
            tile_bytes=_tile_bytes(case, 37, torch.float32),
        )
        fc.assert_same_results(got, want, **F32, what=backend)


@cpu_backends
@pytest.mark.parametrize("kind", sorted(LATTICE_CASES))
def test_large_logits_softmax_consistency(kind, backend):
    """Logits near 1000 in float32 (lse's float32 rounding is 6e-5 there): the
    recomputed softmax still sums to 1, so each node's logit gradient sums to 0 over
    the token logits (and over the duration logits), seen in d_bias; the results
    stay those of the dense path within the inputs' float32 rounding."""
    case = LATTICE_CASES[kind]
    inputs = list(fc.make_inputs(case, torch.float32))
    inputs[3] = inputs[3] + 1000.0
    got = fc.fused_loss(case, inputs, "sum", path=backend)
    db = got[1][3].double()
    parts = [db[: case.V], db[case.V :]] if case.tdt else [db]
    for part in parts:
        assert abs(float(part.sum())) <= 2e-6 * float(part.abs().sum()), part.sum()
    want = fc.dense_loss(case, inputs, "sum")
    fc.assert_same_results(got, want, rtol=1e-3, atol=1e-3)


@cpu_backends
@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_gradient_tiles_hold_no_subnormal_numbers(kind, backend, monkeypatch):
    """Nodes that paths almost never visit have occupancies far below float32's
    smallest normal number; the apply stage flushes the gradient there to 0
    (subnormal operands slow CPU matmuls down), and the results stay the
    dense path's."""
    from espnet_multiblank.fused.cpu_tile_ops import CpuTileOps
    from espnet_multiblank.fused.torch_tile_ops import TorchTileOps

    seen = {"tiny_occupancy": False, "subnormal": 0, "tiles": 0}
    for cls in (CpuTileOps, TorchTileOps):
        original = cls.apply

        def apply(self, z, index, planes, factors, _original=original):
            _original(self, z, index, planes, factors)
            occ = planes.rows[..., :2].abs()
            seen["tiny_occupancy"] |= bool(((occ > 0) & (occ < 1e-38)).any())
            tiny = torch.finfo(z.dtype).tiny
            seen["subnormal"] += int(((z != 0) & (z.abs() < tiny)).sum())
            seen["tiles"] += 1

        monkeypatch.setattr(cls, "apply", apply)
    case = fc.LATTICES[kind](
        act_lens=(60, 50), label_lens=(11, 9), T=60, U=12, wscale=16.0
    )
    inputs = fc.make_inputs(case, torch.float32)
    got = fc.fused_loss(case, inputs, "mean", path=backend)
    assert seen["tiles"] > 0 and seen["tiny_occupancy"], seen
    assert seen["subnormal"] == 0, seen
    want = fc.dense_loss(case, inputs, "mean")
    fc.assert_same_results(got, want, **F32)


def test_parallel_tile_kernels_match_serial(monkeypatch):
    """The CPU tile kernels' parallel chunks (forced here at a small shape: two
    torch threads, the thread rule told the work is large) give exactly the serial
    results: rows split by chunk, columns for the scatter."""
    import numba

    from espnet_multiblank.fused import cpu_tile_ops

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba is limited to one thread (NUMBA_NUM_THREADS)")
    case = LATTICE_CASES["multiblank"]
    tdt_case = LATTICE_CASES["tdt"]
    serial = [fc.fused_loss(c, fc.make_inputs(c), "mean") for c in (case, tdt_case)]
    threads = torch.get_num_threads()
    real = cpu_tile_ops.cpu_threads
    calls = []

    def forced(work):
        result = real(1 << 40)
        calls.append(result[0])
        return result

    monkeypatch.setattr(cpu_tile_ops, "cpu_threads", forced)
    torch.set_num_threads(2)
    try:
        parallel = [
            fc.fused_loss(c, fc.make_inputs(c), "mean") for c in (case, tdt_case)
        ]
    finally:
        torch.set_num_threads(threads)
    assert calls and all(calls)
    for got, want in zip(parallel, serial):
        fc.assert_same_results(got, want, rtol=0, atol=0)


@cpu_backends
def test_autocast_does_not_change_the_result(backend):
    """Under CPU autocast (bfloat16) the tile matmuls still run in the compute dtype
    (forward and the backward recompute alike): the float32 results."""
    case = LATTICE_CASES["standard"]
    inputs = fc.make_inputs(case, torch.float32)
    want = fc.fused_loss(case, inputs, "mean", path=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fc.fused_loss(case, inputs, "mean", path=backend)
    fc.assert_same_results(got, want, rtol=0, atol=0)


# ------------------------------------------------------------------------ real GPU
@devices.gpu
@pytest.mark.parametrize("kind", sorted(fc.LATTICES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_medium_batch(kind, dtype):
    """A medium ragged batch on the GPU (several default tiles' worth of nodes)
    against the float64 dense path on the GPU and the CPU fused path; gradients in
    the input dtype."""
    case = fc.LATTICES[kind](
        act_lens=(80, 61, 17, 40),
        label_lens=(20, 9, 0, 14),
        T=80,
        U=21,
        J=64,
        V=300,
        sigma=0.05,
        fastemit_lambda=0.05,
    )
    cpu_inputs = fc.make_inputs(case, dtype)
    inputs = [None if x is None else x.cuda() for x in cpu_inputs]
    got = fc.fused_loss(case, inputs, "mean_volume")
    want = fc.dense_loss(case, inputs, "mean_volume")
    tol = 2e-4 if dtype == torch.float32 else 2.0**-8
    fc.assert_close("loss", got[0], want[0], 1e-5, 1e-5)
    for name, g, w in zip(fc.GRAD_NAMES, got[1], want[1]):
        assert g.dtype == dtype and g.is_cuda
        fc.assert_close(name, g, w, tol, 2e-5)
    cpu = fc.fused_loss(case, cpu_inputs, "mean_volume")
    for name, g, w in zip(fc.GRAD_NAMES, got[1], cpu[1]):
        fc.assert_close(name + " vs CPU", g, w, tol, 2e-5)


@pytest.mark.parametrize("device", devices.params("cpu", "sim", "cuda"))
def test_auto_picks_the_tile_stages(device, monkeypatch):
    """tile_backend "auto": the Numba tile kernels beside the CPU lattice, the
    Triton kernels beside the CUDA lattice (in the simulator: in Triton's
    interpreter; on a GPU of compute capability >= 8.0), torch operations beside
    the PyTorch lattice."""
    from espnet_multiblank.fused import api

    picked = []
    real = api.tile_ops_for

    def spy(*args):
        picked.append(real(*args).__name__)
        return real(*args)

    monkeypatch.setattr(api, "tile_ops_for", spy)
    case = LATTICE_CASES["standard"]
    inputs = _inputs(case, torch.float32, device)
    fc.fused_loss(case, inputs, "mean")
    fc.fused_loss(case, inputs, "mean", backend="torch")
    want = "CpuTileOps" if device == "cpu" else "TritonTileOps"
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        want = "TorchTileOps"
    assert picked == [want, "TorchTileOps"]
