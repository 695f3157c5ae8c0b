"""Public API of the losses: one loss path behind every function and module.

:func:`multiblank_rnnt_loss` (ESPnet's functional signature plus ``sigma``),
:func:`rnnt_loss`, :func:`tdt_loss` and the modules :class:`MultiblankRNNTLoss`,
:class:`MultiblankRNNTLossNumba` (the drop-in for ESPnet's class) and
:class:`TDTLoss` only build validated options; :func:`transducer_loss` does the rest
for either lattice family (``espnet_multiblank.loss.families``): input checks, TDT's
omega draw, the backend, the reduction.

Definitions, recursions, gradients and conventions: ``docs/lattice.md``.
"""

import dataclasses
from typing import Optional, Sequence

import torch

from espnet_multiblank.loss.batch import LossBatch
from espnet_multiblank.loss.dispatch import (  # noqa: F401  (BACKENDS re-exported)
    BACKENDS,
    check_backend,
    dispatch_loss,
)
from espnet_multiblank.loss.families import family_of
from espnet_multiblank.loss.options import make_options, make_tdt_options
from espnet_multiblank.loss.validation import check_valid_rows, validate_inputs


def transducer_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    opts,
    backend: str = "auto",
) -> torch.Tensor:
    """The loss of validated options ``opts`` of either family (the one path behind
    the public functions and modules; arguments and result as theirs)."""
    family = family_of(opts)
    check_backend(backend)
    batch = LossBatch(
        acts, *validate_inputs(acts, labels, act_lens, label_lens, opts, family)
    )
    rnnt_opts = family.rnnt_branch(opts)
    if rnnt_opts is not None:
        # omega's branch: the standard RNN-T loss on the token logits; the duration
        # logits are not read, but a bad joint output must not pass silently here
        # either, and they get an exactly zero gradient (autograd of the slice)
        check_valid_rows(acts, batch.act_lens, batch.label_lens)
        V = family.layout(opts).num_tokens(acts.shape[3])
        batch = batch._replace(acts=acts[..., :V])
        opts, family = rnnt_opts, family_of(rnnt_opts)
    return dispatch_loss(batch, opts, family, backend)


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
    *,
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
        reduction: "none" -> (B,) costs; "sum"; "mean" = sum / B (ESPnet's);
            "mean_batch" = sum / B (NeMo's); "mean_volume" = sum of costs / sum of
            L_b (NeMo's); "mean_label_normalized" = mean over b of cost_b /
            max(L_b, 1) (NeMo's "mean"). See ``espnet_multiblank.loss.reductions``.
        fastemit_lambda: FastEmit weight (>= 0); the cost becomes -(1 + lambda) log P.
        clamp: > 0 clips each element of d cost_b / d acts_b to [-clamp, clamp];
            0 = off.
        sigma: logit under-normalisation (>= 0; the paper recommends 0.05 for training).
        backend: keyword-only: "auto" (Numba kernels on cpu/cuda, PyTorch elsewhere),
            "numba", "torch".

    The positional order up to ``sigma`` is ESPnet's (``blank, big_blank_durations,
    reduction, fastemit_lambda, clamp, sigma``).

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
    return transducer_loss(acts, labels, act_lens, label_lens, opts, backend)


def rnnt_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int = 0,
    *,
    reduction: str = "mean",
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Standard RNN-T loss (Graves 2012): :func:`multiblank_rnnt_loss` with no big
    blanks (and no sigma); the options after ``blank`` are keyword-only."""
    opts = make_options(blank, (), reduction, fastemit_lambda, clamp, 0.0)
    return transducer_loss(acts, labels, act_lens, label_lens, opts, backend)


def tdt_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int,
    durations: Sequence[int],
    *,
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

    Keyword-only options:
        reduction: as for :func:`multiblank_rnnt_loss` ("mean" = sum / B, the
            "mean" of NeMo's Numba TDT loss; "mean_volume" = sum of costs / sum of
            L_b).
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
    return transducer_loss(acts, labels, act_lens, label_lens, opts, backend)


class _TransducerLossModule(torch.nn.Module):
    """A loss module: validated options and a backend, forward(acts, labels,
    act_lens, label_lens) through :func:`transducer_loss`.

    The constructors validate their arguments themselves (TypeError / ValueError
    naming the argument) instead of using typeguard, whose TypeCheckError is not a
    TypeError.
    """

    def __init__(self, opts, backend: str):
        super().__init__()
        check_backend(backend)
        self.opts = opts
        self.backend = backend

    @property
    def blank(self) -> int:
        return self.opts.blank

    def extra_repr(self) -> str:
        shown = []
        for field in dataclasses.fields(self.opts):
            v = getattr(self.opts, field.name)
            shown.append(f"{field.name}={list(v) if isinstance(v, tuple) else v!r}")
        return ", ".join(shown + [f"backend={self.backend!r}"])

    def forward(self, acts, labels, act_lens, label_lens) -> torch.Tensor:
        return transducer_loss(
            acts, labels, act_lens, label_lens, self.opts, self.backend
        )


class MultiblankRNNTLoss(_TransducerLossModule):
    """Module form of :func:`multiblank_rnnt_loss`;
    forward(acts, labels, act_lens, label_lens)."""

    def __init__(
        self,
        blank: int,
        big_blank_durations: Sequence[int] = (),
        reduction: str = "mean",
        fastemit_lambda: float = 0.0,
        clamp: float = 0.0,
        sigma: float = 0.0,
        *,
        backend: str = "auto",
    ):
        opts = make_options(
            blank, big_blank_durations, reduction, fastemit_lambda, clamp, sigma
        )
        super().__init__(opts, backend)

    @property
    def big_blank_durations(self):
        return self.opts.big_blank_durations


class MultiblankRNNTLossNumba(MultiblankRNNTLoss):
    """Drop-in replacement for ESPnet's / NeMo's ``MultiblankRNNTLossNumba``.

    Same constructor as ESPnet's (positional ``blank, big_blank_durations,
    reduction, fastemit_lambda, clamp, sigma``): ``clamp=-1`` (any negative value)
    means "off", and ``reduction`` defaults to "mean" (sum / B). As ESPnet's class, it
    returns a reduced loss as a 1-element vector (shape (1,)), the costs for "none"
    as a (B,) vector. Runs on CPU and CUDA; ``backend`` (keyword-only, None =
    "auto") is this package's addition.
    """

    def __init__(
        self,
        blank: int,
        big_blank_durations: Sequence[int],
        reduction: str = "mean",
        fastemit_lambda: float = 0.0,
        clamp: float = -1,
        sigma: float = 0.0,
        *,
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

    def forward(self, acts, labels, act_lens, label_lens) -> torch.Tensor:
        loss = super().forward(acts, labels, act_lens, label_lens)
        return loss if self.opts.reduction == "none" else loss.reshape(1)


class TDTLoss(_TransducerLossModule):
    """Module form of :func:`tdt_loss`; forward(acts, labels, act_lens, label_lens).

    ``omega`` is drawn at every forward call, in training and evaluation mode alike
    (as NeMo does): pass omega=0 for a deterministic validation loss.
    """

    def __init__(
        self,
        blank: int,
        durations: Sequence[int],
        *,
        reduction: str = "mean",
        sigma: float = 0.0,
        omega: float = 0.0,
        fastemit_lambda: float = 0.0,
        clamp: float = 0.0,
        backend: str = "auto",
    ):
        opts = make_tdt_options(
            blank, durations, reduction, sigma, omega, fastemit_lambda, clamp
        )
        super().__init__(opts, backend)

    @property
    def durations(self):
        return self.opts.durations
