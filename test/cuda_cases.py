"""Test cases of the CUDA kernels, shared by the simulator run and the real-GPU tests.

Each case builds small random inputs, runs ``espnet_multiblank.loss.cuda.compute`` on
a given device (``cpu`` under ``NUMBA_ENABLE_CUDASIM=1``, ``cuda`` on a GPU) and
compares the costs and gradients with the float64 PyTorch reference
(``reference_costs`` + autograd, the gradient clamp done by LogSoftmaxGradModification
as in ``dispatch.ClampedReferenceFunction``), computed on the CPU.

Run as a script (``python test/cuda_cases.py --sim [--cpu-kernel] [-k NAME]``) it sets
``NUMBA_ENABLE_CUDASIM=1`` *before* numba is imported, runs every case (then the TDT
cases of ``tdt_cuda_cases.py``) in the simulator and prints one JSON line per case:
``{"case": name, "ok": bool, "msg": str}``.
``test/test_loss_cuda_sim.py`` runs it in a subprocess so that the simulator never
leaks into other tests.
"""

import contextlib
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

if __name__ == "__main__" and "--sim" in sys.argv:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba.cuda is imported

import torch  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from espnet_multiblank.loss.function import (  # noqa: E402
    FusedMultiblankRNNTFunction,
    reduction_weights,
)
from espnet_multiblank.loss.options import LossOptions, make_options  # noqa: E402
from espnet_multiblank.loss.reference import reference_costs  # noqa: E402


@dataclass
class Case:
    """One kernel test: shapes, lengths, options and what to check.

    Attributes:
        name: unique id.
        B, T, U, V: acts shape (B, T, U, V).
        act_lens, label_lens: per-utterance lengths (None = full).
        blank, durations, sigma, fastemit_lambda, clamp, reduction: loss options.
        label_width: labels.shape[1] (None = U - 1); may be < U - 1 or 0.
        dtype: acts dtype given to the kernel (float32 / float64).
        weights: grad_weights (None = reduction_weights of the options).
        need_grad: passed to compute.
        special: "nan", "posinf", "neginf" put such logits in, "" none.
        via_function: also run FusedMultiblankRNNTFunction + backward (incoming
            gradient 0.7, then a retain_graph backward with 1.3).
        seed: torch seed.
        tol: {"cost": .., "grad": ..} bounds of |got - want| / (1 + |want|).
        row_cfg: (team, block, unroll) forced on the row kernels (None: the
            launch layer's choice, tiny in the simulator).
        gpu_layout: force the layout a GPU would use for this V (also in the
            simulator: its team of up to 512 threads and 8 loads per chunk).
    """

    name: str
    B: int = 2
    T: int = 5
    U: int = 3
    V: int = 6
    act_lens: Optional[Sequence[int]] = None
    label_lens: Optional[Sequence[int]] = None
    blank: int = 0
    durations: Tuple[int, ...] = ()
    sigma: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = 0.0
    reduction: str = "none"
    label_width: Optional[int] = None
    dtype: torch.dtype = torch.float64
    weights: Optional[Sequence[float]] = None
    need_grad: bool = True
    special: str = ""
    via_function: bool = False
    seed: int = 0
    tol: dict = field(default_factory=dict)
    row_cfg: Optional[Tuple[int, int, int]] = None
    gpu_layout: bool = False


F32_TOL = dict(cost=1e-5, grad=1e-5)
# half-precision logits: the costs are float32 sums, the gradient is stored in half
F16_TOL = dict(cost=1e-5, grad=1e-3)
BF16_TOL = dict(cost=1e-5, grad=5e-3)

CASES = [
    Case("rnnt_n0_full", B=2, T=5, U=3, V=5, blank=0),
    Case("rnnt_n0_blank_last", B=2, T=4, U=3, V=5, blank=4, label_lens=[2, 1]),
    Case(
        "mb_d2_sigma",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=3,
        durations=(2,),
        sigma=0.05,
        act_lens=[5, 4],
        label_lens=[2, 1],
    ),
    Case(
        "mb_d24_varlen",
        B=3,
        T=6,
        U=4,
        V=8,
        blank=2,
        durations=(2, 4),
        sigma=0.05,
        act_lens=[6, 5, 3],
        label_lens=[3, 1, 2],
        reduction="mean",
    ),
    Case(
        "mb_d42_blank_mid",
        B=2,
        T=6,
        U=3,
        V=7,
        blank=4,
        durations=(4, 2),
        act_lens=[6, 4],
        label_lens=[2, 2],
    ),
    Case(
        "mb_fastemit",
        B=2,
        T=5,
        U=4,
        V=6,
        blank=3,
        durations=(2,),
        fastemit_lambda=0.5,
        act_lens=[5, 3],
        label_lens=[3, 1],
    ),
    Case("n0_fastemit", B=2, T=4, U=3, V=5, blank=0, fastemit_lambda=0.01),
    Case(
        "mb_clamp",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=2,
        durations=(2, 4),
        clamp=0.05,
        act_lens=[5, 4],
        label_lens=[2, 1],
    ),
    Case(
        "mb_clamp_weights_fastemit",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=2,
        durations=(2,),
        clamp=0.1,
        fastemit_lambda=0.3,
        sigma=0.05,
        weights=[0.5, 3.0],
    ),
    Case(
        "zero_length_utts",
        B=3,
        T=4,
        U=3,
        V=5,
        blank=1,
        durations=(2,),
        act_lens=[0, 0, 4],
        label_lens=[0, 2, 1],
    ),
    Case("all_T_zero", B=2, T=0, U=3, V=5, blank=1, durations=(2,), label_lens=[0, 1]),
    Case(
        "narrow_labels",
        B=2,
        T=5,
        U=4,
        V=6,
        blank=3,
        durations=(2,),
        label_width=1,
        label_lens=[1, 0],
    ),
    Case(
        "no_labels",
        B=2,
        T=4,
        U=2,
        V=5,
        blank=2,
        durations=(2,),
        label_width=0,
        label_lens=[0, 0],
    ),
    Case(
        "float32",
        B=2,
        T=6,
        U=4,
        V=8,
        blank=3,
        durations=(2, 4),
        sigma=0.05,
        dtype=torch.float32,
        act_lens=[6, 4],
        label_lens=[3, 2],
        tol=dict(cost=1e-5, grad=1e-5),
    ),
    Case(
        "float32_fastemit_clamp",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=1,
        durations=(3,),
        fastemit_lambda=0.2,
        clamp=0.2,
        dtype=torch.float32,
        tol=dict(cost=1e-5, grad=1e-5),
    ),
    Case("no_grad", B=2, T=5, U=3, V=6, blank=3, durations=(2,), need_grad=False),
    Case(
        "masked_neginf",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=3,
        durations=(2,),
        special="neginf",
    ),
    Case("nan_logit", B=2, T=4, U=3, V=5, blank=2, durations=(2,), special="nan"),
    Case("posinf_logit", B=2, T=4, U=3, V=5, blank=2, durations=(2,), special="posinf"),
    Case(
        "function_mean_volume",
        B=3,
        T=5,
        U=4,
        V=6,
        blank=3,
        durations=(2,),
        act_lens=[5, 2, 4],
        label_lens=[3, 1, 0],
        reduction="mean_volume",
        clamp=0.2,
        via_function=True,
    ),
    Case(
        "function_sum_fastemit",
        B=2,
        T=6,
        U=3,
        V=7,
        blank=4,
        durations=(2, 4),
        fastemit_lambda=0.1,
        sigma=0.05,
        reduction="sum",
        via_function=True,
    ),
    # row layouts: a team of 64 threads (its shared-memory tree crosses warps),
    # three chunks per thread with a partial last one
    Case(
        "xwarp_team64_3chunks",
        B=2,
        T=3,
        U=3,
        V=300,
        blank=7,
        durations=(2, 4),
        sigma=0.05,
        act_lens=[3, 2],
        label_lens=[2, 1],
        row_cfg=(64, 64, 2),
        seed=11,
    ),
    # two 64-thread teams per block, float32
    Case(
        "xwarp_2rows_per_block_f32",
        B=2,
        T=3,
        U=2,
        V=200,
        blank=0,
        clamp=0.05,
        row_cfg=(64, 128, 2),
        dtype=torch.float32,
        tol=F32_TOL,
        seed=12,
    ),
    # the layouts a GPU uses: V = 64 (teams of 8, 16 rows per block), V = 1000
    # (one 128-thread team, one chunk of 8 loads), V = 3000 (512 threads)
    Case(
        "gpu_layout_V64_f32",
        B=3,
        T=4,
        U=3,
        V=64,
        blank=3,
        durations=(2,),
        act_lens=[4, 3, 2],
        label_lens=[2, 1, 2],
        dtype=torch.float32,
        tol=F32_TOL,
        gpu_layout=True,
        seed=13,
    ),
    Case(
        "gpu_layout_V1000_f32",
        B=1,
        T=2,
        U=2,
        V=1000,
        blank=500,
        durations=(2, 4, 8),
        sigma=0.05,
        dtype=torch.float32,
        tol=F32_TOL,
        gpu_layout=True,
        seed=14,
    ),
    Case(
        "gpu_layout_V3000_bf16",
        B=1,
        T=2,
        U=2,
        V=3000,
        blank=3,
        durations=(2,),
        dtype=torch.bfloat16,
        tol=BF16_TOL,
        gpu_layout=True,
        seed=15,
    ),
    # half-precision logits read directly (bfloat16 as int16 bits)
    Case(
        "float16",
        B=2,
        T=5,
        U=3,
        V=7,
        blank=3,
        durations=(2,),
        sigma=0.05,
        act_lens=[5, 4],
        label_lens=[2, 1],
        dtype=torch.float16,
        tol=F16_TOL,
        seed=16,
    ),
    Case(
        "bfloat16_clamp_fastemit_weights",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=2,
        durations=(2,),
        clamp=0.1,
        fastemit_lambda=0.3,
        weights=[0.5, 2.0],
        dtype=torch.bfloat16,
        tol=BF16_TOL,
        seed=17,
    ),
    Case(
        "function_float16",
        B=3,
        T=5,
        U=3,
        V=6,
        blank=3,
        durations=(2, 4),
        reduction="mean",
        act_lens=[5, 3, 4],
        label_lens=[2, 1, 0],
        dtype=torch.float16,
        tol=F16_TOL,
        via_function=True,
        seed=18,
    ),
    Case(
        "function_bfloat16",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=3,
        durations=(2,),
        reduction="sum",
        sigma=0.05,
        dtype=torch.bfloat16,
        tol=BF16_TOL,
        via_function=True,
        seed=19,
    ),
    # a long utterance in float32 against the float64 reference: the row sums are
    # float32, alpha/beta float64 (one thread per row: few simulated barriers)
    Case(
        "long_T1200_float32",
        B=2,
        T=1200,
        U=3,
        V=6,
        blank=5,
        durations=(2, 4, 8),
        sigma=0.05,
        act_lens=[1200, 900],
        label_lens=[2, 1],
        dtype=torch.float32,
        tol=dict(cost=1e-6, grad=1e-6),
        row_cfg=(1, 128, 4),
        seed=20,
    ),
]


def make_inputs(case: Case, device="cpu"):
    """(acts, labels, act_lens, label_lens, opts) for ``case``, on ``device``.

    acts: (B, T, U, V) case.dtype. labels: (B, label_width) int64 with non-blank ids
    (0 beyond label_lens, as validate_inputs leaves them). Lengths: (B,) int64.
    """
    g = torch.Generator().manual_seed(case.seed)
    B, T, U, V = case.B, case.T, case.U, case.V
    opts = make_options(
        case.blank,
        case.durations,
        case.reduction,
        case.fastemit_lambda,
        case.clamp,
        case.sigma,
    )
    acts = torch.randn((B, T, U, V), generator=g, dtype=torch.float64) * 2.0
    if case.special:
        val = {"nan": math.nan, "posinf": math.inf, "neginf": -math.inf}[case.special]
        if case.special == "neginf":
            # mask one non-blank symbol everywhere in utterance 0 and most of row 1's
            masked = [k for k in range(V) if k not in opts.all_blank_ids][-1]
            acts[0, :, :, masked] = val
            acts[1, :, 1:, masked] = val
        else:
            acts[0, 0, 0, opts.blank] = val
    width = U - 1 if case.label_width is None else case.label_width
    act_lens = torch.tensor(case.act_lens if case.act_lens else [T] * B)
    label_lens = torch.tensor(case.label_lens if case.label_lens else [width] * B)
    non_blank = [k for k in range(V) if k not in opts.all_blank_ids]
    if case.special == "neginf":
        non_blank = non_blank[:-1]
    pick = torch.randint(0, len(non_blank), (B, width), generator=g)
    labels = torch.tensor(non_blank)[pick] if width > 0 else torch.zeros((B, 0))
    labels = labels.long()
    pos = torch.arange(width)[None, :]
    labels = torch.where(pos < label_lens[:, None], labels, torch.zeros_like(labels))
    to = dict(device=device)
    return (
        acts.to(case.dtype).to(**to),
        labels.to(**to),
        act_lens.long().to(**to),
        label_lens.long().to(**to),
        opts,
    )


def reference(
    acts, labels, act_lens, label_lens, opts: LossOptions, weights, device="cpu"
):
    """float64 oracle (on ``device``, CPU by default): CPU costs (B,), grads (B,T,U,V).

    grads[b] = clamp(d cost_b / d acts_b) * weights[b] (clamp only if opts.clamp > 0),
    0 for utterances with a non-finite cost.
    """
    x = acts.detach().double().to(device).requires_grad_(True)
    labels, act_lens, label_lens = (
        labels.to(device),
        act_lens.to(device),
        label_lens.to(device),
    )
    costs = reference_costs(x, labels, act_lens, label_lens, opts, clamp=opts.clamp)
    finite = torch.isfinite(costs)
    if bool(finite.any()) and x.numel() > 0:
        (grads,) = torch.autograd.grad(costs[finite].sum(), x, allow_unused=True)
        if grads is None:
            grads = torch.zeros_like(x)
    else:
        grads = torch.zeros_like(x)
    grads = grads * weights.double().to(device).view(-1, 1, 1, 1)
    return costs.detach().cpu(), grads.cpu()


def _close(name, got, want, tol):
    got = got.detach().double().cpu()
    want = want.detach().double().cpu()
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    same_inf = torch.isinf(got) == torch.isinf(want)
    if not bool(same_inf.all()) or not bool(
        (got[torch.isinf(got)] == want[torch.isinf(want)]).all()
    ):
        raise AssertionError(f"{name}: infinities differ: {got} vs {want}")
    fin = torch.isfinite(want)
    if not bool(torch.isfinite(got[fin]).all()):
        raise AssertionError(f"{name}: non-finite values where the reference is finite")
    err = (got[fin] - want[fin]).abs()
    bound = tol * (1.0 + want[fin].abs())
    if err.numel() and not bool((err <= bound).all()):
        i = int((err - bound).argmax())
        raise AssertionError(
            f"{name}: max |diff| {float(err.max()):.3e} > tol {tol:g} "
            f"(got {float(got[fin][i])}, want {float(want[fin][i])})"
        )


@contextlib.contextmanager
def row_layout(case, V: int):
    """Force ``case.row_cfg`` (or the GPU layout for V) on the launch layer."""
    if case.row_cfg is None and not case.gpu_layout:
        yield
        return
    from espnet_multiblank.loss.cuda import launch

    prev = launch.ROW_CONFIG_OVERRIDE
    launch.ROW_CONFIG_OVERRIDE = (
        launch.gpu_row_config(V) if case.gpu_layout else tuple(case.row_cfg)
    )
    try:
        yield
    finally:
        launch.ROW_CONFIG_OVERRIDE = prev


def cost_dtype(dtype):
    """The kernels' costs: float64 for float64 logits, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_function(case, acts, labels, act_lens, label_lens, opts, compute, ref):
    """FusedMultiblankRNNTFunction around ``compute``: loss, then backward with an
    incoming gradient of 0.7 (folded into the kernel), then a ``retain_graph``
    backward with 1.3 (a rescaled copy); ``ref`` = (reference loss, reference
    d loss / d acts for an incoming gradient of 1)."""
    want_loss, ref_g = ref
    tol_c = case.tol.get("cost", 1e-10)
    tol_g = case.tol.get("grad", 1e-10)
    x = acts.detach().clone().requires_grad_(True)
    loss = FusedMultiblankRNNTFunction.apply(
        x, labels, act_lens, label_lens, opts, compute
    )
    _close("function loss", loss, want_loss, tol_c)
    if loss.device != acts.device:
        raise AssertionError(f"loss on {loss.device}, acts on {acts.device}")
    (loss * 0.7).sum().backward(retain_graph=True)
    if x.grad.dtype != acts.dtype:
        raise AssertionError(f"grad dtype {x.grad.dtype} != {acts.dtype}")
    _close("function grad x 0.7", x.grad, ref_g * 0.7, tol_g)
    first = x.grad
    x.grad = None
    (loss * 1.3).sum().backward()
    _close("function grad x 1.3 (retain_graph)", x.grad, ref_g * 1.3, tol_g)
    _close("first gradient kept", first, ref_g * 0.7, tol_g)


def check_half_rounding(name, got, want, dtype):
    """A half-precision gradient must be the exact one rounded to nearest: equal to
    the float64 reference rounded to ``dtype`` except where the kernel's float32
    arithmetic lands on the other side of a rounding boundary (rare: at most 2 %
    of the non-zero elements, and never more than one unit in the last place).
    Truncation, or rounding twice, would miss about half of them."""
    if dtype not in (torch.float16, torch.bfloat16):
        return
    got = got.detach().cpu()
    want_r = want.detach().cpu().to(dtype)
    nz = want_r != 0
    if not bool(nz.any()):
        return
    miss = int((got[nz] != want_r[nz]).sum())
    allowed = max(1, int(0.02 * int(nz.sum())))
    if miss > allowed:
        raise AssertionError(
            f"{name}: {miss} of {int(nz.sum())} elements differ from the reference "
            f"rounded to {dtype} (at most {allowed} allowed)"
        )
    step = torch.finfo(dtype).eps * want_r.float().abs()  # one ulp (normal range)
    diff = (got.float() - want_r.float()).abs()
    if bool((diff > step + torch.finfo(dtype).tiny).any()):
        raise AssertionError(f"{name}: more than one ulp from the rounded reference")


def run_case(
    case: Case,
    device="cpu",
    compute=None,
    check_padding=True,
    keep=None,
    ref_device="cpu",
):
    """Run ``case`` through ``compute`` (default: the CUDA backend) and check it.

    ``ref_device``: where the float64 reference runs (the GPU for big cases).

    Raises AssertionError with a message on any mismatch; returns a short summary.
    ``keep`` (a dict), if given, receives the kernel's "costs" and "grads".
    """
    if compute is None:
        from espnet_multiblank.loss.cuda import compute
    acts, labels, act_lens, label_lens, opts = make_inputs(case, device)
    B, T, U, V = acts.shape
    wdtype = cost_dtype(acts.dtype)
    if case.weights is not None:
        weights = torch.tensor(case.weights, dtype=wdtype, device=device)
    else:
        weights = reduction_weights(opts, label_lens, wdtype)
    tol_c = case.tol.get("cost", 1e-10)
    tol_g = case.tol.get("grad", 1e-10)

    with row_layout(case, V):
        costs, grads = compute(
            acts, labels, act_lens, label_lens, opts, weights, case.need_grad
        )
    if keep is not None:
        keep["costs"], keep["grads"] = costs, grads
    if costs.shape != (B,) or costs.dtype != wdtype or costs.device != acts.device:
        raise AssertionError(f"costs: {costs.shape} {costs.dtype} {costs.device}")

    if case.special in ("nan", "posinf"):
        if not bool(torch.isnan(costs[0])):
            raise AssertionError(
                f"{case.special} logit: cost[0] = {costs[0]}, want NaN"
            )
        if not bool(torch.isfinite(costs[1:]).all()):
            raise AssertionError(f"other utterances must stay finite: {costs}")
        return "nan reported"

    if T == 0:  # (the reference needs T >= 1) every T_b = 0: 0 or +inf, no gradient
        ref_c = torch.where(label_lens.cpu() == 0, 0.0, math.inf).double()
        ref_g = torch.zeros(acts.shape, dtype=torch.float64)
    else:
        ref_c, ref_g = reference(
            acts, labels, act_lens, label_lens, opts, weights, ref_device
        )
    _close("costs", costs, ref_c, tol_c)
    if not case.need_grad:
        if grads is not None:
            raise AssertionError("need_grad=False must return grads=None")
        return f"costs {costs.tolist()}"
    if grads.shape != acts.shape or grads.dtype != acts.dtype:
        raise AssertionError(f"grads: {grads.shape} {grads.dtype}")
    _close("grads", grads, ref_g, tol_g)
    check_half_rounding("grads", grads, ref_g, acts.dtype)
    if check_padding and T > 0:
        t = torch.arange(T, device=device)[None, :, None]
        u = torch.arange(U, device=device)[None, None, :]
        pad = (t >= act_lens[:, None, None]) | (u >= (label_lens + 1)[:, None, None])
        pad = pad | ~torch.isfinite(costs)[:, None, None]
        if bool((grads[pad] != 0).any()):
            raise AssertionError("non-zero gradient at padding / impossible utterance")

    if case.via_function:
        from espnet_multiblank.loss.function import reduce_costs

        # d loss / d acts for an incoming gradient of 1: the reduction's weights
        w = reduction_weights(opts, label_lens.cpu(), torch.float64)
        ref_fn = reference(acts, labels, act_lens, label_lens, opts, w, ref_device)[1]
        with row_layout(case, V):
            check_function(
                case,
                acts,
                labels,
                act_lens,
                label_lens,
                opts,
                compute,
                (reduce_costs(ref_c, opts, label_lens.cpu()), ref_fn),
            )
    return f"costs {[round(float(c), 6) for c in costs]}"


def compare_with_cpu_kernel(case: Case, costs, grads, cpu_compute):
    """Check the CUDA backend's (costs, grads) against the CPU Numba kernel's."""
    acts, labels, act_lens, label_lens, opts = make_inputs(case, "cpu")
    if acts.dtype in (torch.float16, torch.bfloat16):
        acts = acts.float()  # the same values; the CPU kernel computes in float32
    if case.weights is not None:
        weights = torch.tensor(case.weights, dtype=acts.dtype)
    else:
        weights = reduction_weights(opts, label_lens, acts.dtype)
    c2, g2 = cpu_compute(
        acts, labels, act_lens, label_lens, opts, weights, case.need_grad
    )
    if case.special in ("nan", "posinf"):
        if not bool(torch.isnan(c2[0])):
            raise AssertionError(f"NaN handling differs: {costs} vs cpu {c2}")
        return "both NaN"
    tol = max(case.tol.get("cost", 1e-10), 1e-9)
    _close("costs vs cpu kernel", costs, c2, tol)
    if case.need_grad:
        _close("grads vs cpu kernel", grads, g2, max(case.tol.get("grad", 1e-10), 1e-9))
    return "matches the cpu kernel"


def _main(argv):
    # the simulator's block manager polls its threads: a short switch interval makes
    # each simulated syncthreads ~50x cheaper
    sys.setswitchinterval(1e-4)
    from tdt_cuda_cases import TDT_CASES, compare_tdt_with_cpu_kernel, run_tdt_case

    only = None
    if "-k" in argv:
        only = argv[argv.index("-k") + 1]
    cpu_compute, tdt_cpu_compute, cpu_skip = None, None, "not asked for (--cpu-kernel)"
    if "--cpu-kernel" in argv:
        try:
            from espnet_multiblank.loss.cpu import compute as cpu_compute
            from espnet_multiblank.loss.cpu.tdt_driver import (
                tdt_compute as tdt_cpu_compute,
            )
        except ImportError as e:
            cpu_skip = f"espnet_multiblank.loss.cpu not importable: {e}"
    jobs = [(c, run_case, compare_with_cpu_kernel, cpu_compute) for c in CASES]
    jobs += [
        (c, run_tdt_case, compare_tdt_with_cpu_kernel, tdt_cpu_compute)
        for c in TDT_CASES
    ]
    for case, run, compare, cpu in jobs:
        if only and only not in case.name:
            continue
        t0 = time.time()
        out = {}
        try:
            msg = run(case, "cpu", keep=out)
            ok = True
        except Exception as e:  # report, keep going
            ok = False
            msg = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        rec = dict(case=case.name, kind="ref", ok=ok, msg=msg, s=time.time() - t0)
        print(json.dumps(rec), flush=True)
        rec = dict(case=case.name, kind="cpu", ok=True, skip=cpu_skip, msg="")
        if cpu is not None:
            rec["skip"] = None
            if "costs" not in out:
                rec["skip"] = "the CUDA backend itself failed"
            else:
                try:
                    rec["msg"] = compare(case, out["costs"], out["grads"], cpu)
                except Exception as e:
                    rec["ok"] = False
                    rec["msg"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
