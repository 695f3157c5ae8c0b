"""The dense CPU loss hands autograd no subnormal numbers.

Nodes that paths almost never visit have occupancies far below float32's smallest
normal number; their gradient values are set to 0 below ``|f_b| 2**-80``
(``espnet_multiblank.loss.flush``), because subnormal operands make the output layer's
backward matmuls several times slower on CPUs. The values set to 0 are far below the
resolution of anything they enter, so the gradient stays the float64 reference's.
"""

import pytest
import torch

from espnet_multiblank import multiblank_rnnt_loss, tdt_loss
from espnet_multiblank.loss.flush import GRADIENT_FLUSH_BELOW

B, T, U, V = 2, 80, 16, 20
CASES = {
    "standard": dict(blank=0, big_blank_durations=()),
    "multiblank": dict(blank=3, big_blank_durations=(2, 4, 8)),
    "tdt": dict(blank=0, durations=(0, 1, 2, 3, 4)),
}


def _loss(kind, acts, labels, act_lens, label_lens, **kw):
    opts = dict(CASES[kind])
    if kind == "tdt":
        return tdt_loss(acts, labels, act_lens, label_lens, **opts, **kw)
    return multiblank_rnnt_loss(acts, labels, act_lens, label_lens, **opts, **kw)


def _inputs(kind):
    g = torch.Generator().manual_seed(7)
    width = V + (5 if kind == "tdt" else 0)
    # large logits: one path dominates, most nodes have occupancies far below 1e-38
    acts = torch.randn(B, T, U, width, generator=g, dtype=torch.float64) * 8.0
    first = CASES[kind]["blank"] + 1
    labels = torch.randint(first, V, (B, U - 1), generator=g)
    return acts, labels, torch.tensor([T, T - 9]), torch.tensor([U - 1, U - 4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", list(CASES))
def test_no_subnormal_gradient_values(kind, dtype):
    acts, labels, act_lens, label_lens = _inputs(kind)
    ref = acts.clone().requires_grad_(True)
    _loss(kind, ref, labels, act_lens, label_lens, backend="torch").backward()
    want = ref.grad
    factor = 1.0 / B  # reduction "mean"
    tiny = torch.finfo(dtype).tiny
    limit = max(factor * GRADIENT_FLUSH_BELOW, tiny)
    # the case exercises the rule: the exact gradient has values below the limit
    assert int(((want != 0) & (want.abs() < limit)).sum()) > 100

    x = acts.to(dtype).requires_grad_(True)
    _loss(kind, x, labels, act_lens, label_lens, backend="numba").backward()
    got = x.grad.double()
    assert int(((got != 0) & (got.abs() < limit)).sum()) == 0
    scale = float(want.abs().max())
    rtol, atol = (1e-4, 1e-6 * scale) if dtype == torch.float32 else (1e-9, 1e-12)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
