"""Training with ESPnet's trainer: the task and distributed training on CPU.

* :mod:`~espnet_multiblank.espnet.training.task`: :class:`MultiblankASRTask`,
  ESPnet's ``ASRTask`` with the plug-in registered, its config keys checked before
  ``build_model`` and DDP that also works on CPU (``python -m
  espnet_multiblank.bin.asr_train`` runs it; DDP workers started with ``spawn``
  import it to unpickle their target, which registers them).
* :mod:`~espnet_multiblank.espnet.training.ddp`: the DDP options (``--dist_backend``
  default, ``--dist_timeout``, CPU ranks) and :class:`DistributedTrainingError`.
* :mod:`~espnet_multiblank.espnet.training.cpu_spawn`: the launcher of N CPU workers
  (``--multiprocessing_distributed true --dist_world_size N --ngpu 0``).

Imports the model (its config checks and defaults) and registration; nothing imports
it but the training entry point.
"""
