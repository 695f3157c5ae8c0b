"""CUDA backend of the multi-blank RNN-T and TDT losses (Numba CUDA kernels).

Importing this package is free: ``numba.cuda`` (from the ``numba-cuda`` package, the
``cuda`` extra) is imported only by the first call of :func:`compute`,
:func:`tdt_compute` or their ``begin`` entry points, so a CPU-only install never
needs it. The kernels are in :mod:`espnet_multiblank.loss.cuda.kernels` and
``tdt_kernels`` (device functions shared by both in ``device_ops``), the launch
layers in :mod:`espnet_multiblank.loss.cuda.launch` and ``tdt_launch``.

Each of :func:`compute` and :func:`tdt_compute` offers the autograd Function's two
contracts (``espnet_multiblank.loss.function``):

* ``compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad)`` ->
  ``(costs, grads)``;
* ``compute.begin(acts, labels, act_lens, label_lens, opts, need_grad)`` ->
  ``(costs (B,) float64 numpy, pending)`` and ``compute.finish(pending.tensors(),
  opts, factors (B,) float64 numpy)`` -> the gradient, written into the one
  logits-sized buffer that ``begin`` allocated, with the factors (reduction weight
  times incoming gradient) folded in by the gradient kernel itself.

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


def _launch_module(name: str):
    try:
        if name == "tdt":
            from espnet_multiblank.loss.cuda import tdt_launch as mod
        else:
            from espnet_multiblank.loss.cuda import launch as mod
    except ImportError as e:  # numba without numba.cuda, or numba-cuda missing
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return mod


def compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad):
    """Costs and (optionally) gradients of the multi-blank RNN-T loss on a GPU.

    Args:
        acts: (B, T, U, V) float64 / float32 / float16 / bfloat16 CUDA tensor of raw
            logits (made C-contiguous).
        labels: (B, L) int64, L <= U - 1, padding replaced by 0.
        act_lens, label_lens: (B,) int64 (validated: T_b <= T, L_b <= min(L, U - 1)).
        opts: :class:`~espnet_multiblank.loss.options.LossOptions`.
        grad_weights: (B,) tensor; utterance b's gradient is clamped to
            [-clamp, clamp] (clamp > 0) and then multiplied by grad_weights[b].
        need_grad: compute the gradient only when True.

    Returns:
        costs: (B,) float64 for float64 logits, float32 otherwise:
            ``-(1 + fastemit_lambda) * log P`` (+inf for an impossible utterance, 0
            for T_b = 0 = L_b, NaN for NaN / +inf logits).
        grads: (B, T, U, V) in acts' dtype (0 at padding and for impossible
            utterances), or None when need_grad is False.

    All work is queued on torch's current stream of acts' device and nothing here
    waits for the GPU (no host synchronisation; the caller's NaN check of the costs
    is the first one). The first call for a new dtype / duration set / row layout
    compiles the kernels (a few seconds).
    """
    return _launch_module("mb").compute(
        acts, labels, act_lens, label_lens, opts, grad_weights, need_grad
    )


def _begin(acts, labels, act_lens, label_lens, opts, need_grad):
    return _launch_module("mb").begin(
        acts, labels, act_lens, label_lens, opts, need_grad
    )


def _finish(tensors, opts, factors):
    return _launch_module("mb").finish(tensors, opts, factors)


def tdt_compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad):
    """Costs and (optionally) gradients of the TDT loss on a GPU.

    Args:
        acts: (B, T, U, V + D) float64 / float32 / float16 / bfloat16 CUDA tensor of
            raw logits.
        labels: (B, L) int64, L <= U - 1, padding replaced by 0.
        act_lens, label_lens: (B,) int64 (validated).
        opts: :class:`~espnet_multiblank.loss.tdt_options.TDTOptions` (omega is drawn
            by the caller).
        grad_weights: (B,) tensor; utterance b's gradient is clamped (clamp > 0), then
            multiplied by grad_weights[b].
        need_grad: compute the gradient only when True.

    Returns:
        costs: (B,) float64 for float64 logits, float32 otherwise:
            ``-(1 + fastemit_lambda) * log P`` (+inf when impossible, 0 for
            T_b = 0 = L_b, NaN for NaN / +inf logits).
        grads: (B, T, U, V + D) in acts' dtype (0 at padding and for impossible
            utterances), or None.

    Queued on torch's current stream without host synchronisation, like
    :func:`compute`.
    """
    return _launch_module("tdt").tdt_compute(
        acts, labels, act_lens, label_lens, opts, grad_weights, need_grad
    )


def _tdt_begin(acts, labels, act_lens, label_lens, opts, need_grad):
    return _launch_module("tdt").tdt_begin(
        acts, labels, act_lens, label_lens, opts, need_grad
    )


def _tdt_finish(tensors, opts, factors):
    return _launch_module("tdt").tdt_finish(tensors, opts, factors)


compute.begin = _begin
compute.finish = _finish
compute.begin_dtypes = DTYPES
tdt_compute.begin = _tdt_begin
tdt_compute.finish = _tdt_finish
tdt_compute.begin_dtypes = DTYPES

__all__ = ["compute", "tdt_compute"]
