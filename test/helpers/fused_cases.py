"""Cases, inputs and oracles of the fused joint + loss tests.

The oracles:

* :func:`dense_loss`: the DENSE path the fused loss must reproduce: the logits
  ``act(enc[:, :, None] + pred[:, None]) @ weight.T + bias`` materialised (float64 by
  default), then the project's dense loss (``multiblank_rnnt_loss`` / ``tdt_loss``,
  validated by its own tests against brute force, ESPnet and gradcheck; by default
  its float64 PyTorch backend, which shares no kernel with the fused path on any
  device), autograd for the four gradients;
* :func:`brute_force_loss`: the path enumeration of ``oracles.py`` /
  ``tdt_oracles.py`` (written from docs/lattice.md, tiny shapes) on the materialised
  float64 logits, chained by autograd into enc, pred, weight and bias;
"""

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import torch
from oracles import brute_force_costs, reduction_weights_oracle
from tdt_oracles import tdt_brute_force_costs

from espnet_multiblank import multiblank_rnnt_loss, tdt_loss
from espnet_multiblank.fused import fused_transducer_loss
from espnet_multiblank.fused.activations import joint_activation
from espnet_multiblank.loss.reductions import REDUCTIONS  # noqa: F401  (the tests)


@dataclass(frozen=True)
class JointCase:
    """A batch of a joint network + loss.

    Attributes:
        act_lens, label_lens: per utterance (give B).
        T, U, J: enc (B, T, J), pred (B, U, J).
        V: token vocabulary (all blanks included); weight has V' = V (+ D for TDT)
            rows.
        blank, big: the multi-blank lattice; tdt: TDT durations (None: RNN-T).
        scale: std of enc and pred; wscale: std of weight * sqrt(J).
    """

    name: str
    act_lens: Tuple[int, ...]
    label_lens: Tuple[int, ...]
    T: int
    U: int
    J: int
    V: int
    blank: int = 0
    big: Tuple[int, ...] = ()
    tdt: Optional[Tuple[int, ...]] = None
    sigma: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = 0.0
    activation: str = "tanh"
    seed: int = 0
    scale: float = 1.0
    wscale: float = 2.0
    bias: bool = True
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def B(self) -> int:
        return len(self.act_lens)

    @property
    def Vp(self) -> int:
        return self.V + (len(self.tdt) if self.tdt else 0)

    @property
    def blank_ids(self) -> Tuple[int, ...]:
        return (self.blank,) + tuple(self.blank - 1 - i for i in range(len(self.big)))

    @property
    def label_ids(self) -> Tuple[int, ...]:
        return tuple(k for k in range(self.V) if k not in self.blank_ids)

    def fused_kwargs(self, **over) -> dict:
        kw = dict(
            blank=self.blank,
            big_blank_durations=self.big,
            tdt_durations=self.tdt,
            activation=self.activation,
            sigma=self.sigma,
            fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp,
        )
        kw.update(over)
        return kw


def standard(name="standard", **kw) -> JointCase:
    d = dict(act_lens=(6, 4, 5), label_lens=(3, 2, 0), T=6, U=4, J=8, V=7)
    d.update(kw)
    return JointCase(name, **d)


def multiblank(name="multiblank", **kw) -> JointCase:
    d = dict(act_lens=(9, 7, 4), label_lens=(3, 1, 2), T=9, U=4, J=8, V=10)
    d.update(dict(blank=3, big=(2, 4, 8)))
    d.update(kw)
    return JointCase(name, **d)


def tdt(name="tdt", **kw) -> JointCase:
    d = dict(act_lens=(7, 5, 3), label_lens=(3, 2, 1), T=7, U=4, J=8, V=8)
    d.update(dict(blank=0, tdt=(0, 1, 2, 3, 4)))
    d.update(kw)
    return JointCase(name, **d)


LATTICES = {"standard": standard, "multiblank": multiblank, "tdt": tdt}


def make_inputs(case: JointCase, dtype=torch.float64, device="cpu", padding="big"):
    """(enc, pred, weight, bias, labels, act_lens, label_lens), drawn in float64 on the
    CPU from ``case.seed`` and cast. Padding of enc (t >= T_b), pred (u > L_b) holds
    ``padding``: "big" (finite garbage, +-1e3), "nan", or "zero"; the label padding
    holds ids the loss must ignore (-1, the blank, 10**6)."""
    gen = torch.Generator().manual_seed(case.seed)
    f64 = dict(dtype=torch.float64)
    enc = torch.randn(case.B, case.T, case.J, generator=gen, **f64) * case.scale
    pred = torch.randn(case.B, case.U, case.J, generator=gen, **f64) * case.scale
    weight = torch.randn(case.Vp, case.J, generator=gen, **f64)
    weight *= case.wscale / math.sqrt(case.J)
    bias = torch.randn(case.Vp, generator=gen, **f64) if case.bias else None
    ids = torch.tensor(case.label_ids)
    labels = ids[torch.randint(len(ids), (case.B, case.U - 1), generator=gen)]
    fill = {"big": 1e3, "nan": math.nan, "zero": 0.0}[padding]
    for b, (T_b, L_b) in enumerate(zip(case.act_lens, case.label_lens)):
        enc[b, T_b:] = fill * (-1) ** torch.arange(case.J)
        pred[b, L_b + 1 :] = fill
        for j in range(L_b, case.U - 1):
            labels[b, j] = (-1, case.blank, 10**6)[j % 3]
    as_dtype = dict(dtype=dtype, device=device)
    return (
        enc.to(**as_dtype),
        pred.to(**as_dtype),
        weight.to(**as_dtype),
        None if bias is None else bias.to(**as_dtype),
        labels.to(device),
        torch.tensor(case.act_lens, dtype=torch.int64, device=device),
        torch.tensor(case.label_lens, dtype=torch.int64, device=device),
    )


def leaves(inputs, dtype=None):
    """Fresh leaf copies of enc, pred, weight, bias that require grad."""
    out = []
    for x in inputs[:4]:
        if x is None:
            out.append(None)
            continue
        x = x.detach().clone()
        out.append((x if dtype is None else x.to(dtype)).requires_grad_(True))
    return out


def materialise(case: JointCase, enc, pred, weight, bias, activation=None):
    """The dense joint's logits (B, T, U, V')."""
    act = joint_activation(activation if activation is not None else case.activation)
    z = act(enc[:, :, None] + pred[:, None]) @ weight.t()
    return z if bias is None else z + bias


def _grads(loss, params, grad_out):
    want = [p for p in params if p is not None]
    got = torch.autograd.grad(loss, want, grad_outputs=grad_out)
    it = iter(got)
    return [None if p is None else next(it) for p in params]


def default_grad_out(reduction: str, B: int, dtype) -> torch.Tensor:
    if reduction == "none":
        return torch.linspace(0.5, 1.7, B, dtype=dtype)
    return torch.tensor(0.7, dtype=dtype)


def dense_loss(
    case: JointCase,
    inputs,
    reduction="none",
    grad_out=None,
    dtype=torch.float64,
    backend="torch",
    activation=None,
    **over,
):
    """(loss, [d enc, d pred, d weight, d bias]) of the dense path (module
    docstring), in ``dtype``; ``over`` overrides loss options."""
    params = leaves(inputs, dtype)
    z = materialise(case, *params, activation=activation)
    labels, act_lens, label_lens = inputs[4:]
    kw = dict(
        blank=case.blank,
        reduction=reduction,
        sigma=case.sigma,
        fastemit_lambda=case.fastemit_lambda,
        clamp=case.clamp,
        backend=backend,
    )
    kw.update(over)
    if case.tdt is not None:
        loss = tdt_loss(z, labels, act_lens, label_lens, durations=case.tdt, **kw)
    else:
        loss = multiblank_rnnt_loss(
            z, labels, act_lens, label_lens, big_blank_durations=case.big, **kw
        )
    if grad_out is None:
        grad_out = default_grad_out(reduction, case.B, loss.dtype)
    # on the loss's device: autograd moves a CPU scalar, not a CPU vector
    return loss.detach(), _grads(loss, params, grad_out.to(loss.device, loss.dtype))


#: the fused loss's paths the tests name (their ``backend`` parameter): the keyword
#: arguments of each. "numba": the device's Numba lattice with the tile stages "auto"
#: picks (CPU: the Numba tile kernels; CUDA and the simulator: Triton's); "torch":
#: the PyTorch lattice and torch tile operations; "torch-tiles": torch tile
#: operations with the Numba lattice; "triton": Triton tiles with the Numba lattice
PATHS = {
    "numba": dict(backend="numba"),
    "torch": dict(backend="torch"),
    "torch-tiles": dict(backend="numba", tile_backend="torch"),
    "triton": dict(backend="numba", tile_backend="triton"),
}


def fused_loss(
    case: JointCase, inputs, reduction="none", grad_out=None, path=None, **over
):
    """(loss, [d enc, d pred, d weight, d bias]) of fused_transducer_loss on the
    inputs as they are (their dtypes); ``path``: a name of :data:`PATHS` (None:
    the defaults); ``over`` overrides its keyword arguments."""
    if path is not None:
        over = {**PATHS[path], **over}
    params = leaves(inputs)
    loss = fused_transducer_loss(
        *params, *inputs[4:], reduction=reduction, **case.fused_kwargs(**over)
    )
    if grad_out is None:
        grad_out = default_grad_out(reduction, case.B, loss.dtype)
    # on the loss's device: autograd moves a CPU scalar, not a CPU vector
    return loss.detach(), _grads(loss, params, grad_out.to(loss.device, loss.dtype))


def brute_force_loss(case: JointCase, inputs, reduction="none", grad_out=None):
    """(loss, grads) by path enumeration on the float64 materialised logits."""
    params = leaves(inputs, torch.float64)
    z = materialise(case, *params)
    labels, act_lens, label_lens = (x.cpu() for x in inputs[4:])
    args = (z.detach(), labels, act_lens, label_lens, case.blank)
    opt = (case.sigma, case.fastemit_lambda, case.clamp)
    if case.tdt is not None:
        costs, gz = tdt_brute_force_costs(*args, case.tdt, *opt)
    else:
        costs, gz = brute_force_costs(*args, case.big, *opt)
    rw = reduction_weights_oracle(reduction, label_lens)
    if grad_out is None:
        grad_out = default_grad_out(reduction, case.B, torch.float64)
    loss = costs if reduction == "none" else (costs * rw).sum()
    # d loss / d cost_b times the incoming gradient; the enumeration runs on the CPU
    factors = rw * grad_out.double().cpu()
    return loss, _grads(z, params, (gz * factors.view(-1, 1, 1, 1)).to(z.device))


def assert_close(name, actual, expected, rtol, atol):
    """|actual - expected| <= atol + rtol |expected| elementwise (None == None)."""
    if expected is None:
        assert actual is None, f"{name}: expected no gradient"
        return
    assert actual is not None, f"{name}: no gradient"
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    same_inf = (a == e) & torch.isinf(e)
    err = torch.where(same_inf, 0.0, (a - e).abs() - rtol * e.abs())
    worst = float(err.max()) if err.numel() else 0.0
    assert (
        worst <= atol
    ), f"{name}: max |got - want| - rtol |want| = {worst:.3e} > atol {atol:.1e}"


GRAD_NAMES = ("d_enc", "d_pred", "d_weight", "d_bias")


def assert_same_results(got, want, rtol, atol, what=""):
    """(loss, grads) pairs agree (costs and all four gradients)."""
    assert_close(f"{what} loss", got[0], want[0], rtol, atol)
    for name, g, w in zip(GRAD_NAMES, got[1], want[1]):
        assert_close(f"{what} {name}", g, w, rtol, atol)


def durations_of(case: JointCase) -> Sequence[int]:
    return case.tdt if case.tdt is not None else case.big
