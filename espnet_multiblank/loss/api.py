"""Public API of the multi-blank RNN-T loss (ESPnet-compatible names and signatures)."""

from typing import Optional, Sequence

import torch

from espnet_multiblank.loss.dispatch import (  # noqa: F401  (BACKENDS re-exported)
    BACKENDS,
    check_backend,
    dispatch_loss,
    valid_nodes,
)
from espnet_multiblank.loss.options import LossOptions, make_options
from espnet_multiblank.loss.reference import reference_costs
from espnet_multiblank.loss.validation import validate_inputs


def _fused_kernel(device: torch.device):
    """The Numba kernel for ``device``, or None when Numba cannot target it."""
    if device.type == "cpu":
        from espnet_multiblank.loss.cpu import compute

        return compute
    if device.type == "cuda":
        from espnet_multiblank.loss.cuda import compute

        return compute
    return None


def _check_valid_rows(acts, act_lens, label_lens) -> None:
    """Raise ValueError, as the fused kernels do, when a valid row (t < T_b,
    u <= L_b) of ``acts`` (B, T, U, V) holds NaN or +inf or is -inf throughout (no
    distribution); padding rows are not looked at."""
    with torch.no_grad():
        bad = (
            torch.isnan(acts).any(-1)
            | (acts == float("inf")).any(-1)
            | (acts == float("-inf")).all(-1)
        ) & valid_nodes(acts, act_lens, label_lens)
        rows = bad.flatten(1).any(1).nonzero()
    if rows.numel():
        raise ValueError(
            "acts must be finite logits (-inf allowed for masked symbols); "
            f"utterance {int(rows[0])} contains NaN, +inf or a row that is -inf "
            "throughout"
        )


def _loss(acts, labels, act_lens, label_lens, opts: LossOptions, backend: str):
    check_backend(backend)
    labels, act_lens, label_lens = validate_inputs(
        acts, labels, act_lens, label_lens, opts
    )
    return dispatch_loss(
        acts,
        labels,
        act_lens,
        label_lens,
        opts,
        backend,
        kernel=_fused_kernel(acts.device),
        reference=reference_costs,
        check_reference_input=_check_valid_rows,
    )


def multiblank_rnnt_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int,
    big_blank_durations: Sequence[int] = (),
    reduction: str = "mean",
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
    sigma: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Multi-blank RNN-T loss (Xu et al., ICASSP 2023);
    standard RNN-T when no big blanks.

    Args:
        acts: (B, T, U, V) RAW joint-network logits (the log-softmax is applied inside),
            float32 / float64 (computed natively) or float16 / bfloat16 (computed in
            float32; the gradient comes back in the input dtype). Any strides.
        labels: (B, U - 1) (or wider) integer label ids; positions >= label_lens[b] are
            padding and ignored.
        act_lens: (B,) int32/int64 number of valid frames T_b <= T.
        label_lens: (B,) int32/int64 number of labels L_b <= U - 1.
        blank: index of the standard blank.
        big_blank_durations: durations d_i >= 2 (distinct); big blank i is index
            ``blank - 1 - i``. Empty = standard RNN-T.
        reduction: "none" -> (B,) costs; "sum"; "mean" = sum / B (ESPnet);
            "mean_volume" = mean over b of cost_b / max(L_b, 1) (NeMo's "mean").
        fastemit_lambda: FastEmit weight (>= 0); the cost becomes -(1 + lambda) log P.
        clamp: > 0 clips each element of d cost_b / d acts_b to [-clamp, clamp];
            0 = off.
        sigma: logit under-normalisation (>= 0; the paper recommends 0.05 for training).
        backend: "auto" (Numba kernels on cpu/cuda, PyTorch elsewhere), "numba",
            "torch".

    Returns:
        The reduced loss (scalar) or (B,) costs for reduction="none", float32 (float64
        for float64 acts). An utterance with no frames and no labels costs 0; one with
        no frames but labels is impossible and costs +inf with zero gradient.

    Raises:
        TypeError / ValueError naming the offending argument for malformed input.
    """
    opts = make_options(
        blank, big_blank_durations, reduction, fastemit_lambda, clamp, sigma
    )
    return _loss(acts, labels, act_lens, label_lens, opts, backend)


def rnnt_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int = 0,
    reduction: str = "mean",
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Standard RNN-T loss (Graves 2012):
    :func:`multiblank_rnnt_loss` with no big blanks."""
    return multiblank_rnnt_loss(
        acts,
        labels,
        act_lens,
        label_lens,
        blank,
        (),
        reduction,
        fastemit_lambda,
        clamp,
        0.0,
        backend,
    )


class MultiblankRNNTLoss(torch.nn.Module):
    """Module form of :func:`multiblank_rnnt_loss`;
    forward(acts, labels, act_lens, label_lens).

    The constructor validates its arguments itself (TypeError / ValueError naming the
    argument) instead of using typeguard, whose TypeCheckError is not a TypeError.
    """

    def __init__(
        self,
        blank: int,
        big_blank_durations: Sequence[int] = (),
        reduction: str = "mean",
        fastemit_lambda: float = 0.0,
        clamp: float = 0.0,
        sigma: float = 0.0,
        backend: str = "auto",
    ):
        super().__init__()
        self.opts = make_options(
            blank, big_blank_durations, reduction, fastemit_lambda, clamp, sigma
        )
        check_backend(backend)
        self.backend = backend

    @property
    def blank(self) -> int:
        return self.opts.blank

    @property
    def big_blank_durations(self):
        return self.opts.big_blank_durations

    def extra_repr(self) -> str:
        o = self.opts
        return (
            f"blank={o.blank}, big_blank_durations={list(o.big_blank_durations)}, "
            f"reduction={o.reduction!r}, fastemit_lambda={o.fastemit_lambda}, "
            f"clamp={o.clamp}, sigma={o.sigma}, backend={self.backend!r}"
        )

    def forward(self, acts, labels, act_lens, label_lens) -> torch.Tensor:
        return _loss(acts, labels, act_lens, label_lens, self.opts, self.backend)


class MultiblankRNNTLossNumba(MultiblankRNNTLoss):
    """Drop-in replacement for ESPnet's / NeMo's ``MultiblankRNNTLossNumba``.

    Same constructor as ESPnet's: ``clamp=-1`` (any negative value) means "off", and
    ``reduction`` defaults to "mean" (sum / B). Runs on CPU and CUDA.
    """

    def __init__(
        self,
        blank: int,
        big_blank_durations: Sequence[int],
        reduction: str = "mean",
        fastemit_lambda: float = 0.0,
        clamp: float = -1,
        sigma: float = 0.0,
        backend: Optional[str] = None,
    ):
        super().__init__(
            blank,
            big_blank_durations,
            reduction,
            fastemit_lambda,
            clamp=0.0 if clamp < 0 else float(clamp),
            sigma=sigma,
            backend=backend or "auto",
        )
