"""The per-tile stages with torch operations, on any device (CUDA, the ``torch``
backend, devices Numba cannot target).

The same stages as :class:`espnet_multiblank.fused.cpu_tile_ops.CpuTileOps` (and the
same formulas, ``cpu_tile_kernels``'s docstring), as a few tensor operations per tile:
every temporary is tile-sized. The log-softmax normalisers are kept in float64.
"""

from dataclasses import dataclass

import torch

from espnet_multiblank.fused.planes import GRADIENT_FLUSH_BELOW, Planes
from espnet_multiblank.fused.tile_ops import TileOps


@dataclass
class TorchTileIndex:
    """A tile's rows, as (R,) int64 tensors on the device: the rows of enc2d and
    pred2d they add, their utterance and label position, and their node on the
    planes' grid."""

    enc_rows: torch.Tensor
    pred_rows: torch.Tensor
    b: torch.Tensor
    u: torch.Tensor
    node: torch.Tensor


class TorchTileOps(TileOps):
    """The tile stages as torch operations on the device
    (:class:`~espnet_multiblank.fused.tile_ops.TileOps`; ``act_lens`` is unused
    here: the tiling has the lengths)."""

    def prepare(self, labels, act_lens, label_lens, vocab_size: int) -> None:
        self.labels = labels
        self.label_lens = label_lens
        self.D = self.layout.num_durations
        self.blank_ids = torch.tensor(
            self.layout.step_ids, dtype=torch.int64, device=self.device
        )
        self._frames = tuple(
            torch.from_numpy(x).to(self.device)
            for x in (self.tiling.row0, self.tiling.frame_enc, self.tiling.frame_b)
        )

    def index(self, r0: int, r1: int) -> TorchTileIndex:
        """Tile [r0, r1)'s rows, computed on the device from the frame table (no
        host round trip per tile)."""
        row0, frame_enc, frame_b = self._frames
        r = torch.arange(r0, r1, device=self.device)
        f = torch.searchsorted(row0, r, right=True) - 1
        b = frame_b[f]
        u = r - row0[f]
        enc_rows = frame_enc[f]
        t = enc_rows - b * self.tiling.T
        node = (b * self.Tp + t) * self.Up + u
        return TorchTileIndex(enc_rows, b * self.tiling.U + u, b, u, node)

    def gather(self, enc2d, pred2d, index: TorchTileIndex, out: torch.Tensor):
        pre = out[: index.enc_rows.shape[0]]
        torch.index_select(enc2d, 0, index.enc_rows, out=pre)
        return pre.add_(pred2d.index_select(0, index.pred_rows))

    def _symbols(self, index: TorchTileIndex):
        """(R, S) ids of the symbols each row's steps emit (the blanks, the label
        second; a row without a label repeats the blank there) and (R,) whether it
        has a label."""
        has_label = index.u < self.label_lens[index.b]
        L = self.labels.shape[1]
        ids = self.blank_ids.expand(index.b.shape[0], -1)
        if L == 0:
            label = ids[:, 0]
        else:
            label = self.labels[index.b, index.u.clamp(max=L - 1)]
            label = torch.where(has_label, label, ids[:, 0])
        return torch.cat([ids[:, :1], label[:, None], ids[:, 1:]], dim=1), has_label

    def extract(self, z: torch.Tensor, index: TorchTileIndex, planes: Planes) -> None:
        """Forward: the tile's logits z (R, V') to the planes (z is overwritten)."""
        rows = planes.rows.view(-1, planes.rows.shape[-1])
        sym, has_label = self._symbols(index)
        V = self.V
        picked = z.gather(1, sym).double()
        lse = _log_sum_exp(z[:, :V])
        lp = picked - (lse + self.opts.sigma)[:, None]
        lp[:, 1] = torch.where(has_label, lp[:, 1], float("-inf"))
        if self.D:  # the duration part: its own softmax, no sigma
            dur = z[:, V:].to(torch.float64, copy=True)
            lse_d = _log_sum_exp(z[:, V:])
            lp = torch.cat([lp, dur - lse_d[:, None]], dim=1)
            lse = torch.stack([lse, lse_d], dim=1)
        finite = torch.isfinite(lse.view(lp.shape[0], -1)).all(1)
        r = torch.ones(
            (lp.shape[0], rows.shape[1] - lp.shape[1]), dtype=lp.dtype, device=lp.device
        )
        rows[index.node] = torch.cat([lp, r], dim=1)
        planes.lse.view(rows.shape[0], -1)[index.node] = lse.view(lp.shape[0], -1)
        planes.bad.index_add_(0, index.b, (~finite).to(planes.bad.dtype))

    def apply(self, z: torch.Tensor, index: TorchTileIndex, planes: Planes, factors):
        """Backward: the tile's recomputed logits z (R, V') become the gradient of
        the reduced loss w.r.t. them, in place. factors: (B,) float64 tensor on the
        device (0 for an impossible utterance)."""
        o = self.opts
        V = self.V
        S = self.layout.num_token_steps
        K = self.layout.num_steps
        f = factors[index.b]
        live = (f != 0)[:, None]
        # rows of utterances with factor 0 may hold anything (an impossible
        # utterance keeps its log-probs): zero occupancies, so the row gives 0
        rows = planes.rows.view(-1, planes.rows.shape[-1])
        occ = torch.where(live, rows[index.node, :K], 0.0)
        lse = planes.lse.view(rows.shape[0], -1)[index.node]
        w_blank, w_label = occ[:, 0], occ[:, 1]
        gamma = w_blank + w_label
        if S > 2:  # the other blanks' steps (a TDT's W_dur split the same paths)
            gamma = gamma + occ[:, 2:S].sum(1)
        coef = (gamma + o.fastemit_lambda * w_label) * f
        tok = z[:, :V]
        _softmax_times(tok, lse[:, 0], coef)
        sym, has_label = self._symbols(index)
        steps = occ[:, :S] * f[:, None]
        steps[:, 1] *= 1.0 + o.fastemit_lambda
        tok.scatter_add_(1, sym, (-steps).to(z.dtype))
        if self.D:
            dur = z[:, V:]
            _softmax_times(dur, lse[:, 1], gamma * f)
            dur.sub_((occ[:, S:] * f[:, None]).to(z.dtype))
        if o.clamp > 0:
            c = (o.clamp * f.abs()).to(z.dtype)[:, None]
            torch.maximum(z, -c, out=z)
            torch.minimum(z, c, out=z)
        # values below |f| 2**-80 (nodes paths almost never visit) are set to 0:
        # see cpu_tile_kernels.flush_limit (two boolean masks, not a float |z|:
        # the tile's temporaries stay a fraction of the tile)
        z.masked_fill_(~live, 0.0)
        limit = (f.abs() * GRADIENT_FLUSH_BELOW).clamp(min=torch.finfo(z.dtype).tiny)
        limit = limit.to(z.dtype)[:, None]
        tiny = z < limit
        tiny &= z > -limit
        z.masked_fill_(tiny, 0.0)

    def scatter(self, d_pre, index: TorchTileIndex, d_enc, d_pred) -> None:
        d_enc.index_add_(0, index.enc_rows, d_pre)
        d_pred.index_add_(0, index.pred_rows, d_pre)


def _log_sum_exp(x: torch.Tensor) -> torch.Tensor:
    """(R,) float64 log-sum-exp of the rows of x (R, n), computed in place in x (x is
    overwritten): the exps of x - max in x's dtype, their sum in float64 (the
    float32 result of torch.logsumexp would round lse by up to 6e-5 at 1000). NaN for
    a row with NaN or +inf, or of only -inf."""
    m = x.amax(1, keepdim=True)
    s = x.sub_(m).exp_().sum(1, dtype=torch.float64)
    return m[:, 0].double() + torch.log(s)


def _softmax_times(x: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor) -> None:
    """x (R, n) <- scale[:, None] * exp(x - lse[:, None]) in place (lse, scale (R,)
    float64), as ``exp(x - l32) * (scale exp(l32 - lse))`` with l32 = lse in x's
    dtype."""
    l32 = lse.to(x.dtype)
    x.sub_(l32[:, None]).exp_()
    x.mul_((scale * torch.exp(l32.double() - lse)).to(x.dtype)[:, None])
