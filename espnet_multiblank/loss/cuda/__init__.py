"""CUDA backend of the multi-blank RNN-T and TDT losses (Numba CUDA kernels).

Importing this package is free: ``numba.cuda`` (from the ``numba-cuda`` package, the
``cuda`` extra) is imported only by the first call of :func:`compute` or
:func:`tdt_compute`, so a CPU-only install never needs it. The kernels are in
:mod:`espnet_multiblank.loss.cuda.kernels` and ``tdt_kernels``, the launch layers in
:mod:`espnet_multiblank.loss.cuda.launch` and ``tdt_launch``.

Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is first imported) the kernels run
in Numba's CUDA simulator and :func:`compute` takes CPU tensors instead of CUDA ones;
the tests use this to run the kernels without a GPU.
"""

_INSTALL_HINT = (
    "the CUDA backend of espnet-multiblank needs numba-cuda: "
    "pip install 'espnet-multiblank[cuda]' (or pip install numba-cuda); "
    "or pass backend='torch'"
)


def compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad):
    """Costs and (optionally) gradients of the multi-blank RNN-T loss on a GPU.

    Args:
        acts: (B, T, U, V) float32 or float64 CUDA tensor of raw logits, C-contiguous.
        labels: (B, L) int64, L <= U - 1, padding replaced by 0.
        act_lens, label_lens: (B,) int64 (validated: T_b <= T, L_b <= min(L, U - 1)).
        opts: :class:`~espnet_multiblank.loss.options.LossOptions`.
        grad_weights: (B,) tensor of acts' dtype; utterance b's gradient is clamped to
            [-clamp, clamp] (clamp > 0) and then multiplied by grad_weights[b].
        need_grad: compute the gradient only when True.

    Returns:
        costs: (B,) acts dtype, ``-(1 + fastemit_lambda) * log P`` (+inf for an
            impossible utterance, 0 for T_b = 0 = L_b, NaN for NaN / +inf logits).
        grads: (B, T, U, V) acts dtype (0 at padding and for impossible
            utterances), or None when need_grad is False.

    All work is queued on torch's current stream of acts' device and nothing here
    waits for the GPU (no host synchronisation; the caller's NaN check of the costs
    is the first one). The first call for a new dtype / duration set / block size
    compiles the kernels (a few seconds).
    """
    try:
        from espnet_multiblank.loss.cuda.launch import compute as _compute
    except ImportError as e:  # numba without numba.cuda, or numba-cuda missing
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return _compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad)


def tdt_compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad):
    """Costs and (optionally) gradients of the TDT loss on a GPU.

    Args:
        acts: (B, T, U, V + D) float32 or float64 CUDA tensor of raw logits.
        labels: (B, L) int64, L <= U - 1, padding replaced by 0.
        act_lens, label_lens: (B,) int64 (validated).
        opts: :class:`~espnet_multiblank.loss.tdt_options.TDTOptions` (omega is drawn
            by the caller).
        grad_weights: (B,) tensor; utterance b's gradient is clamped (clamp > 0), then
            multiplied by grad_weights[b].
        need_grad: compute the gradient only when True.

    Returns:
        costs: (B,) acts dtype, ``-(1 + fastemit_lambda) * log P`` (+inf when
            impossible, 0 for T_b = 0 = L_b, NaN for NaN / +inf logits).
        grads: (B, T, U, V + D) acts dtype (0 at padding and for impossible
            utterances), or None.

    Queued on torch's current stream without host synchronisation, like
    :func:`compute`.
    """
    try:
        from espnet_multiblank.loss.cuda.tdt_launch import tdt_compute as _compute
    except ImportError as e:  # numba without numba.cuda, or numba-cuda missing
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return _compute(acts, labels, act_lens, label_lens, opts, grad_weights, need_grad)


__all__ = ["compute", "tdt_compute"]
