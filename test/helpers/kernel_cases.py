"""Kernel-level cases of the losses, for every device: the kernels' two contracts
(``compute`` and, with ``via_function``, the autograd Function around it) against
the float64 PyTorch reference.

Each :class:`KernelCase` builds small random inputs of one lattice family, runs a
kernel driver's ``compute(acts, labels, act_lens, label_lens, opts, grad_weights,
need_grad)`` on a device and compares the costs and gradients with the float64
reference (the family's reference costs + autograd, the gradient clamp done by
LogSoftmaxGradModification as in ``dispatch.ClampedReferenceFunction``) and,
optionally, with another driver (:func:`compare_with_kernel`: the CUDA kernels
against the CPU ones). ``test_loss_kernels.py`` runs them on the CPU (the CPU
drivers), in the CUDA simulator and on a GPU (the CUDA drivers); the cases include
row layouts whose shared-memory tree crosses warps, the exact layouts a GPU uses for
V = 64, 1000 and 3000, float16 / bfloat16 logits and long float32 utterances.
"""

import contextlib
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import torch

from espnet_multiblank.loss.families import family_of
from espnet_multiblank.loss.function import (
    FusedTransducerFunction,
    reduce_costs,
    reduction_weights,
)
from espnet_multiblank.loss.options import make_options, make_tdt_options


@dataclass
class KernelCase:
    """One kernel test: shapes, lengths, options and what to check.

    Attributes:
        name: unique id.
        tdt: a TDT case (V token logits, then len(durations) duration logits), else
            multi-blank (standard RNN-T without durations).
        B, T, U, V: acts shape (B, T, U, V) (TDT: V + len(durations) wide).
        act_lens, label_lens: per-utterance lengths (None = full).
        blank, durations, sigma, fastemit_lambda, clamp, reduction: loss options.
        label_width: labels.shape[1] (None = U - 1); may be < U - 1 or 0.
        dtype: acts dtype given to the kernel.
        weights: grad_weights (None = reduction_weights of the options).
        need_grad: passed to compute.
        special: logits that make a case: "nan", "posinf", "nan_token",
            "nan_duration", "nan_dead_end" (utterance 0's cost must be NaN; the
            dead end: a NaN duration logit in a row none of whose steps can reach
            the end), "neginf" (a masked symbol), "" none.
        via_function: also run FusedTransducerFunction + backward (incoming
            gradient 0.7, then a retain_graph backward with 1.3).
        seed: torch seed.
        tol: {"cost": .., "grad": ..} bounds of |got - want| / (1 + |want|).
        row_cfg: (team, block, unroll) forced on the CUDA row kernels (None: the
            launch layer's choice, tiny in the simulator).
        gpu_layout: force the layout a GPU would use for this V (also in the
            simulator: its team of up to 512 threads and 8 loads per chunk).
    """

    name: str
    tdt: bool = False
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

    @property
    def expects_nan(self) -> bool:
        return self.special.startswith("nan") or self.special == "posinf"


def _tdt_case(name, **kw) -> KernelCase:
    """A TDT case; its defaults: V = 5 token logits, durations (0, 1, 2)."""
    kw.setdefault("V", 5)
    kw.setdefault("durations", (0, 1, 2))
    return KernelCase(name, tdt=True, **kw)


F32_TOL = dict(cost=1e-5, grad=1e-5)
# half-precision logits: the costs are float32 sums, the gradient is stored in half
F16_TOL = dict(cost=1e-5, grad=1e-3)
BF16_TOL = dict(cost=1e-5, grad=5e-3)

MULTIBLANK_CASES = [
    KernelCase("rnnt_n0_full", B=2, T=5, U=3, V=5, blank=0),
    KernelCase("rnnt_n0_blank_last", B=2, T=4, U=3, V=5, blank=4, label_lens=[2, 1]),
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase("n0_fastemit", B=2, T=4, U=3, V=5, blank=0, fastemit_lambda=0.01),
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
        "all_T_zero", B=2, T=0, U=3, V=5, blank=1, durations=(2,), label_lens=[0, 1]
    ),
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase("no_grad", B=2, T=5, U=3, V=6, blank=3, durations=(2,), need_grad=False),
    KernelCase(
        "masked_neginf",
        B=2,
        T=5,
        U=3,
        V=6,
        blank=3,
        durations=(2,),
        special="neginf",
    ),
    KernelCase("nan_logit", B=2, T=4, U=3, V=5, blank=2, durations=(2,), special="nan"),
    KernelCase(
        "posinf_logit", B=2, T=4, U=3, V=5, blank=2, durations=(2,), special="posinf"
    ),
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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
    KernelCase(
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


TDT_CASES = [
    _tdt_case(
        "tdt_d012_blank_last",
        blank=4,
        sigma=0.05,
        act_lens=[5, 4],
        label_lens=[2, 1],
    ),
    _tdt_case(
        "tdt_d021_unsorted", blank=0, durations=(0, 2, 1), act_lens=[5, 3], seed=1
    ),
    _tdt_case(
        "tdt_d23_no_one_impossible",
        B=3,
        T=6,
        blank=2,
        durations=(2, 3),
        act_lens=[6, 1, 5],
        label_lens=[2, 0, 1],
        seed=2,
    ),
    _tdt_case(
        "tdt_d31_fastemit",
        T=6,
        U=4,
        blank=1,
        durations=(3, 1),
        fastemit_lambda=0.3,
        sigma=0.05,
        act_lens=[6, 4],
        label_lens=[3, 2],
        seed=3,
    ),
    _tdt_case("tdt_d1_clamp", blank=3, durations=(1,), clamp=0.05, seed=4),
    _tdt_case(
        "tdt_all_options_float32",
        B=3,
        T=7,
        U=4,
        V=6,
        blank=5,
        durations=(0, 1, 2, 3, 4),
        sigma=0.05,
        fastemit_lambda=0.2,
        clamp=0.1,
        act_lens=[7, 5, 3],
        label_lens=[3, 1, 2],
        dtype=torch.float32,
        weights=[0.5, 3.0, 1.0],
        tol=dict(cost=1e-5, grad=1e-5),
        seed=5,
    ),
    _tdt_case(
        "tdt_zero_length_utts",
        B=3,
        T=4,
        blank=1,
        act_lens=[0, 0, 4],
        label_lens=[0, 2, 1],
        seed=6,
    ),
    _tdt_case("tdt_all_T_zero", T=0, blank=1, label_lens=[0, 1]),
    _tdt_case(
        "tdt_no_labels",
        U=2,
        blank=2,
        durations=(2, 1),
        label_width=0,
        label_lens=[0, 0],
        seed=7,
    ),
    _tdt_case("tdt_no_grad", blank=3, need_grad=False, seed=8),
    _tdt_case("tdt_masked_neginf", V=6, blank=3, special="neginf", seed=9),
    _tdt_case("tdt_nan_token", blank=2, special="nan_token"),
    _tdt_case("tdt_nan_duration", blank=2, special="nan_duration"),
    _tdt_case("tdt_posinf", blank=2, special="posinf"),
    _tdt_case(
        "tdt_nan_dead_end",
        T=5,
        blank=2,
        durations=(2, 3),
        special="nan_dead_end",
        act_lens=[5, 5],
        label_lens=[1, 1],
    ),
    _tdt_case(
        "tdt_function_mean_volume",
        B=3,
        T=5,
        U=4,
        blank=3,
        durations=(1, 0, 2),
        act_lens=[5, 2, 4],
        label_lens=[3, 1, 0],
        reduction="mean_volume",
        clamp=0.2,
        sigma=0.05,
        via_function=True,
        seed=10,
    ),
    # a 64-thread team (shared-memory tree across warps), three chunks per thread
    _tdt_case(
        "tdt_xwarp_team64_3chunks",
        B=2,
        T=4,
        U=3,
        V=300,
        blank=7,
        durations=(0, 1, 2, 3, 4),
        sigma=0.05,
        act_lens=[4, 3],
        label_lens=[2, 1],
        row_cfg=(64, 64, 2),
        seed=11,
    ),
    # the layouts a GPU uses for V = 64 and V = 1000
    _tdt_case(
        "tdt_gpu_layout_V64_f32",
        B=3,
        T=4,
        U=3,
        V=64,
        blank=0,
        durations=(0, 1, 2, 3, 4),
        act_lens=[4, 3, 2],
        label_lens=[2, 1, 2],
        dtype=torch.float32,
        tol=F32_TOL,
        gpu_layout=True,
        seed=12,
    ),
    _tdt_case(
        "tdt_gpu_layout_V1000_f32",
        B=1,
        T=3,
        U=2,
        V=1000,
        blank=999,
        durations=(0, 1, 2, 3, 4),
        sigma=0.05,
        dtype=torch.float32,
        tol=F32_TOL,
        gpu_layout=True,
        seed=13,
    ),
    # half-precision logits read directly
    _tdt_case(
        "tdt_float16_clamp",
        blank=1,
        durations=(0, 2, 1),
        clamp=0.1,
        act_lens=[5, 4],
        label_lens=[2, 1],
        dtype=torch.float16,
        tol=F16_TOL,
        seed=14,
    ),
    _tdt_case(
        "tdt_function_bfloat16",
        B=3,
        T=5,
        U=3,
        blank=4,
        durations=(1, 2, 0),
        sigma=0.05,
        fastemit_lambda=0.1,
        reduction="mean",
        act_lens=[5, 4, 2],
        label_lens=[2, 1, 1],
        dtype=torch.bfloat16,
        tol=BF16_TOL,
        via_function=True,
        seed=15,
    ),
    # a long utterance in float32 against the float64 reference
    _tdt_case(
        "tdt_long_T1000_float32",
        B=2,
        T=1000,
        U=3,
        V=5,
        blank=2,
        durations=(0, 1, 2, 3, 4),
        sigma=0.05,
        act_lens=[1000, 700],
        label_lens=[2, 1],
        dtype=torch.float32,
        tol=dict(cost=1e-6, grad=1e-6),
        row_cfg=(1, 128, 4),
        seed=16,
    ),
]


CASES = MULTIBLANK_CASES + TDT_CASES


def case_options(case: KernelCase):
    if case.tdt:
        return make_tdt_options(
            case.blank,
            case.durations,
            case.reduction,
            case.sigma,
            0.0,
            case.fastemit_lambda,
            case.clamp,
        )
    return make_options(
        case.blank,
        case.durations,
        case.reduction,
        case.fastemit_lambda,
        case.clamp,
        case.sigma,
    )


def make_inputs(case: KernelCase, device="cpu"):
    """(acts, labels, act_lens, label_lens, opts) for ``case``, on ``device``.

    acts: (B, T, U, V') case.dtype (V' = V, or V + D for a TDT). labels:
    (B, label_width) int64 with non-blank ids (0 beyond label_lens, as the input
    checks leave them). Lengths: (B,) int64.
    """
    g = torch.Generator().manual_seed(case.seed)
    B, T, U, V = case.B, case.T, case.U, case.V
    opts = case_options(case)
    D = len(case.durations) if case.tdt else 0
    acts = torch.randn((B, T, U, V + D), generator=g, dtype=torch.float64) * 2.0
    blank_ids = (case.blank,) if case.tdt else opts.all_blank_ids
    tokens = [k for k in range(V) if k not in blank_ids]
    special = case.special
    if special == "neginf":
        # mask one label everywhere in utterance 0 and in most of utterance 1's rows
        acts[0, :, :, tokens[-1]] = -math.inf
        acts[1, :, 1:, tokens[-1]] = -math.inf
        tokens = tokens[:-1]
    elif special in ("nan", "nan_token"):
        acts[0, 0, 0, case.blank] = math.nan
    elif special == "posinf":
        if case.tdt:
            acts[0, 0, 1, V] = math.inf
        else:
            acts[0, 0, 0, case.blank] = math.inf
    elif special == "nan_duration":
        acts[0, 1, 1, V + 1] = math.nan
    elif special == "nan_dead_end":
        # durations (2, 3), T_b = 5: from frame 4 every step overshoots or lands on
        # T_b with labels left, so this row's value reaches no path
        acts[0, 4, 0, V] = math.nan
    width = U - 1 if case.label_width is None else case.label_width
    act_lens = torch.tensor(case.act_lens if case.act_lens else [T] * B)
    label_lens = torch.tensor(case.label_lens if case.label_lens else [width] * B)
    pick = torch.randint(0, len(tokens), (B, width), generator=g)
    labels = torch.tensor(tokens)[pick] if width > 0 else torch.zeros((B, 0))
    labels = labels.long()
    pos = torch.arange(width)[None, :]
    labels = torch.where(pos < label_lens[:, None], labels, torch.zeros_like(labels))
    return (
        acts.to(case.dtype).to(device),
        labels.to(device),
        act_lens.long().to(device),
        label_lens.long().to(device),
        opts,
    )


def reference(acts, labels, act_lens, label_lens, opts, weights, device="cpu"):
    """float64 oracle (on ``device``, CPU by default): CPU costs (B,), grads.

    grads[b] = clamp(d cost_b / d acts_b) * weights[b] (clamp only if opts.clamp > 0),
    0 for utterances with a non-finite cost.
    """
    reference_costs = family_of(opts).reference
    x = acts.detach().double().to(device).requires_grad_(True)
    labels, act_lens, label_lens = (
        labels.to(device),
        act_lens.to(device),
        label_lens.to(device),
    )
    costs = reference_costs(x, labels, act_lens, label_lens, opts, clamp=opts.clamp)
    finite = torch.isfinite(costs)
    grads = torch.zeros_like(x)
    if bool(finite.any()) and x.numel() > 0:
        (g,) = torch.autograd.grad(costs[finite].sum(), x, allow_unused=True)
        if g is not None:
            grads = g
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
def row_layout(case: KernelCase):
    """Force ``case.row_cfg`` (or the GPU layout for its V) on the CUDA launch
    layer."""
    if case.row_cfg is None and not case.gpu_layout:
        yield
        return
    from espnet_multiblank.loss.cuda import launch

    prev = launch.ROW_CONFIG_OVERRIDE
    launch.ROW_CONFIG_OVERRIDE = (
        launch.gpu_row_config(case.V) if case.gpu_layout else tuple(case.row_cfg)
    )
    try:
        yield
    finally:
        launch.ROW_CONFIG_OVERRIDE = prev


def cost_dtype(dtype):
    """The kernels' costs: float64 for float64 logits, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _weights(case, opts, label_lens, dtype, device):
    if case.weights is not None:
        return torch.tensor(case.weights, dtype=dtype, device=device)
    return reduction_weights(opts, label_lens, dtype)


def check_function(case, acts, labels, act_lens, label_lens, opts, compute, ref):
    """FusedTransducerFunction around ``compute``: loss, then backward with an
    incoming gradient of 0.7 (folded into the kernel), then a ``retain_graph``
    backward with 1.3 (a rescaled copy); ``ref`` = (reference loss, reference
    d loss / d acts for an incoming gradient of 1)."""
    want_loss, ref_g = ref
    tol_c = case.tol.get("cost", 1e-10)
    tol_g = case.tol.get("grad", 1e-10)
    x = acts.detach().clone().requires_grad_(True)
    loss = FusedTransducerFunction.apply(x, labels, act_lens, label_lens, opts, compute)
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


def run_kernel(case: KernelCase, device, compute):
    """(costs, grads) of the driver ``compute`` on ``case``'s inputs on ``device``."""
    acts, labels, act_lens, label_lens, opts = make_inputs(case, device)
    weights = _weights(case, opts, label_lens, cost_dtype(acts.dtype), device)
    with row_layout(case):
        return compute(
            acts, labels, act_lens, label_lens, opts, weights, case.need_grad
        )


def run_case(case: KernelCase, device, compute, keep=None, ref_device="cpu"):
    """Run ``case`` through the driver ``compute`` on ``device`` ("cpu" for the CPU
    drivers and the simulator, "cuda") and check it against the float64 reference
    (computed on ``ref_device``: the GPU for big cases).

    Raises AssertionError with a message on any mismatch; returns a short summary.
    ``keep`` (a dict), if given, receives the kernel's "costs" and "grads".
    """
    acts, labels, act_lens, label_lens, opts = make_inputs(case, device)
    B, T, U, _ = acts.shape
    wdtype = cost_dtype(acts.dtype)
    weights = _weights(case, opts, label_lens, wdtype, device)
    tol_c = case.tol.get("cost", 1e-10)
    tol_g = case.tol.get("grad", 1e-10)
    with row_layout(case):
        costs, grads = compute(
            acts, labels, act_lens, label_lens, opts, weights, case.need_grad
        )
    if keep is not None:
        keep["costs"], keep["grads"] = costs, grads
    if costs.shape != (B,) or costs.dtype != wdtype or costs.device != acts.device:
        raise AssertionError(f"costs: {costs.shape} {costs.dtype} {costs.device}")
    if case.expects_nan:
        if not bool(torch.isnan(costs[0])):
            raise AssertionError(f"{case.special}: cost[0] = {costs[0]}, want NaN")
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
    if T > 0:
        t = torch.arange(T, device=device)[None, :, None]
        u = torch.arange(U, device=device)[None, None, :]
        pad = (t >= act_lens[:, None, None]) | (u >= (label_lens + 1)[:, None, None])
        pad = pad | ~torch.isfinite(costs)[:, None, None]
        if bool((grads[pad] != 0).any()):
            raise AssertionError("non-zero gradient at padding / impossible utterance")
    if case.via_function:
        # d loss / d acts for an incoming gradient of 1: the reduction's weights
        w = reduction_weights(opts, label_lens.cpu(), torch.float64)
        ref_fn = reference(acts, labels, act_lens, label_lens, opts, w, ref_device)[1]
        with row_layout(case):
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


def compare_with_kernel(case: KernelCase, costs, grads, other_compute):
    """(costs, grads) of one driver against another driver's (the CPU kernels) on
    the same values, on the CPU."""
    acts, labels, act_lens, label_lens, opts = make_inputs(case, "cpu")
    if acts.dtype in (torch.float16, torch.bfloat16):
        acts = acts.float()  # the same values; the CPU kernel computes in float32
    weights = _weights(case, opts, label_lens, acts.dtype, "cpu")
    c2, g2 = other_compute(
        acts, labels, act_lens, label_lens, opts, weights, case.need_grad
    )
    if case.expects_nan:
        if not bool(torch.isnan(c2[0])):
            raise AssertionError(f"NaN handling differs: {costs} vs {c2}")
        return "both NaN"
    tol = max(case.tol.get("cost", 1e-10), 1e-9)
    _close("costs vs the other kernel", costs, c2, tol)
    if case.need_grad:
        _close(
            "grads vs the other kernel",
            grads,
            g2,
            max(case.tol.get("grad", 1e-10), 1e-9),
        )
    return "matches the other kernel"
