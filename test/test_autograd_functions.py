"""GradMultiply / grad_multiply and LogSoftmaxGradModification."""

import math

import pytest
import torch

from espnet_multiblank import GradMultiply, LogSoftmaxGradModification
from espnet_multiblank.autograd import grad_multiply

# ------------------------------------------------------------------------- GradMultiply


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_grad_multiply_forward_is_identity_without_copy(dtype):
    x = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    y = GradMultiply.apply(x, 0.1)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(y, x)
    assert y.data_ptr() == x.data_ptr(), "forward copied the data"
    assert y.requires_grad and y.grad_fn is not None


@pytest.mark.parametrize("scale", [0.1, 0.0, -2.0, 3.5, 1])
def test_grad_multiply_backward_scales(scale):
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64)
    (GradMultiply.apply(x, scale) * w).sum().backward()
    torch.testing.assert_close(x.grad, scale * w, rtol=0, atol=0)


@pytest.mark.parametrize("scale", [0.1, 0.25, 2.0])
def test_upstream_parameters_receive_scaled_gradient(scale):
    """nn.Linear -> GradMultiply -> loss: the Linear's parameters get exactly
    scale x the gradient they get without GradMultiply (the graph is not cut)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).double()
    inp = torch.randn(6, 4, dtype=torch.float64)
    target = torch.randn(6, 3, dtype=torch.float64)

    def grads(use_gm):
        lin.zero_grad()
        h = lin(inp)
        if use_gm:
            h = GradMultiply.apply(h, scale)
        ((h - target) ** 2).sum().backward()
        return lin.weight.grad.clone(), lin.bias.grad.clone()

    w_ref, b_ref = grads(False)
    w_gm, b_gm = grads(True)
    assert float(w_ref.abs().max()) > 0
    # powers of two commute exactly with the Linear's backward; 0.1 up to rounding
    tol = 0.0 if math.log2(scale).is_integer() else 1e-13
    torch.testing.assert_close(w_gm, scale * w_ref, rtol=tol, atol=0)
    torch.testing.assert_close(b_gm, scale * b_ref, rtol=tol, atol=0)


def test_grad_multiply_functional():
    x = torch.randn(4, requires_grad=True)
    assert grad_multiply(x, 1.0) is x  # no-op
    y = grad_multiply(x, 0.5)
    assert y.data_ptr() == x.data_ptr()
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 0.5))


@pytest.mark.parametrize("fn", [GradMultiply.apply, grad_multiply])
@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan])
def test_grad_multiply_non_finite_scale(fn, scale):
    with pytest.raises(ValueError, match="scale"):
        fn(torch.randn(3, requires_grad=True), scale)


@pytest.mark.parametrize("fn", [GradMultiply.apply, grad_multiply])
@pytest.mark.parametrize("scale", ["0.1", None, True, torch.tensor(0.5), [0.1]])
def test_grad_multiply_non_number_scale(fn, scale):
    with pytest.raises(TypeError, match="scale"):
        fn(torch.randn(3, requires_grad=True), scale)


def test_grad_multiply_rejects_tuple_input():
    """ESPnet's BEATs copy passes a tuple, which silently cuts the graph."""
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="x"):
        GradMultiply.apply((x,), 0.5)


def test_grad_multiply_gradcheck():
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: GradMultiply.apply(t, 1.0), (x,))
    # with scale != 1 the backward is (by design) not the derivative of the forward:
    # check the Jacobian explicitly instead
    (j,) = torch.autograd.functional.jacobian(
        lambda t: GradMultiply.apply(t, 0.3), (x,)
    )
    eye = torch.eye(6, dtype=torch.float64).reshape(3, 2, 3, 2)
    torch.testing.assert_close(j, 0.3 * eye)


# ----------------------------------------------------------- LogSoftmaxGradModification


def test_lsgm_forward_is_identity():
    x = torch.randn(2, 3, 5, requires_grad=True)
    y = LogSoftmaxGradModification.apply(x, 1.0)
    assert torch.equal(y, x)
    assert y.data_ptr() == x.data_ptr()
    assert y.requires_grad


@pytest.mark.parametrize("c", [0.5, 0.05, 0.0])
def test_lsgm_clips_gradient(c):
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(12)
    magnitudes = torch.logspace(-3, 0.5, 24, dtype=torch.float64)  # 1e-3 ... 3.2
    upstream = (signs * magnitudes)[torch.randperm(24)].reshape(4, 6)
    (LogSoftmaxGradModification.apply(x, c) * upstream).sum().backward()
    torch.testing.assert_close(x.grad, upstream.clamp(-c, c), rtol=0, atol=0)
    assert float(x.grad.abs().max()) <= c
    if c > 0:
        assert (upstream.abs() > c).any() and (upstream.abs() < c).any()


def test_lsgm_before_log_softmax_clamps_logit_gradient():
    """Placed before log_softmax (its use in the RNN-T loss), the gradient w.r.t. the
    logits is the log_softmax gradient clipped to [-c, c]."""
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 7, dtype=torch.float64) * 3
    (torch.log_softmax(x, -1) * w).sum().backward()
    plain = x.grad.clone()
    x.grad = None
    (
        torch.log_softmax(LogSoftmaxGradModification.apply(x, 0.4), -1) * w
    ).sum().backward()
    assert (plain.abs() > 0.4).any()
    torch.testing.assert_close(x.grad, plain.clamp(-0.4, 0.4), rtol=0, atol=1e-15)


@pytest.mark.parametrize("c", [-1.0, -1e-9, math.nan])
def test_lsgm_negative_clamp(c):
    with pytest.raises(ValueError, match="clamp"):
        LogSoftmaxGradModification.apply(torch.randn(3, requires_grad=True), c)


@pytest.mark.parametrize("c", ["1", None, True])
def test_lsgm_clamp_type(c):
    with pytest.raises(TypeError, match="clamp"):
        LogSoftmaxGradModification.apply(torch.randn(3, requires_grad=True), c)


def test_lsgm_gradcheck_large_clamp():
    """With a clamp larger than every gradient it is an exact identity."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: torch.log_softmax(LogSoftmaxGradModification.apply(t, 1e6), -1), (x,)
    )
