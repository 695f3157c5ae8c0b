"""ESPnet integration of espnet-multiblank, by job:

Registration and start-up hook
    * :mod:`~espnet_multiblank.espnet.registration`: ``register()`` adds the
      plug-in's classes to ``espnet2.tasks.asr``'s class choices (``model:
      multiblank_espnet``, ``frontend: grad_scaled``, ``preencoder: grad_scaled``)
      and installs the best-model guard.
    * :mod:`~espnet_multiblank.espnet.autoregister`: installs a ``.pth`` start-up
      hook; :mod:`~espnet_multiblank.espnet._hook` is what it runs (``register()``
      once ``espnet2.tasks.asr`` is imported, and ESPnet's stock inference wrapped).
    * :mod:`~espnet_multiblank.espnet.registration.quiet`: ESPnet's import without
      nltk download errors on machines without network.

The model
    * :mod:`~espnet_multiblank.espnet.model.asr_model`: the model.
    * :mod:`~espnet_multiblank.espnet.model.model_conf`: its ``model_conf`` keys.
    * :mod:`~espnet_multiblank.espnet.model.no_path`: its training loss over the
      utterances that have a path.
    * :mod:`~espnet_multiblank.espnet.model.error_calculators`: its validation CER/WER.
    * :mod:`~espnet_multiblank.espnet.frontends.grad_scaled`: gradient-scaling
      frontend / pre-encoder wrappers (wav2vec 2.0 ``feature_grad_mult``).
    * :mod:`~espnet_multiblank.espnet.errors`: ``ConfigError``.

Training
    * :mod:`~espnet_multiblank.espnet.task`: :class:`MultiblankASRTask`, ESPnet's
      ``ASRTask`` with the plug-in's config keys checked before ``build_model`` and
      DDP on CPU (used by ``python -m espnet_multiblank.bin.asr_train``).
    * :mod:`~espnet_multiblank.espnet.ddp`, :mod:`~espnet_multiblank.espnet.cpu_spawn`:
      the DDP options and the CPU worker launcher.
    * :mod:`~espnet_multiblank.espnet.registration.best_model_guard`: NaN epochs
      never chosen as the best model.

Batch-exact encoding
    * :mod:`~espnet_multiblank.espnet.batch_exact.exact_encoding`:
      ``make_batch_exact``, which swaps in the padding-invariant layers of
      :mod:`~espnet_multiblank.espnet.batch_exact.exact_layers`.

Inference
    * :mod:`~espnet_multiblank.espnet.inference.search`: the transducer search a
      decode config chooses.
    * :mod:`~espnet_multiblank.espnet.inference.speech2text`: ESPnet's ``Speech2Text``
      with the plug-in's searches and batched decoding.
    * :mod:`~espnet_multiblank.espnet.inference.stock_inference`: ESPnet's stock
      ``espnet2.bin.asr_inference`` decoding the plug-in's models right.

Importing this package does not import ESPnet; each submodule imports what it needs.
"""
