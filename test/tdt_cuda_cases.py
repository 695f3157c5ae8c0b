"""TDT test cases of the CUDA kernels, shared by the simulator run and real GPUs.

Each case builds small random inputs, runs ``espnet_multiblank.loss.cuda.tdt_compute``
on a device (``cpu`` under ``NUMBA_ENABLE_CUDASIM=1``, ``cuda`` on a GPU) and compares
costs and gradients with the float64 PyTorch reference (``tdt_reference_costs`` +
autograd, the clamp through LogSoftmaxGradModification) and, optionally, with the CPU
Numba kernel. ``cuda_cases.py --sim`` runs them after the multi-blank cases, in the
same simulator subprocess (records named ``tdt_*``).
"""

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import torch
from cuda_cases import (
    BF16_TOL,
    F16_TOL,
    F32_TOL,
    _close,
    check_function,
    check_half_rounding,
    cost_dtype,
    row_layout,
)

from espnet_multiblank.loss.function import reduce_costs, reduction_weights
from espnet_multiblank.loss.tdt_options import TDTOptions, make_tdt_options
from espnet_multiblank.loss.tdt_reference import tdt_reference_costs


@dataclass
class TDTCase:
    """One TDT kernel test (V token logits, then len(durations) duration logits).

    ``special``: "nan_token", "nan_duration", "posinf" (utterance 0's cost must be
    NaN), "nan_dead_end" (a NaN duration logit in a row none of whose steps can reach
    the end: still NaN), "neginf" (a masked token), "" none. ``row_cfg`` and
    ``gpu_layout`` as in ``cuda_cases.Case`` (the GPU layout is that of V tokens).
    """

    name: str
    B: int = 2
    T: int = 5
    U: int = 3
    V: int = 5
    act_lens: Optional[Sequence[int]] = None
    label_lens: Optional[Sequence[int]] = None
    blank: int = 0
    durations: Tuple[int, ...] = (0, 1, 2)
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


TDT_CASES = [
    TDTCase(
        "tdt_d012_blank_last",
        blank=4,
        sigma=0.05,
        act_lens=[5, 4],
        label_lens=[2, 1],
    ),
    TDTCase("tdt_d021_unsorted", blank=0, durations=(0, 2, 1), act_lens=[5, 3], seed=1),
    TDTCase(
        "tdt_d23_no_one_impossible",
        B=3,
        T=6,
        blank=2,
        durations=(2, 3),
        act_lens=[6, 1, 5],
        label_lens=[2, 0, 1],
        seed=2,
    ),
    TDTCase(
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
    TDTCase("tdt_d1_clamp", blank=3, durations=(1,), clamp=0.05, seed=4),
    TDTCase(
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
    TDTCase(
        "tdt_zero_length_utts",
        B=3,
        T=4,
        blank=1,
        act_lens=[0, 0, 4],
        label_lens=[0, 2, 1],
        seed=6,
    ),
    TDTCase("tdt_all_T_zero", T=0, blank=1, label_lens=[0, 1]),
    TDTCase(
        "tdt_no_labels",
        U=2,
        blank=2,
        durations=(2, 1),
        label_width=0,
        label_lens=[0, 0],
        seed=7,
    ),
    TDTCase("tdt_no_grad", blank=3, need_grad=False, seed=8),
    TDTCase("tdt_masked_neginf", V=6, blank=3, special="neginf", seed=9),
    TDTCase("tdt_nan_token", blank=2, special="nan_token"),
    TDTCase("tdt_nan_duration", blank=2, special="nan_duration"),
    TDTCase("tdt_posinf", blank=2, special="posinf"),
    TDTCase(
        "tdt_nan_dead_end",
        T=5,
        blank=2,
        durations=(2, 3),
        special="nan_dead_end",
        act_lens=[5, 5],
        label_lens=[1, 1],
    ),
    TDTCase(
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
    TDTCase(
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
    TDTCase(
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
    TDTCase(
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
    TDTCase(
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
    TDTCase(
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
    TDTCase(
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


def make_tdt_inputs(case: TDTCase, device="cpu"):
    """(acts (B, T, U, V + D) case.dtype, labels (B, width) int64 with 0 padding,
    act_lens, label_lens (B,) int64, opts)."""
    g = torch.Generator().manual_seed(case.seed)
    B, T, U, V = case.B, case.T, case.U, case.V
    D = len(case.durations)
    opts = make_tdt_options(
        case.blank,
        case.durations,
        case.reduction,
        case.sigma,
        0.0,
        case.fastemit_lambda,
        case.clamp,
    )
    acts = torch.randn((B, T, U, V + D), generator=g, dtype=torch.float64) * 2.0
    tokens = [k for k in range(V) if k != case.blank]
    if case.special == "neginf":
        acts[0, :, :, tokens[-1]] = -math.inf
        acts[1, :, 1:, tokens[-1]] = -math.inf
        tokens = tokens[:-1]
    elif case.special == "nan_token":
        acts[0, 0, 0, case.blank] = math.nan
    elif case.special == "nan_duration":
        acts[0, 1, 1, V + 1] = math.nan
    elif case.special == "posinf":
        acts[0, 0, 1, V] = math.inf
    elif case.special == "nan_dead_end":
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


def tdt_reference(acts, labels, act_lens, label_lens, opts: TDTOptions, weights):
    """float64 oracle on the CPU: costs (B,), grads (B, T, U, V + D) (clamped, times
    weights; 0 for utterances with a non-finite cost)."""
    x = acts.detach().cpu().double().requires_grad_(True)
    costs = tdt_reference_costs(
        x, labels.cpu(), act_lens.cpu(), label_lens.cpu(), opts, clamp=opts.clamp
    )
    finite = torch.isfinite(costs)
    grads = torch.zeros_like(x)
    if bool(finite.any()) and x.numel() > 0:
        (g,) = torch.autograd.grad(costs[finite].sum(), x, allow_unused=True)
        if g is not None:
            grads = g
    grads = grads * weights.double().cpu().view(-1, 1, 1, 1)
    return costs.detach(), grads


def _weights(case, opts, label_lens, dtype, device):
    if case.weights is not None:
        return torch.tensor(case.weights, dtype=dtype, device=device)
    return reduction_weights(opts, label_lens, dtype)


def run_tdt_case(case: TDTCase, device="cpu", compute=None, keep=None):
    """Run ``case`` through ``compute`` (default: the CUDA TDT backend) and check it
    against the float64 reference. Raises AssertionError; returns a short summary."""
    if compute is None:
        from espnet_multiblank.loss.cuda import tdt_compute as compute
    acts, labels, act_lens, label_lens, opts = make_tdt_inputs(case, device)
    B, T, U, VD = acts.shape
    wdtype = cost_dtype(acts.dtype)
    weights = _weights(case, opts, label_lens, wdtype, device)
    tol_c = case.tol.get("cost", 1e-10)
    tol_g = case.tol.get("grad", 1e-10)
    with row_layout(case, case.V):
        costs, grads = compute(
            acts, labels, act_lens, label_lens, opts, weights, case.need_grad
        )
    if keep is not None:
        keep["costs"], keep["grads"] = costs, grads
    if costs.shape != (B,) or costs.dtype != wdtype or costs.device != acts.device:
        raise AssertionError(f"costs: {costs.shape} {costs.dtype} {costs.device}")
    if case.special.startswith("nan") or case.special == "posinf":
        if not bool(torch.isnan(costs[0])):
            raise AssertionError(f"{case.special}: cost[0] = {costs[0]}, want NaN")
        if not bool(torch.isfinite(costs[1:]).all()):
            raise AssertionError(f"other utterances must stay finite: {costs}")
        return "nan reported"
    if T == 0:
        ref_c = torch.where(label_lens.cpu() == 0, 0.0, math.inf).double()
        ref_g = torch.zeros(acts.shape, dtype=torch.float64)
    else:
        ref_c, ref_g = tdt_reference(acts, labels, act_lens, label_lens, opts, weights)
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
        w = reduction_weights(opts, label_lens.cpu(), torch.float64)
        ref_fn = tdt_reference(acts, labels, act_lens, label_lens, opts, w)[1]
        with row_layout(case, case.V):
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


def compare_tdt_with_cpu_kernel(case: TDTCase, costs, grads, cpu_compute):
    """The CUDA backend's (costs, grads) against the CPU Numba TDT kernel's."""
    acts, labels, act_lens, label_lens, opts = make_tdt_inputs(case, "cpu")
    if acts.dtype in (torch.float16, torch.bfloat16):
        acts = acts.float()  # the same values; the CPU kernel computes in float32
    weights = _weights(case, opts, label_lens, acts.dtype, "cpu")
    c2, g2 = cpu_compute(
        acts, labels, act_lens, label_lens, opts, weights, case.need_grad
    )
    if case.special.startswith("nan") or case.special == "posinf":
        if not bool(torch.isnan(c2[0])):
            raise AssertionError(f"NaN handling differs: {costs} vs cpu {c2}")
        return "both NaN"
    tol = max(case.tol.get("cost", 1e-10), 1e-9)
    _close("costs vs cpu kernel", costs, c2, tol)
    if case.need_grad:
        _close("grads vs cpu kernel", grads, g2, max(case.tol.get("grad", 1e-10), 1e-9))
    return "matches the cpu kernel"
