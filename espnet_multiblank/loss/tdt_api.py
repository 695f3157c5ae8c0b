"""Public API of the TDT (token-and-duration transducer) loss.

Definition, recursions, gradient and conventions: ``docs/lattice.md`` section 3.
"""

from typing import Sequence

import torch

from espnet_multiblank.loss.api import multiblank_rnnt_loss
from espnet_multiblank.loss.dispatch import check_backend, dispatch_loss, valid_nodes
from espnet_multiblank.loss.tdt_options import TDTOptions, make_tdt_options
from espnet_multiblank.loss.tdt_reference import tdt_reference_costs
from espnet_multiblank.loss.tdt_validation import validate_tdt_inputs


def _fused_tdt_kernel(device: torch.device):
    """The Numba TDT kernel for ``device``, or None when Numba cannot target it."""
    if device.type == "cpu":
        from espnet_multiblank.loss.cpu.tdt_driver import tdt_compute

        return tdt_compute
    if device.type == "cuda":
        from espnet_multiblank.loss.cuda import tdt_compute

        return tdt_compute
    return None


def _raise_on_nan(costs: torch.Tensor) -> None:
    nan = torch.isnan(costs)
    if bool(nan.any()):
        b = int(nan.nonzero()[0])
        raise ValueError(
            "acts must be finite logits (-inf allowed for masked symbols); "
            f"utterance {b} contains NaN or +inf"
        )


def _check_finite_logits(acts, act_lens, label_lens) -> None:
    """NaN / +inf logits in the valid rows raise ValueError. Used on omega's RNN-T
    branch, whose backends do not all check, and which does not read the duration
    logits (a bad joint output must not pass silently there either)."""
    if acts.shape[0] == 0 or acts.shape[1] == 0:
        return
    x = acts.detach()
    bad = (torch.isnan(x) | (x == float("inf"))).any(dim=-1) & valid_nodes(
        x, act_lens, label_lens
    )
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(
            "acts must be finite logits (-inf allowed for masked symbols); "
            f"utterance {b} contains NaN or +inf"
        )


def _plain_rnnt_branch(acts, labels, act_lens, label_lens, opts: TDTOptions, backend):
    """omega's branch: the standard RNN-T loss on the token logits ``acts[..., :V]``
    (no sigma; FastEmit, clamp and reduction as asked). The duration logits get an
    exactly zero gradient (autograd of the slice)."""
    V = acts.shape[3] - opts.num_durations
    _check_finite_logits(acts, act_lens, label_lens)
    return multiblank_rnnt_loss(
        acts[..., :V],
        labels,
        act_lens,
        label_lens,
        blank=opts.blank,
        big_blank_durations=(),
        reduction=opts.reduction,
        fastemit_lambda=opts.fastemit_lambda,
        clamp=opts.clamp,
        sigma=0.0,
        backend=backend,
    )


def _tdt_loss(acts, labels, act_lens, label_lens, opts: TDTOptions, backend: str):
    check_backend(backend)
    labels, act_lens, label_lens = validate_tdt_inputs(
        acts, labels, act_lens, label_lens, opts
    )
    # One draw of torch's default (CPU) generator per call, only when omega > 0.
    if opts.omega > 0.0 and float(torch.rand(())) < opts.omega:
        return _plain_rnnt_branch(acts, labels, act_lens, label_lens, opts, backend)
    return dispatch_loss(
        acts,
        labels,
        act_lens,
        label_lens,
        opts,
        backend,
        kernel=_fused_tdt_kernel(acts.device),
        reference=tdt_reference_costs,
        check_reference_costs=_raise_on_nan,
    )


def tdt_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int,
    durations: Sequence[int],
    reduction: str = "mean",
    sigma: float = 0.0,
    omega: float = 0.0,
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Token-and-duration transducer loss (Xu et al., ICML 2023), NeMo's conventions.

    Args:
        acts: (B, T, U, V + D) RAW joint-network logits: V token logits (the blank at
            ``blank``) then D = len(durations) duration logits. Each part gets its own
            log-softmax inside the kernel. float32 / float64 computed natively;
            float16 / bfloat16 computed in float32 (the gradient comes back in the
            input dtype). Any strides.
        labels: (B, U - 1) (or wider) int32/int64 token ids in [0, V), not the blank;
            positions >= label_lens[b] are padding and ignored.
        act_lens: (B,) int32/int64 frames T_b <= T.
        label_lens: (B,) int32/int64 labels L_b <= U - 1.
        blank: index of the blank among the V token logits (any index in [0, V)).
        durations: duration logit j means "covers durations[j] frames": distinct ints
            >= 0 in any order, at least one >= 1 (e.g. [0, 1, 2, 3, 4]). A blank takes
            only durations >= 1; a label any (0 keeps the frame).
        reduction: "none" -> (B,) costs; "sum"; "mean" = sum / B;
            "mean_volume" = mean over b of cost_b / max(L_b, 1).
        sigma: logit under-normalisation (>= 0; NeMo's TDT recipes use 0.05),
            subtracted from every token log-prob, never from the durations.
        omega: probability in [0, 1] that this call computes, for the whole batch, the
            plain RNN-T loss on the token logits instead (no sigma, zero gradient for
            the duration logits), as NeMo's TDT loss does. The draw is one
            ``torch.rand(())`` from torch's default CPU generator per call (only when
            omega > 0), so ``torch.manual_seed`` makes it reproducible.
        fastemit_lambda: FastEmit weight (>= 0) on the token logits, as in NeMo's TDT
            kernels: the cost becomes -(1 + lambda) log P, the label steps' token
            gradient is scaled by 1 + lambda, the duration gradient is that of -log P.
        clamp: > 0 clips each element of d cost_b / d acts_b (token AND duration
            logits; NeMo clips the token logits only) to [-clamp, clamp]; 0 = off.
        backend: "auto" (Numba kernels on cpu/cuda, PyTorch elsewhere), "numba",
            "torch" (the float64 oracle of the tests; slow).

    Returns:
        The reduced loss (scalar) or (B,) costs for reduction="none", float32 (float64
        for float64 acts). An utterance with no frames and no labels costs 0; one
        without any complete path (no frames but labels, or no sequence of durations
        that lands on T_b) costs +inf with an exactly zero gradient.

    Raises:
        TypeError / ValueError naming the offending argument for malformed input;
        ValueError for NaN or +inf logits in the valid rows (-inf is allowed).
    """
    opts = make_tdt_options(
        blank, durations, reduction, sigma, omega, fastemit_lambda, clamp
    )
    return _tdt_loss(acts, labels, act_lens, label_lens, opts, backend)


class TDTLoss(torch.nn.Module):
    """Module form of :func:`tdt_loss`; forward(acts, labels, act_lens, label_lens).

    The constructor validates its arguments (TypeError / ValueError naming the
    argument). ``omega`` is drawn at every forward call, in training and evaluation
    mode alike (as NeMo does): pass omega=0 for a deterministic validation loss.
    """

    def __init__(
        self,
        blank: int,
        durations: Sequence[int],
        reduction: str = "mean",
        sigma: float = 0.0,
        omega: float = 0.0,
        fastemit_lambda: float = 0.0,
        clamp: float = 0.0,
        backend: str = "auto",
    ):
        super().__init__()
        self.opts = make_tdt_options(
            blank, durations, reduction, sigma, omega, fastemit_lambda, clamp
        )
        check_backend(backend)
        self.backend = backend

    @property
    def blank(self) -> int:
        return self.opts.blank

    @property
    def durations(self):
        return self.opts.durations

    def extra_repr(self) -> str:
        o = self.opts
        return (
            f"blank={o.blank}, durations={list(o.durations)}, "
            f"reduction={o.reduction!r}, sigma={o.sigma}, omega={o.omega}, "
            f"fastemit_lambda={o.fastemit_lambda}, clamp={o.clamp}, "
            f"backend={self.backend!r}"
        )

    def forward(self, acts, labels, act_lens, label_lens) -> torch.Tensor:
        return _tdt_loss(acts, labels, act_lens, label_lens, self.opts, self.backend)
