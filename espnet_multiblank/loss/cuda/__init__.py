"""CUDA backend of the multi-blank RNN-T and TDT losses (Numba CUDA kernels).

Importing this package is free: ``numba.cuda`` (from the ``numba-cuda`` package, the
``cuda`` extra) is imported only by the first call of ``compute``, ``tdt_compute``
or their ``begin`` entry points, so a CPU-only install never needs it. The kernels
are in :mod:`espnet_multiblank.loss.cuda.kernels` (multi-blank / standard RNN-T) and
``tdt_kernels`` (TDT), device functions shared by both in ``device_ops``, the launch
layer (one :class:`~espnet_multiblank.loss.cuda.launch.CudaKernelDriver` per family)
in :mod:`espnet_multiblank.loss.cuda.launch`.

Each of ``compute`` (multi-blank, logits (B, T, U, V)) and ``tdt_compute`` (TDT,
logits (B, T, U, V + D)) offers the autograd Function's two contracts
(``espnet_multiblank.loss.function``):

* ``compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad)`` ->
  ``(costs, grads)``: acts a float64 / float32 / float16 / bfloat16 CUDA tensor of raw
  logits, labels (B, L) int64 with padding replaced by 0, lengths (B,) int64
  (validated), grad_weights (B,) (utterance b's gradient is clamped, then multiplied
  by grad_weights[b]); costs (B,) float64 for float64 logits, float32 otherwise
  (``-(1 + lambda) log P``: +inf when impossible, 0 for T_b = 0 = L_b, NaN for NaN /
  +inf logits), grads in acts' shape and dtype (0 at padding and for impossible
  utterances) or None. All work is queued on torch's current stream of acts' device
  without host synchronisation; the first call for a new dtype / duration set / row
  layout compiles the kernels (a few seconds);
* ``compute.begin(batch, opts, need_grad)`` (batch: a
  :class:`~espnet_multiblank.loss.batch.LossBatch` of the tensors above) ->
  ``(costs (B,) float64 numpy, pending)`` and ``compute.finish(pending.tensors(),
  opts, factors (B,) float64 numpy)`` -> the gradient, written into the one
  logits-sized buffer that ``begin`` allocated, with the factors (reduction weight
  times incoming gradient) folded in by the gradient kernel itself;
* ``compute.lattice(opts, rows, act_lens, label_lens, need_grad)`` -> ``log_p``: the
  lattice stage alone on rows a caller extracted (``espnet_multiblank.loss.rows``;
  ``espnet_multiblank.loss.stages.run_lattice`` on CUDA tensors).

``compute.begin_dtypes``: the logits dtypes both read directly (float64, float32,
float16, bfloat16; no float32 copy of half-precision logits is ever made).

Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is first imported) the kernels run
in Numba's CUDA simulator and take CPU tensors instead of CUDA ones; the tests use
this to run the kernels without a GPU.
"""

import torch

_INSTALL_HINT = (
    "the CUDA backend of espnet-multiblank needs numba-cuda: "
    "pip install 'espnet-multiblank[cuda]' (or pip install numba-cuda); "
    "or pass backend='torch'"
)

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


class LazyCudaDriver:
    """A :class:`~espnet_multiblank.loss.cuda.launch.CudaKernelDriver` of
    ``launch.py`` imported on first use; same contracts."""

    begin_dtypes = DTYPES
    device_type = "cuda"

    def __init__(self, name: str):
        self.name = name

    @staticmethod
    def launch_module():
        """:mod:`espnet_multiblank.loss.cuda.launch` (ImportError with the install
        hint without numba-cuda)."""
        try:
            from espnet_multiblank.loss.cuda import launch
        except ImportError as e:  # numba without numba.cuda, or numba-cuda missing
            raise ImportError(f"{_INSTALL_HINT} ({e})") from e
        return launch

    def driver(self):
        return getattr(self.launch_module(), self.name)

    def __call__(
        self, acts, labels, act_lens, label_lens, opts, grad_weights, need_grad
    ):
        return self.driver()(
            acts, labels, act_lens, label_lens, opts, grad_weights, need_grad
        )

    def begin(self, batch, opts, need_grad):
        return self.driver().begin(batch, opts, need_grad)

    def finish(self, tensors, opts, factors):
        return self.driver().finish(tensors, opts, factors)

    def lattice(self, opts, rows, act_lens, label_lens, need_grad):
        return self.driver().lattice(opts, rows, act_lens, label_lens, need_grad)


compute = LazyCudaDriver("compute")
tdt_compute = LazyCudaDriver("tdt_compute")

__all__ = ["compute", "tdt_compute"]
