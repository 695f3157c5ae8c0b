"""Public API of the fused joint + transducer loss (``docs/fused.md``)."""

from dataclasses import dataclass
from numbers import Integral
from typing import Optional, Sequence

import torch

from espnet_multiblank.fused.activations import (
    ActivationArg,
    JointActivation,
    joint_activation,
)
from espnet_multiblank.fused.joint_loss import (
    FusedJointLossFunction,
    LossPlan,
    default_tile_bytes,
)
from espnet_multiblank.fused.loss_package import (
    FLOAT_DTYPES,
    FUSED_NAMES,
    check_backend,
    check_label_tensors,
    check_lengths_and_labels,
    check_probability,
    check_tensor,
    family_of,
    make_options,
    make_tdt_options,
    numba_kernel,
    reduce_costs,
)
from espnet_multiblank.fused.tile_backends import check_tile_backend, tile_ops_for
from espnet_multiblank.lattice import check_tdt_durations, lattice_from_config


@dataclass(frozen=True)
class FusedOptions:
    """Validated options of the fused loss.

    Attributes:
        loss: the dense loss's options (``LossOptions`` or, with TDT durations,
            ``TDTOptions``).
        activation: the joint's activation.
        tile_bytes: the tile size bound (None: the device's default).
        backend: "auto", "numba" or "torch" (the lattice's).
        tile_backend: "auto", "numba", "triton" or "torch" (the tile stages').
    """

    loss: object
    activation: JointActivation
    tile_bytes: Optional[int]
    backend: str
    tile_backend: str = "auto"


def make_fused_options(
    blank,
    big_blank_durations=(),
    tdt_durations=None,
    activation: ActivationArg = "tanh",
    reduction="mean",
    sigma=0.0,
    fastemit_lambda=0.0,
    clamp=0.0,
    omega=0.0,
    tile_bytes=None,
    backend="auto",
    tile_backend="auto",
) -> FusedOptions:
    """Validate the scalar options (TypeError / ValueError naming the argument); the
    loss options come from the dense losses' option makers."""
    if tdt_durations is not None:
        durations = check_tdt_durations(tdt_durations, "tdt_durations")
        lattice_from_config(blank, big_blank_durations, durations)  # both set?
        loss = make_tdt_options(
            blank, durations, reduction, sigma, omega, fastemit_lambda, clamp
        )
    else:
        if check_probability("omega", omega) > 0:
            raise ValueError(
                "omega (the probability of a plain RNN-T step) applies to a TDT only: "
                f"pass tdt_durations, or omega=0; got omega={omega}"
            )
        loss = make_options(
            blank, big_blank_durations, reduction, fastemit_lambda, clamp, sigma
        )
    if tile_bytes is not None:
        if isinstance(tile_bytes, bool) or not isinstance(tile_bytes, Integral):
            raise TypeError(
                "tile_bytes must be an int >= 1 (bytes) or None, got "
                f"{type(tile_bytes).__name__} ({tile_bytes!r})"
            )
        if tile_bytes < 1:
            raise ValueError(f"tile_bytes must be >= 1, got {tile_bytes}")
        tile_bytes = int(tile_bytes)
    check_backend(backend)
    check_tile_backend(tile_backend)
    return FusedOptions(
        loss, joint_activation(activation), tile_bytes, backend, tile_backend
    )


_ENC = "projected encoder output (B, T, J)"


def _check_float(name: str, x, ndim: int, what: str) -> None:
    check_tensor(name, x, ndim, FLOAT_DTYPES, what)


def _check_same(name: str, got: int, other: str, want: int) -> None:
    if got != want:
        raise ValueError(f"{name} must equal {other} = {want}, got {got}")


def validate_fused_inputs(enc, pred, weight, bias, labels, act_lens, label_lens, opts):
    """Shapes, dtypes and devices of the joint's tensors against each other, then the
    dense losses' checks of labels and lengths (the messages naming the fused
    arguments). Returns validated (labels, act_lens, label_lens) (int64, padding of
    labels replaced by 0)."""
    _check_float("enc", enc, 3, _ENC)
    _check_float("pred", pred, 3, "projected prediction-network output (B, U, J)")
    _check_float("weight", weight, 2, "the joint's output layer (V', J)")
    B, T, J = enc.shape
    _check_same("pred.shape[0]", pred.shape[0], "the batch size enc.shape[0]", B)
    _check_same("pred.shape[2]", pred.shape[2], "the joint width enc.shape[2]", J)
    U = pred.shape[1]
    if U < 1:
        raise ValueError(f"pred.shape[1] (U = max labels + 1) must be >= 1, got {U}")
    _check_same("weight.shape[1]", weight.shape[1], "the joint width enc.shape[2]", J)
    Vp = weight.shape[0]
    if bias is not None:
        _check_float("bias", bias, 1, "the joint's output bias (V',)")
        _check_same("bias.shape[0]", bias.shape[0], "weight.shape[0]", Vp)
    for name, x in (("pred", pred), ("weight", weight), ("bias", bias)):
        if x is not None and x.device != enc.device:
            raise ValueError(
                f"{name} must be on the same device as enc ({enc.device}), "
                f"got {x.device}"
            )
    rule = family_of(opts).label_rule(opts, Vp, FUSED_NAMES)
    check_label_tensors(labels, act_lens, label_lens, B, enc.device, FUSED_NAMES)
    return check_lengths_and_labels(
        T, U, labels, act_lens, label_lens, rule, FUSED_NAMES
    )


def _kernel(device: torch.device, family, backend: str):
    """The family's Numba kernels for tensors on ``device`` (None: the PyTorch
    stages), as the dense loss chooses them."""
    if device.type == "mps":
        raise ValueError(
            "the fused loss keeps float64 values per lattice node, which MPS tensors "
            "cannot hold; pass enc, pred, weight and bias on the CPU or a CUDA device"
        )
    return numba_kernel(family, device, backend, "enc")


def _loss(enc, pred, weight, bias, labels, act_lens, label_lens, fo: FusedOptions):
    """The loss of validated options ``fo``."""
    opts = fo.loss
    family = family_of(opts)
    _check_float("enc", enc, 3, _ENC)  # its device picks the stages
    kernel = _kernel(enc.device, family, fo.backend)
    labels, act_lens, label_lens = validate_fused_inputs(
        enc, pred, weight, bias, labels, act_lens, label_lens, opts
    )
    tile_bytes = fo.tile_bytes or default_tile_bytes(enc.device)
    rnnt_opts = family.rnnt_branch(opts)  # TDT's omega draw, as the dense loss's
    if rnnt_opts is not None:
        # the standard RNN-T loss on the token logits: the duration rows of weight
        # and bias get an exactly zero gradient (autograd of the slice)
        V = family.layout(opts).num_tokens(weight.shape[0])
        opts, weight = rnnt_opts, weight[:V]
        bias = None if bias is None else bias[:V]
    plan = LossPlan(
        opts,
        fo.activation,
        tile_ops_for(kernel, fo.tile_backend, enc.device),
        fo.backend,
        tile_bytes,
    )
    costs = FusedJointLossFunction.apply(
        enc, pred, weight, bias, labels, act_lens, label_lens, plan
    )
    return reduce_costs(costs, opts, label_lens)


def fused_transducer_loss(
    enc: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    *,
    blank: int,
    big_blank_durations: Sequence[int] = (),
    tdt_durations: Optional[Sequence[int]] = None,
    activation: ActivationArg = "tanh",
    reduction: str = "mean",
    sigma: float = 0.0,
    fastemit_lambda: float = 0.0,
    clamp: float = 0.0,
    omega: float = 0.0,
    tile_bytes: Optional[int] = None,
    backend: str = "auto",
    tile_backend: str = "auto",
) -> torch.Tensor:
    """The joint network's output layer and the transducer loss in one, exact,
    without a (B, T, U, V) tensor (``docs/fused.md``).

    The same costs and gradients as ``logits = act(enc[:, :, None] + pred[:, None])
    @ weight.T + bias`` followed by :func:`~espnet_multiblank.multiblank_rnnt_loss`
    (standard / multi-blank) or :func:`~espnet_multiblank.tdt_loss` (with
    ``tdt_durations``) with the same options, computed tile by tile: at most a tile
    of logits and hidden activations exists at any time, in forward and backward.
    With ESPnet's ``JointNetwork``: ``enc = joint.lin_enc(enc_out)``, ``pred =
    joint.lin_dec(dec_out)``, ``activation = joint.joint_activation``, ``weight,
    bias = joint.lin_out.weight, joint.lin_out.bias``.

    Args:
        enc: (B, T, J) projected encoder output (float16 / bfloat16 / float32 /
            float64; computed in float32, or float64 when any input is float64).
        pred: (B, U, J) projected prediction-network output, U = max labels + 1.
        weight: (V', J) output layer; V' = V (all blanks included) for RNN-T, V + D
            for a TDT (V token logits, then D = len(tdt_durations) duration logits).
        bias: (V',) or None.
        labels: (B, U - 1) (or wider) integer label ids; padding ignored.
        act_lens: (B,) frames T_b <= T; label_lens: (B,) labels L_b <= U - 1
            (int32 / int64). Padding of enc (t >= T_b) and pred (u > L_b) is never
            read and gets a zero gradient.
        blank, big_blank_durations, reduction, sigma, fastemit_lambda, clamp: as
            for :func:`~espnet_multiblank.multiblank_rnnt_loss`.
        tdt_durations: TDT durations (as ``tdt_loss``'s ``durations``); None: RNN-T.
        omega: TDT only (as ``tdt_loss``): the probability of computing the plain
            RNN-T loss on the token logits (the duration rows of weight / bias then
            get a zero gradient).
        activation: the joint's elementwise activation, a name ("tanh", "relu",
            ...) or the module itself (ESPnet's ``joint_activation``).
        tile_bytes: bound on a tile's logits and activations in bytes (None: 4 MiB
            on the CPU, 32 MiB on CUDA); does not change the result beyond float
            rounding.
        backend: the lattice's: "auto" (Numba on the CPU and on CUDA, torch
            elsewhere), "numba", or "torch" (the PyTorch lattice and, with
            tile_backend "auto", torch tile operations, on any device).
        tile_backend: the tile stages' (gather, log-softmax and lattice terms,
            gradient, scatter): "auto" (the Numba kernels with the Numba CPU
            lattice, Triton kernels with the Numba CUDA lattice on a GPU of
            compute capability >= 8.0, else torch operations), "numba" (CPU),
            "triton" (CUDA) or "torch" (any device). The matmuls are torch's.

    Returns:
        The reduced loss, or (B,) costs for reduction "none"; float32 (float64 when
        computed in float64). Gradients flow into enc, pred, weight and bias.

    Raises:
        TypeError / ValueError naming the argument for malformed input; ValueError
        when the logits of a valid node are NaN / +inf or -inf throughout.
    """
    fo = make_fused_options(
        blank,
        big_blank_durations,
        tdt_durations,
        activation,
        reduction,
        sigma,
        fastemit_lambda,
        clamp,
        omega,
        tile_bytes,
        backend,
        tile_backend,
    )
    return _loss(enc, pred, weight, bias, labels, act_lens, label_lens, fo)


class FusedTransducerLoss(torch.nn.Module):
    """Module form of :func:`fused_transducer_loss` (options validated once);
    ``forward(enc, pred, weight, bias, labels, act_lens, label_lens)``. The output
    layer stays the caller's (e.g. ESPnet's ``joint_network.lin_out``), so that the
    parameters and checkpoints are those of the dense model."""

    def __init__(
        self,
        blank: int,
        big_blank_durations: Sequence[int] = (),
        tdt_durations: Optional[Sequence[int]] = None,
        activation: ActivationArg = "tanh",
        reduction: str = "mean",
        sigma: float = 0.0,
        fastemit_lambda: float = 0.0,
        clamp: float = 0.0,
        omega: float = 0.0,
        tile_bytes: Optional[int] = None,
        backend: str = "auto",
        tile_backend: str = "auto",
    ):
        super().__init__()
        self.options = make_fused_options(
            blank,
            big_blank_durations,
            tdt_durations,
            activation,
            reduction,
            sigma,
            fastemit_lambda,
            clamp,
            omega,
            tile_bytes,
            backend,
            tile_backend,
        )

    def extra_repr(self) -> str:
        fo = self.options
        return (
            f"{fo.loss}, activation={fo.activation.name}, "
            f"tile_bytes={fo.tile_bytes}, backend={fo.backend!r}, "
            f"tile_backend={fo.tile_backend!r}"
        )

    def forward(self, enc, pred, weight, bias, labels, act_lens, label_lens):
        return _loss(
            enc, pred, weight, bias, labels, act_lens, label_lens, self.options
        )
