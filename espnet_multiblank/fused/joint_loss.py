"""The autograd Function of the fused joint + loss: tiles of logits in, per-utterance
costs out, gradients for the encoder / prediction-network projections and the output
layer, never a (B, T, U, V) tensor.

Forward, per tile of packed nodes (``tiling.py``)::

    pre = enc[b, t] + pred[b, u]          (gather, compute dtype)
    h   = act(pre)
    z   = h W^T + c                        (torch matmul: BLAS / cuBLAS)
    extract(z) -> planes                   (log-softmax normaliser + the few log-probs)

then the lattice on the planes (log P and the occupancies). Backward, per tile, the
same tiles and the same operations recompute z exactly, then::

    G = apply(z)                            (in place: f_b (coef softmax(z) - steps))
    dW += G^T h,  dc += sum_rows G,  dh = G W,  d_pre = act'(pre) dh
    d_enc[b, t] += d_pre,  d_pred[b, u] += d_pre

Only the planes (``planes.py``), the inputs and the tiling cross from forward to
backward. What the rows of the planes hold is the lattice family's (its rows layout,
``espnet_multiblank.loss.rows``). The tile stages are chosen by ``tile_backends.py``
(the Numba tile kernels with the CPU lattice, Triton kernels with the CUDA lattice,
torch operations otherwise), and the lattice stage is the loss package's
(``run_lattice``: the family's CPU, CUDA or PyTorch lattice, by where the planes live
and the backend).

Precision: the compute dtype is float64 when any of enc, pred, weight, bias is
float64, else float32 (half-precision inputs are converted once, as a whole: they are
inputs-sized, not logits-sized); planes, lattice and factors are float64; the
gradients are accumulated in the compute dtype and returned in each input's dtype.
"""

import contextlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from espnet_multiblank.fused.activations import JointActivation
from espnet_multiblank.fused.loss_package import family_of, run_lattice
from espnet_multiblank.fused.planes import Planes, lattice_grid, new_planes
from espnet_multiblank.fused.tiling import Tiling

#: default tile size in bytes of (logits + 3 activations) per row, per device type: on
#: the CPU a few MiB (the tile stays in the caches), on a GPU large enough for the
#: matmuls and small enough for the memory goal (1/20 of the dense step's at V = 1024)
DEFAULT_TILE_BYTES = {"cpu": 4 << 20, "cuda": 32 << 20}
_OTHER_DEVICE_TILE_BYTES = 64 << 20


def default_tile_bytes(device: torch.device) -> int:
    return DEFAULT_TILE_BYTES.get(device.type, _OTHER_DEVICE_TILE_BYTES)


def compute_dtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    """float64 when any tensor is float64, else float32."""
    if any(x is not None and x.dtype == torch.float64 for x in tensors):
        return torch.float64
    return torch.float32


def tile_rows_for(tile_bytes: int, vocab_size: int, J: int, dtype) -> int:
    """Rows per tile: a row holds V' logits and 3 J activations (pre, h, dh)."""
    per_row = (vocab_size + 3 * J) * torch.empty((), dtype=dtype).element_size()
    return max(1, int(tile_bytes) // per_row)


class _TileBuffers:
    """The tile-sized workspaces of one pass (numpy-backed on the CPU)."""

    def __init__(self, R: int, V: int, J: int, dtype, device, with_dh: bool):
        def empty(*shape):
            if device.type == "cpu":
                np_dtype = np.float64 if dtype == torch.float64 else np.float32
                return torch.from_numpy(np.empty(shape, np_dtype))
            return torch.empty(shape, dtype=dtype, device=device)

        self.z = empty(R, V)
        self.pre = empty(R, J)
        self.h = empty(R, J)
        self.dh = empty(R, J) if with_dh else None


def _tile_logits(ops, tiling: Tiling, enc2d, pred2d, weight, bias, act, buffers):
    """For each tile in order: (index, pre, h, z), z = act(pre) W^T + bias. Forward
    and backward both use this, so that a tile's logits are recomputed by the same
    operations on the same rows."""
    wt = weight.t()
    for r0, r1 in tiling.tiles():
        index = ops.index(r0, r1)
        pre = ops.gather(enc2d, pred2d, index, buffers.pre)
        R = r1 - r0
        h = act.forward(pre, buffers.h[:R])
        z = buffers.z[:R]
        if bias is None:
            torch.mm(h, wt, out=z)
        else:
            torch.addmm(bias, h, wt, out=z)
        yield index, pre, h, z


def _no_autocast(device: torch.device):
    """Autocast off: under AMP the tile matmuls would otherwise run in half precision
    in forward (autocast is on there) and in float32 in backward (it is off there),
    and the recomputed softmax would not be the forward's."""
    try:
        return torch.autocast(device_type=device.type, enabled=False)
    except RuntimeError:  # a device type without autocast
        return contextlib.nullcontext()


def _as_compute(x: Optional[torch.Tensor], dtype, shape=None):
    if x is None:
        return None
    x = x.detach()
    if shape is not None:
        x = x.reshape(shape)
    return x.to(dtype).contiguous()


@dataclass(frozen=True)
class LossPlan:
    """How :class:`FusedJointLossFunction` computes a batch's costs (all but its
    tensors).

    Attributes:
        opts: The loss options (``LossOptions`` or ``TDTOptions``).
        activation: The joint's activation.
        tile_ops: The per-tile stages' class (a
            :class:`~espnet_multiblank.fused.tile_ops.TileOps`;
            ``tile_backends.tile_ops_for``).
        backend: The lattice's (``run_lattice``): "auto", "numba" or "torch".
        tile_bytes: The tile size bound in bytes.
    """

    opts: object
    activation: JointActivation
    tile_ops: type
    backend: str
    tile_bytes: int


class FusedJointLossFunction(torch.autograd.Function):
    """costs = Function.apply(enc, pred, weight, bias, labels, act_lens, label_lens,
    plan).

    Args (validated by the caller):
        enc: (B, T, J) projected encoder output; pred: (B, U, J) projected
            prediction-network output; weight: (V', J); bias: (V',) or None (any
            float dtypes, one device).
        labels: (B, L) int64 (padding replaced by valid ids), act_lens, label_lens
            (B,) int64, on enc's device.
        plan: The :class:`LossPlan` (options, activation, tile stages, lattice
            backend, tile size).
    Returns:
        (B,) costs ``-(1 + lambda) log P`` (+inf for an impossible utterance, 0 for
        T_b = 0 = L_b), float64 for the float64 compute dtype, else float32.
    """

    @staticmethod
    def forward(ctx, enc, pred, weight, bias, labels, act_lens, label_lens, plan):
        opts, activation = plan.opts, plan.activation
        B, T, J = enc.shape
        U = pred.shape[1]
        Vp = weight.shape[0]
        dtype = compute_dtype(enc, pred, weight, bias)
        device = enc.device
        need_grad = any(ctx.needs_input_grad[:4])
        # the lengths on the host (the tiling is planned there): one copy, one
        # host synchronisation on a GPU
        al_np, ll_np = torch.stack([act_lens, label_lens]).cpu().numpy()
        grid = lattice_grid(al_np, ll_np)
        tiling = Tiling.create(
            T, U, al_np, ll_np, tile_rows_for(plan.tile_bytes, Vp, J, dtype)
        )
        enc2d = _as_compute(enc, dtype, (B * T, J))
        pred2d = _as_compute(pred, dtype, (B * U, J))
        W = _as_compute(weight, dtype)
        c = _as_compute(bias, dtype)
        layout = family_of(opts).layout(opts)
        ops = plan.tile_ops(
            opts, layout, tiling, labels, act_lens, label_lens, Vp, grid
        )
        planes = new_planes(layout, B, grid[0], grid[1], device)
        if tiling.num_rows:
            buffers = _TileBuffers(tiling.tile_rows, Vp, J, dtype, device, False)
            with _no_autocast(device):
                for index, _, _, z in _tile_logits(
                    ops, tiling, enc2d, pred2d, W, c, activation, buffers
                ):
                    ops.extract(z, index, planes)
            del buffers
            bad = planes.first_bad()
            if bad >= 0:
                raise ValueError(
                    "enc, pred, weight and bias must give finite logits (-inf "
                    f"allowed for masked symbols); utterance {bad} has a logit that "
                    "is NaN or +inf, or a row of logits that is -inf throughout"
                )
        log_p = run_lattice(
            opts, planes.rows, act_lens, label_lens, need_grad, backend=plan.backend
        )
        costs = -(1.0 + opts.fastemit_lambda) * log_p + 0.0
        if need_grad:
            ctx.save_for_backward(enc, pred, weight, bias, planes.rows, planes.lse)
            ctx.state = (opts, activation, tiling, ops, grid, log_p)
        cost_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        return costs.to(device=device, dtype=cost_dtype)

    @staticmethod
    @once_differentiable  # no second derivative: fail loudly
    def backward(ctx, grad_costs):
        enc, pred, weight, bias, rows, lse = ctx.saved_tensors
        opts, activation, tiling, ops, grid, log_p = ctx.state
        need_enc, need_pred, need_w, need_b = ctx.needs_input_grad[:4]
        B, T, J = enc.shape
        U = pred.shape[1]
        Vp = weight.shape[0]
        dtype = compute_dtype(enc, pred, weight, bias)
        device = enc.device
        enc2d = _as_compute(enc, dtype, (B * T, J))
        pred2d = _as_compute(pred, dtype, (B * U, J))
        W = _as_compute(weight, dtype)
        c = _as_compute(bias, dtype)
        zeros = dict(dtype=dtype, device=device)
        need_h = need_enc or need_pred
        d_enc = torch.zeros((B * T, J), **zeros) if need_h else None
        d_pred = torch.zeros((B * U, J), **zeros) if need_h else None
        dW = torch.zeros((Vp, J), **zeros) if need_w else None
        db = torch.zeros((Vp,), **zeros) if need_b else None
        if tiling.num_rows:
            planes = Planes(rows, lse, None)
            factors = ops.factors(grad_costs, log_p)
            buffers = _TileBuffers(tiling.tile_rows, Vp, J, dtype, device, need_h)
            with _no_autocast(device):
                for index, pre, h, z in _tile_logits(
                    ops, tiling, enc2d, pred2d, W, c, activation, buffers
                ):
                    ops.apply(z, index, planes, factors)
                    if dW is not None:
                        dW.addmm_(z.t(), h)
                    if db is not None:
                        db.add_(z.sum(0))
                    if need_h:
                        dh = torch.mm(z, W, out=buffers.dh[: z.shape[0]])
                        d_pre = activation.backward(dh, pre, h)
                        ops.scatter(d_pre, index, d_enc, d_pred)
        return (
            d_enc.view(enc.shape).to(enc.dtype) if need_enc else None,
            d_pred.view(pred.shape).to(pred.dtype) if need_pred else None,
            dW.to(weight.dtype) if need_w else None,
            db.to(bias.dtype) if need_b else None,
        ) + (None,) * 4
