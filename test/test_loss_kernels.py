"""The kernel cases of ``helpers/kernel_cases.py`` per device: the CPU drivers on
the CPU, the CUDA drivers in Numba's CUDA simulator (a subprocess, ``conftest.py``)
and on a real GPU (skipped without one), each against the float64 reference, and
the CUDA drivers against the CPU ones on the same values."""

import devices
import kernel_cases as kc
import pytest
import torch

from espnet_multiblank.loss.families import family_of
from espnet_multiblank.loss.options import make_options, make_tdt_options

ids = [c.name for c in kc.CASES]


def _driver(device: str, case: kc.KernelCase):
    family = family_of(kc.case_options(case))
    return family.cpu_driver() if device == "cpu" else family.cuda_driver()


def _f32(case: kc.KernelCase) -> kc.KernelCase:
    """A float64 case again in float32 (on a GPU)."""
    return kc.KernelCase(
        **{
            **case.__dict__,
            "name": case.name + "_f32",
            "dtype": torch.float32,
            "tol": dict(cost=2e-5, grad=2e-5),
        }
    )


F32_AGAIN = [_f32(c) for c in kc.CASES if c.dtype == torch.float64]


def _skip_half_on_cpu(device, case):
    if device == "cpu" and case.dtype in (torch.float16, torch.bfloat16):
        pytest.skip(
            "the CPU kernels read float32 / float64 logits; half-precision logits go "
            "through the autograd Function's float32 chunks (test_loss.py)"
        )


@pytest.mark.parametrize("device", devices.params("cpu", "sim", "cuda"))
@pytest.mark.parametrize("case", kc.CASES, ids=ids)
def test_kernel_case(device, case):
    _skip_half_on_cpu(device, case)
    kc.run_case(case, devices.torch_device(device), _driver(device, case))


@pytest.mark.parametrize("device", devices.params("cuda"))
@pytest.mark.parametrize("case", F32_AGAIN, ids=[c.name for c in F32_AGAIN])
def test_kernel_case_float32(device, case):
    kc.run_case(case, devices.torch_device(device), _driver(device, case))


@pytest.mark.parametrize("device", devices.params("sim", "cuda"))
@pytest.mark.parametrize("case", kc.CASES, ids=ids)
def test_cuda_kernels_match_the_cpu_kernels(device, case):
    costs, grads = kc.run_kernel(
        case, devices.torch_device(device), _driver(device, case)
    )
    kc.compare_with_kernel(
        case,
        costs.cpu(),
        None if grads is None else grads.cpu(),
        _driver("cpu", case),
    )


@pytest.mark.parametrize("device", devices.params("cpu", "sim", "cuda"))
@pytest.mark.parametrize("lattice", ["standard", "multiblank", "tdt"])
def test_no_frames_no_labels_costs_plus_zero(device, lattice):
    """An utterance with no frames and no labels (log P = 0) costs +0.0, not -0.0,
    on every device and in the PyTorch reference, FastEmit on (beside an utterance
    with frames, so that the lattice kernels run and meet it)."""
    dev = devices.torch_device(device)
    if lattice == "tdt":
        opts = make_tdt_options(0, (0, 1, 2), "none", fastemit_lambda=0.5)
        width = 5 + 3
    else:
        opts = make_options(4, (2,) if lattice == "multiblank" else (), "none", 0.5)
        width = 5
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(2, 3, 2, width, generator=g, dtype=torch.float64).to(dev)
    labels = torch.tensor([[1], [1]], device=dev)
    act_lens = torch.tensor([0, 3], device=dev)
    label_lens = torch.tensor([0, 1], device=dev)
    family = family_of(opts)
    driver = family.cpu_driver() if device == "cpu" else family.cuda_driver()
    weights = torch.ones(2, dtype=torch.float64, device=dev)
    costs, _ = driver(acts, labels, act_lens, label_lens, opts, weights, True)
    reference = family.reference(acts, labels, act_lens, label_lens, opts)
    for got in (costs.cpu(), reference.cpu()):
        assert got[0].item() == 0.0 and not torch.signbit(got[0]), got
        assert torch.isfinite(got[1]) and got[1] > 0, got
