"""The loss tests of ``loss_impl.py`` on the CPU,
for the PyTorch and the Numba backends.

The "numba" cases need ``espnet_multiblank.loss.cpu`` (the fused CPU kernel); until it
exists they error with ModuleNotFoundError.
"""

import loss_impl as impl
import pytest
import torch

from espnet_multiblank import multiblank_rnnt_loss
from espnet_multiblank.loss.cpu.kernels import FRAME_WIDE_BELOW_V

DEVICE = "cpu"
backends = pytest.mark.parametrize("backend", impl.BACKENDS)


@pytest.fixture
def one_thread():
    """gradcheck makes hundreds of tiny calls: on a loaded 2-core machine each parallel
    launch can cost ~20 ms, so these run on one thread."""
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
def test_no_label_dimension(backend):
    impl.check_no_label_dimension(DEVICE, backend)


@backends
def test_wide_labels(backend):
    impl.check_wide_labels(DEVICE, backend)


def test_concurrent_calls():
    impl.check_concurrent_calls_cpu()


def test_forked_child():
    impl.check_forked_child_cpu()


@backends
def test_equal_logits(backend):
    impl.check_equal_logits(DEVICE, backend)


@pytest.mark.parametrize(
    "backend,dtype",
    [("torch", torch.float32), ("numba", torch.float32), ("numba", torch.float64)],
    ids=["torch-float32", "numba-float32", "numba-float64"],
)
@pytest.mark.parametrize("case", impl.MEDIUM_CASES, ids=impl.MEDIUM_IDS)
def test_vs_float64_reference(backend, dtype, case):
    impl.check_vs_reference(DEVICE, backend, case, dtype)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_vs_float64_reference_reductions(reduction):
    impl.check_vs_reference(
        DEVICE, "numba", impl.MEDIUM_CASES[1], torch.float32, reduction
    )


@backends
@pytest.mark.parametrize("reduction", ["none", "mean_volume"])
@pytest.mark.parametrize(
    "case", impl.GRADCHECK_CASES, ids=[c.name for c in impl.GRADCHECK_CASES]
)
def test_gradcheck(backend, case, reduction, one_thread):
    impl.check_gradcheck(DEVICE, backend, case, reduction)


@backends
@pytest.mark.parametrize("blank", [0, 4])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_vs_espnet_rnnt_loss_numba(backend, blank, reduction):
    impl.check_vs_espnet(DEVICE, backend, blank, reduction)


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
def test_threads_unchanged(backend):
    impl.check_threads_unchanged(DEVICE, backend)


@backends
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shift_invariance(backend, dtype):
    impl.check_shift_invariance(DEVICE, backend, dtype)


@backends
def test_forward_only(backend):
    impl.check_forward_only(DEVICE, backend)


@backends
def test_loss_dtypes(backend):
    impl.check_loss_dtypes(DEVICE, backend)


@backends
def test_masked_symbol(backend):
    impl.check_masked_symbol(DEVICE, backend)


@backends
@pytest.mark.parametrize("scale", [1e4, 100.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_logits(backend, dtype, scale):
    impl.check_large_logits(DEVICE, backend, dtype, scale)


@backends
@pytest.mark.parametrize("scale", [1.0, 1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "V", [FRAME_WIDE_BELOW_V - 1, FRAME_WIDE_BELOW_V, FRAME_WIDE_BELOW_V + 61]
)
def test_vocabulary_sizes_around_the_frame_wide_limit(backend, dtype, scale, V):
    impl.check_vocabulary_size(DEVICE, backend, dtype, V, scale)


def test_long_utterance():
    impl.check_long_utterance(DEVICE, (2, 4, 8))


def test_long_utterance_equal_logits():
    impl.check_long_equal_logits(DEVICE)


@backends
@pytest.mark.parametrize("reduction", impl.REDUCTIONS)
def test_zero_length_and_impossible(backend, reduction):
    impl.check_zero_length(DEVICE, backend, reduction)


@backends
def test_all_empty_utterances(backend):
    impl.check_all_empty(DEVICE, backend)


@backends
def test_module_and_aliases(backend):
    impl.check_module_and_aliases(DEVICE, backend)


@backends
def test_empty_batch(backend):
    impl.check_empty_batch(DEVICE, backend)


def test_auto_selects_numba_kernel_on_cpu(monkeypatch):
    """backend="auto" on CPU tensors goes through the fused Numba kernel."""
    import espnet_multiblank.loss.cpu as cpu

    calls = []
    original = cpu.compute

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(cpu, "compute", counting)
    c = impl.MB_CASE
    acts, labels, act_lens, label_lens = impl.make_inputs(c, DEVICE)
    impl.loss_and_grad(
        acts, labels, act_lens, label_lens, **c.kwargs(reduction="mean", backend="auto")
    )
    assert len(calls) == 1
    impl.loss_and_grad(
        acts,
        labels,
        act_lens,
        label_lens,
        **c.kwargs(reduction="mean", backend="torch")
    )
    assert len(calls) == 1


def test_fused_kernel_refuses_double_backward():
    """The kernels give no second derivative: differentiating the gradient again must
    fail instead of silently returning a wrong (zero) second derivative."""
    c = impl.MB_CASE
    acts, labels, act_lens, label_lens = impl.make_inputs(c, DEVICE)
    acts.requires_grad_(True)
    loss = multiblank_rnnt_loss(
        acts, labels, act_lens, label_lens, **c.kwargs(reduction="sum", backend="numba")
    )
    # loss ** 2: the incoming gradient (2 * loss) depends on acts, so without the guard
    # the second derivative would silently miss the kernel's own second-order term
    (g,) = torch.autograd.grad(loss**2, acts, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), acts)
