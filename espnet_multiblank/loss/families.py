"""One record per lattice family: the only place where the losses differ.

The loss path (:func:`espnet_multiblank.loss.api.transducer_loss`), the input checks
(``validation.py``), the autograd Function (``function.py``) and the stages
(``stages.py``) are written once; what depends on the lattice comes from the
:class:`LatticeFamily` of the options (:func:`family_of`):

==========  ================================  ======================  ===============
family      options (lattice)                 logits                  reference
==========  ================================  ======================  ===============
multiblank  ``LossOptions`` (standard RNN-T   (B, T, U, V)            reference_costs
            when it has no big blanks)
tdt         ``TDTOptions``                    (B, T, U, V + D)        tdt_reference_
                                                                      costs
==========  ================================  ======================  ===============

The kernels (CPU: ``cpu/kernels.py`` and ``cpu/tdt_kernels.py``; CUDA: ``cuda/``)
stay separate where the math differs; their drivers are instances of one class per
device, loaded on first use so that importing the package compiles and imports
nothing of Numba.
"""

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch

from espnet_multiblank.loss.options import (
    LossOptions,
    TDTOptions,
    make_options,
    make_tdt_options,
)
from espnet_multiblank.loss.reference import reference_costs, tdt_reference_costs
from espnet_multiblank.loss.validation import LabelRule


def _cpu_multiblank():
    from espnet_multiblank.loss import cpu

    return cpu.compute


def _cpu_tdt():
    from espnet_multiblank.loss import cpu

    return cpu.tdt_compute


def _cuda_multiblank():
    from espnet_multiblank.loss import cuda

    return cuda.compute


def _cuda_tdt():
    from espnet_multiblank.loss import cuda

    return cuda.tdt_compute


# label rules are built per call of a loss: cached by the (hashable) options and the
# row width, so that a training step does not re-format their messages
_cached = functools.lru_cache(maxsize=256)


@_cached
def _multiblank_labels(opts: LossOptions, width: int) -> LabelRule:
    if width < 1:
        raise ValueError(f"acts.shape[3] (vocabulary size V) must be >= 1, got {width}")
    opts.lattice.check_vocab_size(width, "acts.shape[3]")
    return LabelRule(
        num_labels=width,
        blank_ids=opts.all_blank_ids,
        vocab_text=f"V = {width}",
        blank_text=(
            f"standard blank {opts.blank}, big blanks {list(opts.big_blank_ids)}"
        ),
    )


@_cached
def _tdt_labels(opts: TDTOptions, width: int) -> LabelRule:
    opts.lattice.check_vocab_size(width, "acts.shape[3]")
    V = width - opts.num_durations
    return LabelRule(
        num_labels=V,
        blank_ids=(opts.blank,),
        vocab_text=f"V = acts.shape[3] - len(durations) = {V}",
        blank_text=f"blank {opts.blank}",
    )


def _multiblank_parts(opts: LossOptions, width: int) -> Tuple[Tuple[int, int], ...]:
    return ((0, width),)


def _tdt_parts(opts: TDTOptions, width: int) -> Tuple[Tuple[int, int], ...]:
    V = width - opts.num_durations
    return ((0, V), (V, width))


def _tdt_rnnt_branch(opts: TDTOptions) -> Optional[LossOptions]:
    """omega's draw: the standard RNN-T options to use on the token logits instead
    (one ``torch.rand(())`` of torch's default CPU generator per call, only when
    omega > 0), or None (the TDT loss)."""
    if opts.omega > 0.0 and float(torch.rand(())) < opts.omega:
        return make_options(
            opts.blank, (), opts.reduction, opts.fastemit_lambda, opts.clamp, 0.0
        )
    return None


@dataclass(frozen=True)
class LatticeFamily:
    """What one lattice family brings to the shared loss path.

    Attributes:
        kind: the lattice's ``kind`` (``"multiblank"`` or ``"tdt"``).
        title: how messages and reprs name the loss.
        options_type: the frozen options class; ``make_options`` validates user
            arguments into it.
        acts_what: what ``acts`` must be, for the messages.
        label_rule: ``(opts, acts.shape[3]) -> LabelRule``: checks the row width
            against the options (ValueError naming ``acts.shape[3]`` or ``blank``)
            and says which label ids are valid.
        softmax_parts: ``(opts, width) -> ((lo, hi), ...)``: the ranges of a row that
            have their own softmax (a range of only -inf has no distribution).
        reference: the PyTorch costs ``(acts, labels, act_lens, label_lens, opts,
            clamp=0.0) -> (B,)`` (the torch backend; the tests' oracle).
        cpu_driver, cuda_driver: return the Numba kernel driver of that device
            (imported on first use).
        rnnt_branch: ``opts -> LossOptions or None``: when it returns options, the
            call computes the standard RNN-T loss on the first V logits with them
            instead (TDT's omega), else None.
    """

    kind: str
    title: str
    options_type: type
    make_options: Callable
    acts_what: str
    label_rule: Callable[..., LabelRule]
    softmax_parts: Callable[..., Sequence[Tuple[int, int]]]
    reference: Callable[..., torch.Tensor]
    cpu_driver: Callable
    cuda_driver: Callable
    rnnt_branch: Callable[..., Optional[LossOptions]] = lambda opts: None

    def kernel(self, device: torch.device):
        """The Numba kernel driver for tensors on ``device``, or None when Numba
        cannot target it."""
        if device.type == "cpu":
            return self.cpu_driver()
        if device.type == "cuda":
            return self.cuda_driver()
        return None


MULTIBLANK = LatticeFamily(
    kind="multiblank",
    title="multi-blank RNN-T",
    options_type=LossOptions,
    make_options=make_options,
    acts_what="raw logits of shape (B, T, U, V)",
    label_rule=_multiblank_labels,
    softmax_parts=_multiblank_parts,
    reference=reference_costs,
    cpu_driver=_cpu_multiblank,
    cuda_driver=_cuda_multiblank,
)

TDT = LatticeFamily(
    kind="tdt",
    title="TDT",
    options_type=TDTOptions,
    make_options=make_tdt_options,
    acts_what="raw logits of shape (B, T, U, V + len(durations))",
    label_rule=_tdt_labels,
    softmax_parts=_tdt_parts,
    reference=tdt_reference_costs,
    cpu_driver=_cpu_tdt,
    cuda_driver=_cuda_tdt,
    rnnt_branch=_tdt_rnnt_branch,
)

_BY_KIND = {f.kind: f for f in (MULTIBLANK, TDT)}


def family_of(opts) -> LatticeFamily:
    """The family of validated loss options (by their lattice's kind)."""
    try:
        return _BY_KIND[opts.lattice.kind]
    except (AttributeError, KeyError):
        raise TypeError(
            "opts must be the validated options of a loss (make_options or "
            f"make_tdt_options), got {type(opts).__name__}"
        ) from None
