"""One record per lattice family: the only place where the losses differ.

The dense loss path (:func:`espnet_multiblank.loss.api.transducer_loss`), the fused
joint + loss (``espnet_multiblank.fused``), the input checks (``validation.py``), the
autograd Function (``function.py``) and the stages (``stages.py``) are written once;
what depends on the lattice comes from the :class:`LatticeFamily` of the options
(:func:`family_of`):

==========  ================================  ======================  ===============
family      options (lattice)                 logits                  reference
==========  ================================  ======================  ===============
multiblank  ``LossOptions`` (standard RNN-T   (B, T, U, V)            reference_costs
            when it has no big blanks)
tdt         ``TDTOptions``                    (B, T, U, V + D)        tdt_reference_
                                                                      costs
==========  ================================  ======================  ===============

A record brings the options, the label rule, the layout of the rows that pass
between the stages (``rows.py``, the same on every device), the lattice runners
(Numba CPU, Numba CUDA, PyTorch) and TDT's omega draw. The kernels (CPU:
``cpu/kernels.py`` and ``cpu/tdt_kernels.py``; CUDA: ``cuda/``) stay separate where
the math differs; their drivers are instances of one class per device, loaded on first
use so that importing the package compiles and imports nothing of Numba.
"""

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from espnet_multiblank.loss.label_rules import DENSE_NAMES, ArgNames, LabelRule
from espnet_multiblank.loss.options import (
    LossOptions,
    TDTOptions,
    make_options,
    make_tdt_options,
)
from espnet_multiblank.loss.reference import (
    multiblank_rows_log_likelihood,
    reference_costs,
    rows_lattice,
    tdt_reference_costs,
    tdt_rows_log_likelihood,
)
from espnet_multiblank.loss.rows import RowsLayout, multiblank_rows, tdt_rows


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


# label rules are built per call of a loss: cached by the (hashable) options, the
# row width and the names, so that a training step does not re-format their messages
_cached = functools.lru_cache(maxsize=256)


@_cached
def _multiblank_labels(
    opts: LossOptions, width: int, names: ArgNames = DENSE_NAMES
) -> LabelRule:
    if width < 1:
        raise ValueError(f"{names.width} (vocabulary size V) must be >= 1, got {width}")
    opts.lattice.check_vocab_size(width, names.width)
    return LabelRule(
        num_labels=width,
        blank_ids=opts.all_blank_ids,
        vocab_text=f"V = {names.width} = {width}",
        blank_text=(
            f"standard blank {opts.blank}, big blanks {list(opts.big_blank_ids)}"
        ),
    )


@_cached
def _tdt_labels(
    opts: TDTOptions, width: int, names: ArgNames = DENSE_NAMES
) -> LabelRule:
    opts.lattice.check_vocab_size(width, names.width)
    V = width - opts.num_durations
    return LabelRule(
        num_labels=V,
        blank_ids=(opts.blank,),
        vocab_text=f"V = {names.width} - {names.durations} = {V}",
        blank_text=f"blank {opts.blank}",
    )


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
    """What one lattice family brings to the shared loss paths.

    Attributes:
        kind: the lattice's ``kind`` (``"multiblank"`` or ``"tdt"``).
        title: how messages and reprs name the loss.
        options_type: the frozen options class; ``make_options`` validates user
            arguments into it.
        acts_what: what ``acts`` must be, for the messages.
        label_rule: ``(opts, width, names=DENSE_NAMES) -> LabelRule``: checks the
            width V' of a row of logits against the options (ValueError naming
            ``names.width`` or ``blank``) and says which label ids are valid.
        layout: ``opts -> RowsLayout``: the rows the stages pass between them
            (``espnet_multiblank.loss.rows``), on every device.
        reference: the PyTorch costs ``(acts, labels, act_lens, label_lens, opts,
            clamp=0.0) -> (B,)`` (the torch backend; the tests' oracle).
        rows_log_likelihood: ``(opts, steps, act_lens, label_lens) -> (B,) log P``
            of the PyTorch recursion on the occupancy slots ``steps`` (B, T, U,
            num_steps) of rows (the torch lattice runner, :meth:`torch_lattice`).
        cpu_driver, cuda_driver: return the Numba kernel driver of that device
            (imported on first use); each runs the dense loss and the lattice stage.
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
    layout: Callable[..., RowsLayout]
    reference: Callable[..., torch.Tensor]
    rows_log_likelihood: Callable[..., torch.Tensor]
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

    def torch_lattice(self, opts, rows, act_lens, label_lens, need_grad):
        """The lattice stage in PyTorch on rows of any device (the contract of
        ``rows.py``), occupancies by autograd: ``-> log_p`` (B,) float64."""
        return rows_lattice(
            self.layout(opts),
            rows,
            act_lens,
            label_lens,
            need_grad,
            functools.partial(self.rows_log_likelihood, opts),
            opts.fastemit_lambda,
        )


MULTIBLANK = LatticeFamily(
    kind="multiblank",
    title="multi-blank RNN-T",
    options_type=LossOptions,
    make_options=make_options,
    acts_what="raw logits of shape (B, T, U, V)",
    label_rule=_multiblank_labels,
    layout=multiblank_rows,
    reference=reference_costs,
    rows_log_likelihood=multiblank_rows_log_likelihood,
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
    layout=tdt_rows,
    reference=tdt_reference_costs,
    rows_log_likelihood=tdt_rows_log_likelihood,
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
