"""The loss checks of ``helpers/loss_checks.py`` for every lattice (standard,
multi-blank, TDT) on every device: the CPU (PyTorch and Numba backends), the CUDA
kernels in Numba's CUDA simulator (in a subprocess, see ``conftest.py``; Numba
backend) and a real GPU (skipped without one, with the reason).

Oracles: brute-force enumeration of every path on tiny shapes, the float64 PyTorch
backend (itself checked against the brute force) on medium ones,
``torch.autograd.gradcheck``, ESPnet's own CPU ``RNNTLossNumba`` for the standard
loss, closed forms, NeMo's published TDT value, NumPy recursions for long
utterances, invariances.
"""

import devices
import loss_cases as lc
import loss_checks as checks
import pytest
import torch

from espnet_multiblank.loss.cpu.common import FRAME_WIDE_BELOW_V

ALL = ("cpu", "sim", "cuda")
NO_SIM = ("cpu", "cuda")
#: the simulator runs these reductions of the tiny cases (all run on CPU and GPU):
#: no weights, and per-utterance weights with an incoming gradient through backward
SIM_REDUCTIONS = ("none", "mean_label_normalized")

device_backends = pytest.mark.parametrize(
    "device,backend", devices.params(*ALL, backends=lc.BACKENDS)
)
lattices = pytest.mark.parametrize("lattice", lc.LATTICES)
families = pytest.mark.parametrize("family", ["multiblank", "tdt"])


@pytest.fixture
def one_thread():
    """gradcheck makes hundreds of tiny calls: on a loaded 2-core machine each parallel
    launch can cost more than the call, so these run on one thread."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _with_reductions(reductions_of):
    """(device, backend, reduction) parameters, the reductions per device."""
    out = []
    for p in devices.params(*ALL, backends=lc.BACKENDS):
        device, backend = p.values
        for r in reductions_of(device):
            out.append(
                pytest.param(device, backend, r, marks=p.marks, id=f"{p.id}-{r}")
            )
    return out


# ------------------------------------------------------------------------ oracles
def test_multiblank_oracle_self_consistency():
    checks.check_multiblank_oracle()


def test_tdt_oracle_self_consistency():
    checks.check_tdt_oracle()


# -------------------------------------------------------------------- brute force
@pytest.mark.parametrize(
    "device,backend,reduction",
    _with_reductions(lambda d: SIM_REDUCTIONS if d == "sim" else lc.REDUCTIONS),
)
@pytest.mark.parametrize("case", lc.TINY_CASES, ids=lc.ids(lc.TINY_CASES))
def test_brute_force_float64(device, backend, reduction, case):
    checks.check_brute_force(
        devices.torch_device(device), backend, case, reduction, torch.float64
    )


@device_backends
@pytest.mark.parametrize("case", lc.TINY_CASES, ids=lc.ids(lc.TINY_CASES))
def test_brute_force_float32(device, backend, case):
    checks.check_brute_force(
        devices.torch_device(device), backend, case, "none", torch.float32
    )


@device_backends
@lattices
def test_known_values(device, backend, lattice):
    checks.check_known_values(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_no_label_dimension(device, backend, lattice):
    checks.check_no_label_dimension(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_wide_labels(device, backend, lattice):
    checks.check_wide_labels(devices.torch_device(device), backend, lattice)


# ------------------------------------------------------------- medium: vs reference
def _reference_params():
    out = []
    for device in ALL:
        combos = [("numba", torch.float32), ("numba", torch.float64)]
        if device != "sim":
            combos.insert(0, ("torch", torch.float32))
        for backend, dtype in combos:
            name = str(dtype).replace("torch.", "")
            out.append(
                pytest.param(
                    device,
                    backend,
                    dtype,
                    marks=devices.marks(device),
                    id=f"{device}-{backend}-{name}",
                )
            )
    return out


@pytest.mark.parametrize("device,backend,dtype", _reference_params())
@pytest.mark.parametrize("case", lc.MEDIUM_CASES, ids=lc.ids(lc.MEDIUM_CASES))
def test_vs_float64_reference(device, backend, dtype, case):
    checks.check_vs_reference(devices.torch_device(device), backend, case, dtype)


@pytest.mark.parametrize("device", devices.params(*NO_SIM))
@pytest.mark.parametrize("reduction", lc.REDUCTIONS)
@families
def test_vs_float64_reference_reductions(device, family, reduction):
    checks.check_vs_reference(
        devices.torch_device(device),
        "numba",
        lc.ALL_OPTIONS_MEDIUM[family],
        torch.float32,
        reduction,
    )


@pytest.mark.parametrize(
    "device,backend", devices.params(*NO_SIM, backends=lc.BACKENDS)
)
@pytest.mark.parametrize("reduction", ["none", "mean_label_normalized"])
@pytest.mark.parametrize("case", lc.GRADCHECK_CASES, ids=lc.ids(lc.GRADCHECK_CASES))
def test_gradcheck(device, backend, case, reduction, one_thread):
    checks.check_gradcheck(devices.torch_device(device), backend, case, reduction)


@device_backends
@pytest.mark.parametrize("blank", [0, 4])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_vs_espnet_rnnt_loss_numba(device, backend, blank, reduction):
    checks.check_vs_espnet(devices.torch_device(device), backend, blank, reduction)


# ---------------------------------------------------------------- dtypes / layouts
@device_backends
@lattices
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(device, backend, lattice, dtype):
    checks.check_half_precision(devices.torch_device(device), backend, lattice, dtype)


@device_backends
@lattices
def test_index_dtypes(device, backend, lattice):
    checks.check_index_dtypes(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_non_contiguous(device, backend, lattice):
    checks.check_non_contiguous(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_padding_gets_zero_gradient(device, backend, lattice):
    checks.check_padding(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_retain_graph(device, backend, lattice, reduction):
    checks.check_retain_graph(devices.torch_device(device), backend, lattice, reduction)


@device_backends
@lattices
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shift_invariance(device, backend, lattice, dtype):
    checks.check_shift_invariance(devices.torch_device(device), backend, lattice, dtype)


@device_backends
@families
def test_duration_permutation(device, backend, family):
    checks.check_duration_permutation(devices.torch_device(device), backend, family)


@device_backends
@lattices
def test_forward_only(device, backend, lattice):
    checks.check_forward_only(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_loss_dtypes(device, backend, lattice):
    checks.check_loss_dtypes(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_masked_symbol(device, backend, lattice):
    checks.check_masked_symbol(devices.torch_device(device), backend, lattice)


# ----------------------------------------------------------------------- robustness
@device_backends
@lattices
@pytest.mark.parametrize("scale", [1e4, 100.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_logits(device, backend, lattice, dtype, scale):
    checks.check_large_logits(
        devices.torch_device(device), backend, lattice, dtype, scale
    )


@pytest.mark.parametrize(
    "device,backend", devices.params(*NO_SIM, backends=lc.BACKENDS)
)
@lattices
@pytest.mark.parametrize("scale", [1.0, 1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "width", [FRAME_WIDE_BELOW_V - 1, FRAME_WIDE_BELOW_V, FRAME_WIDE_BELOW_V + 61]
)
def test_row_widths_around_the_frame_wide_limit(
    device, backend, lattice, dtype, scale, width
):
    checks.check_row_width(
        devices.torch_device(device), backend, lattice, dtype, width, scale
    )


@pytest.mark.slow
@pytest.mark.parametrize("device", devices.params(*NO_SIM))
@families
def test_long_utterance(device, family):
    checks.check_long_utterance(devices.torch_device(device), family)


@pytest.mark.slow
@pytest.mark.parametrize("device", devices.params(*NO_SIM))
def test_long_utterance_equal_logits(device):
    checks.check_long_equal_logits(devices.torch_device(device))


# ----------------------------------------------------------------------- edge cases
@pytest.mark.parametrize(
    "device,backend,reduction",
    _with_reductions(lambda d: ("none", "sum") if d == "sim" else lc.REDUCTIONS),
)
@lattices
def test_impossible_utterances(device, backend, reduction, lattice):
    checks.check_impossible(devices.torch_device(device), backend, lattice, reduction)


@device_backends
@lattices
def test_no_frames(device, backend, lattice):
    checks.check_no_frames(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_empty_batch(device, backend, lattice):
    checks.check_empty_batch(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_incoming_gradient(device, backend, lattice):
    checks.check_incoming_gradient(devices.torch_device(device), backend, lattice)


@device_backends
@lattices
def test_modules(device, backend, lattice):
    checks.check_modules(devices.torch_device(device), backend, lattice)


@device_backends
def test_tdt_omega_one_is_rnnt(device, backend):
    checks.check_omega_one_is_rnnt(devices.torch_device(device), backend)


@device_backends
def test_tdt_omega_draw(device, backend):
    checks.check_omega_draw(devices.torch_device(device), backend)


@pytest.mark.parametrize("device", devices.params(*ALL))
@lattices
def test_fused_kernel_refuses_double_backward(device, lattice):
    """The kernels give no second derivative: differentiating the gradient again
    must fail instead of silently returning a wrong (zero) second derivative."""
    c = lc.SMALL[lattice]
    acts, labels, act_lens, label_lens = lc.make_inputs(c, devices.torch_device(device))
    acts.requires_grad_(True)
    loss = c.loss_fn(
        acts, labels, act_lens, label_lens, **c.kwargs(reduction="sum", backend="numba")
    )
    # loss ** 2: the incoming gradient (2 * loss) depends on acts, so without the guard
    # the second derivative would silently miss the kernel's own second-order term
    (g,) = torch.autograd.grad(loss**2, acts, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), acts)


# ------------------------------------------------------------------ the CPU kernels
@pytest.mark.parametrize("backend", lc.BACKENDS)
@lattices
def test_threads_unchanged(backend, lattice):
    checks.check_threads_unchanged("cpu", backend, lattice)


@families
def test_concurrent_calls(family):
    checks.check_concurrent_calls_cpu(family)


@families
def test_forked_child(family):
    checks.check_forked_child_cpu(family)


@families
def test_parallel_kernels_match_serial(family, monkeypatch):
    """The parallel (prange) kernels give the serial kernels' result."""
    import espnet_multiblank.loss.cpu.driver as driver

    c = lc.ALL_OPTIONS_MEDIUM[family]
    acts, labels, act_lens, label_lens = lc.make_inputs(c, "cpu")
    kw = dict(reduction="sum", backend="numba")
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = lc.case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
        torch.set_num_threads(2)
        monkeypatch.setattr(driver, "PARALLEL_MIN_ELEMENTS", 0)
        parallel = lc.case_loss_and_grad(c, acts, labels, act_lens, label_lens, **kw)
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(serial[0], parallel[0])
    assert torch.equal(serial[1], parallel[1])


@lattices
def test_auto_selects_numba_kernel_on_cpu(lattice, monkeypatch):
    """backend="auto" on CPU tensors goes through the fused Numba kernel (here behind
    a counting wrapper with the plain contract only), backend="torch" does not."""
    import espnet_multiblank.loss.cpu as cpu

    name = "tdt_compute" if lattice == "tdt" else "compute"
    calls = []
    original = getattr(cpu, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(cpu, name, counting)
    c = lc.SMALL[lattice]
    acts, labels, act_lens, label_lens = lc.make_inputs(c, "cpu")
    kw = dict(reduction="mean")
    lc.case_loss_and_grad(c, acts, labels, act_lens, label_lens, backend="auto", **kw)
    assert len(calls) == 1
    lc.case_loss_and_grad(c, acts, labels, act_lens, label_lens, backend="torch", **kw)
    assert len(calls) == 1
