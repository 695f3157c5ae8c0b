"""ESPnet integration of espnet-multiblank: one sub-package per job.

Listed from the bottom up: each imports only what is listed before it (and
ESPnet, :mod:`espnet_multiblank.decoding`, the losses); ``test_espnet_layout.py``
checks it.

:mod:`~espnet_multiblank.espnet.errors`
    ``ConfigError``, the error every sub-package raises for a bad config value
    (imports nothing).

:mod:`~espnet_multiblank.espnet.frontends`
    ``frontend: grad_scaled`` / ``preencoder: grad_scaled``
    (:mod:`~espnet_multiblank.espnet.frontends.grad_scaled`): gradient-scaling
    wrappers of any frontend / pre-encoder.

:mod:`~espnet_multiblank.espnet.batch_exact`
    Batch-exact encoding: ``make_batch_exact``
    (:mod:`~espnet_multiblank.espnet.batch_exact.exact_encoding`) swaps in the
    padding-invariant layers of
    :mod:`~espnet_multiblank.espnet.batch_exact.exact_layers`.

:mod:`~espnet_multiblank.espnet.model`
    ``model: multiblank_espnet``: the model
    (:mod:`~espnet_multiblank.espnet.model.asr_model`), its ``model_conf`` keys
    (``model_conf``), its training loss over the utterances that have a path
    (``no_path``), the fused joint + loss (``fused_joint``), its validation CER/WER
    (``error_calculators``).

:mod:`~espnet_multiblank.espnet.encoders` (beside ``model``)
    ``encoder: chunk_conformer``
    (:mod:`~espnet_multiblank.espnet.encoders.chunk_conformer`): ESPnet's conformer
    with chunk-masked attention, causal convolution and dynamic chunk training,
    offline at full context or streaming chunk by chunk with caches; declared
    padding-invariant to ``batch_exact``.

:mod:`~espnet_multiblank.espnet.registration`
    ``register()`` (:mod:`~espnet_multiblank.espnet.registration.class_choices`) adds
    the classes above to ``espnet2.tasks.asr``'s class choices and installs the
    best-model guard (``best_model_guard``: NaN epochs are never chosen as the best
    model); ``quiet``: ESPnet's import without nltk download errors.

:mod:`~espnet_multiblank.espnet.inference` and :mod:`~espnet_multiblank.espnet.training`
    Independent of each other. Inference: the search a decode config chooses
    (``search``), ESPnet LMs for fusion (``lm_fusion``), ``Speech2Text`` with the
    plug-in's searches (``speech2text``), input checks (``inputs``), the decoding
    loop (``loop``), the entry points' parser additions (``arguments``) and ESPnet's
    stock ``asr_inference`` wrapped (``stock_inference``). Training:
    :class:`MultiblankASRTask` (``task``), the DDP options (``ddp``) and the CPU
    worker launcher (``cpu_spawn``).

The start-up hook, on top: :mod:`~espnet_multiblank.espnet.autoregister` installs a
``.pth`` file whose bootstrap imports :mod:`~espnet_multiblank.espnet._hook`, which
calls ``register()`` once ``espnet2.tasks.asr`` is imported and wraps ESPnet's stock
inference. Both stay at these paths: installed ``.pth`` files and ``setup.py``
(which loads ``autoregister.py`` by file path) name them.

Importing this package, or any sub-package, does not import ESPnet; the modules
import what they need.
"""
