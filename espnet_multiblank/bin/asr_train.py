#!/usr/bin/env python3
"""ESPnet ASR training with the espnet-multiblank plug-in registered.

``python -m espnet_multiblank.bin.asr_train`` takes the arguments of
``python -m espnet2.bin.asr_train`` (it runs ESPnet's ``ASRTask.main`` through
:class:`~espnet_multiblank.espnet.training.task.MultiblankASRTask`, which adds an
up-front check of the plug-in's config keys), and in addition accepts
``model: multiblank_espnet``, ``frontend: grad_scaled`` and ``preencoder: grad_scaled``.

Distributed training (DDP) works on CPU as on GPUs:

* ``--multiprocessing_distributed true --dist_world_size N --ngpu 0``: N CPU workers
  on this machine (ESPnet's spawn path starts GPU workers only);
* ``torchrun --nproc_per_node N [--nnodes M --node_rank K ...] -m
  espnet_multiblank.bin.asr_train ... --ngpu 0`` (also with GPUs hidden);
* ``--dist_backend`` defaults to gloo with ``--ngpu 0`` (nccl with GPUs);
  ``--dist_timeout SECONDS`` bounds how long a rank waits for the others.

Registration happens when this module is imported; DDP workers register too: torchrun
runs this module in every rank, and workers started with the ``spawn`` method
re-import ``__main__`` and unpickle their target from
:mod:`espnet_multiblank.espnet.training.task`, which registers at import.
"""

from typing import Optional, Sequence

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.registration import register

register()

from espnet_multiblank.espnet.training import ddp, task  # noqa: E402

ASRTask = task.MultiblankASRTask


def get_parser():
    """ESPnet's ASR training parser, with the plug-in's choices."""
    register()
    return ASRTask.get_parser()


def main(cmd: Optional[Sequence[str]] = None):
    r"""Run ESPnet's ASR training (``ASRTask.main``) with the plug-in registered.

    Example:
        % python -m espnet_multiblank.bin.asr_train --print_config --model \
            multiblank_espnet --decoder transducer
        % python -m espnet_multiblank.bin.asr_train --config \
            conf/train_multiblank_conformer_transducer.yaml ...
    """
    register()
    ASRTask.main(cmd=cmd)
    # a DDP rank (torchrun) ends here: torch's teardown after DDP can abort it
    ddp.exit_finished_rank()


if __name__ == "__main__":
    main()
