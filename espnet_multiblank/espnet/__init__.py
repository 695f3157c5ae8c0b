"""ESPnet integration of espnet-multiblank.

* :mod:`espnet_multiblank.espnet.registration`: ``register()`` adds the plug-in's
  classes to ``espnet2.tasks.asr``'s class choices (``model: multiblank_espnet``,
  ``frontend: grad_scaled``, ``preencoder: grad_scaled``).
* :mod:`espnet_multiblank.espnet.model`: :class:`MultiblankESPnetASRModel`.
* :mod:`espnet_multiblank.espnet.grad_scaled`: gradient-scaling frontend/preencoder
  wrappers (wav2vec 2.0 ``feature_grad_mult``).
* :mod:`espnet_multiblank.espnet.task`: :class:`MultiblankASRTask`, ESPnet's
  ``ASRTask`` with the plug-in's config keys checked before ``build_model`` (used by
  ``python -m espnet_multiblank.bin.asr_train``).
* :mod:`espnet_multiblank.espnet.autoregister`: installs a ``.pth`` start-up hook that
  calls ``register()`` as soon as any process imports ``espnet2.tasks.asr``.

Importing this package does not import ESPnet; each submodule imports what it needs.
"""
