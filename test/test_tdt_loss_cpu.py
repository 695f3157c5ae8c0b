"""The TDT loss tests of ``tdt_loss_impl.py`` on the CPU, for the PyTorch and the
Numba backends."""

import pytest
import tdt_loss_impl as impl
import torch

from espnet_multiblank import tdt_loss
from espnet_multiblank.loss.cpu.kernels import FRAME_WIDE_BELOW_V

DEVICE = "cpu"
backends = pytest.mark.parametrize("backend", impl.BACKENDS)


@pytest.fixture
def one_thread():
    """gradcheck makes hundreds of tiny calls: one thread avoids parallel launches."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def test_oracle_self_consistency():
    impl.check_oracle_self_consistency()


@backends
@pytest.mark.parametrize("reduction", impl.REDUCTIONS)
@pytest.mark.parametrize("case", impl.TINY_CASES, ids=impl.TINY_IDS)
def test_brute_force_float64(backend, case, reduction):
    impl.check_brute_force(DEVICE, backend, case, reduction, torch.float64)


@backends
@pytest.mark.parametrize("case", impl.TINY_CASES, ids=impl.TINY_IDS)
def test_brute_force_float32(backend, case):
    impl.check_brute_force(DEVICE, backend, case, "none", torch.float32)


@backends
def test_nemo_fixed_case(backend):
    impl.check_nemo_fixed_case(DEVICE, backend)


@pytest.mark.parametrize(
    "backend,dtype",
    [("torch", torch.float32), ("numba", torch.float32), ("numba", torch.float64)],
    ids=["torch-float32", "numba-float32", "numba-float64"],
)
@pytest.mark.parametrize("case", impl.MEDIUM_CASES, ids=impl.MEDIUM_IDS)
def test_vs_float64_reference(backend, dtype, case):
    impl.check_vs_reference(DEVICE, backend, case, dtype)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_vs_float64_reference_reductions(reduction):
    impl.check_vs_reference(
        DEVICE, "numba", impl.MEDIUM_CASES[1], torch.float32, reduction
    )


def test_long_utterance():
    impl.check_long_utterance(DEVICE)


@backends
@pytest.mark.parametrize("reduction", ["none", "mean_volume"])
@pytest.mark.parametrize(
    "case", impl.GRADCHECK_CASES, ids=[c.name for c in impl.GRADCHECK_CASES]
)
def test_gradcheck(backend, case, reduction, one_thread):
    impl.check_gradcheck(DEVICE, backend, case, reduction)


@backends
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_part_shift_invariance(backend, dtype):
    impl.check_part_shift_invariance(DEVICE, backend, dtype)


@backends
def test_duration_permutation(backend):
    impl.check_duration_permutation(DEVICE, backend)


@backends
def test_omega_one_is_rnnt(backend):
    impl.check_omega_one_is_rnnt(DEVICE, backend)


@backends
def test_omega_draw(backend):
    impl.check_omega_draw(DEVICE, backend)


@backends
@pytest.mark.parametrize("reduction", impl.REDUCTIONS)
def test_impossible_utterances(backend, reduction):
    impl.check_impossible(DEVICE, backend, reduction)


@backends
def test_all_T_zero(backend):
    impl.check_all_T_zero(DEVICE, backend)


@backends
def test_empty_batch(backend):
    impl.check_empty_batch(DEVICE, backend)


@backends
def test_masked_token(backend):
    impl.check_masked_token(DEVICE, backend)


@backends
@pytest.mark.parametrize("scale", [1e4, 100.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_logits(backend, dtype, scale):
    impl.check_large_logits(DEVICE, backend, dtype, scale)


@backends
@pytest.mark.parametrize("scale", [1.0, 1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "width", [FRAME_WIDE_BELOW_V - 1, FRAME_WIDE_BELOW_V, FRAME_WIDE_BELOW_V + 61]
)
def test_vocabulary_sizes_around_the_frame_wide_limit(backend, dtype, scale, width):
    impl.check_vocabulary_size(DEVICE, backend, dtype, width, scale)


@backends
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(backend, dtype):
    impl.check_half_precision(DEVICE, backend, dtype)


@backends
def test_index_dtypes(backend):
    impl.check_index_dtypes(DEVICE, backend)


@backends
def test_non_contiguous(backend):
    impl.check_non_contiguous(DEVICE, backend)


@backends
def test_padding_gets_zero_gradient(backend):
    impl.check_padding(DEVICE, backend)


@backends
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_retain_graph(backend, reduction):
    impl.check_retain_graph(DEVICE, backend, reduction)


@backends
def test_forward_only(backend):
    impl.check_forward_only(DEVICE, backend)


@backends
def test_module(backend):
    impl.check_module(DEVICE, backend)


def test_parallel_kernels_match_serial(monkeypatch):
    """The parallel (prange) kernels give the serial kernels' result."""
    import espnet_multiblank.loss.cpu.driver as driver

    c = impl.MEDIUM_CASES[1]
    acts, labels, act_lens, label_lens = impl.make_inputs(c, DEVICE)
    kw = c.kwargs(reduction="sum", backend="numba")
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = impl.loss_and_grad(acts, labels, act_lens, label_lens, **kw)
        torch.set_num_threads(2)
        monkeypatch.setattr(driver, "PARALLEL_MIN_ELEMENTS", 0)
        parallel = impl.loss_and_grad(acts, labels, act_lens, label_lens, **kw)
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(serial[0], parallel[0])
    assert torch.equal(serial[1], parallel[1])


def test_auto_selects_numba_kernel_on_cpu(monkeypatch):
    """backend="auto" on CPU tensors runs the fused TDT kernel."""
    import espnet_multiblank.loss.cpu as cpu

    calls = []
    original = cpu.tdt_compute

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(cpu, "tdt_compute", counting)
    c = impl.SMALL
    acts, labels, act_lens, label_lens = impl.make_inputs(c, DEVICE)
    impl.loss_and_grad(acts, labels, act_lens, label_lens, **c.kwargs(backend="auto"))
    assert len(calls) == 1
    impl.loss_and_grad(acts, labels, act_lens, label_lens, **c.kwargs(backend="torch"))
    assert len(calls) == 1


def test_fused_kernel_refuses_double_backward():
    c = impl.SMALL
    acts, labels, act_lens, label_lens = impl.make_inputs(c, DEVICE)
    acts.requires_grad_(True)
    loss = tdt_loss(
        acts, labels, act_lens, label_lens, **c.kwargs(reduction="sum", backend="numba")
    )
    (g,) = torch.autograd.grad(loss**2, acts, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), acts)


@backends
def test_incoming_gradient(backend):
    impl.check_incoming_gradient(DEVICE, backend)
