"""Frontend and pre-encoder wrappers that a training config selects.

* :mod:`~espnet_multiblank.espnet.frontends.grad_scaled`: ``frontend: grad_scaled``
  and ``preencoder: grad_scaled``, which scale the gradient flowing into any
  registered frontend / pre-encoder (wav2vec 2.0's ``feature_grad_mult``).

Below every other sub-package but ``errors``: the batch-exact inspection looks
through these wrappers, so it imports them.
"""
