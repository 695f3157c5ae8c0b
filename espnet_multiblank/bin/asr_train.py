#!/usr/bin/env python3
"""ESPnet ASR training with the espnet-multiblank plug-in registered.

``python -m espnet_multiblank.bin.asr_train`` takes exactly the arguments of
``python -m espnet2.bin.asr_train`` (it runs ESPnet's ``ASRTask.main`` through
:class:`~espnet_multiblank.espnet.task.MultiblankASRTask`, which only adds an up-front
check of the plug-in's config keys), and in addition accepts
``model: multiblank_espnet``, ``frontend: grad_scaled`` and ``preencoder: grad_scaled``.

Registration happens when this module is imported; DDP workers started with the
``spawn`` method register too (they re-import ``__main__`` and unpickle
``MultiblankASRTask.main_worker``, which imports the registering task module).
"""

from typing import Optional, Sequence

import espnet_multiblank.espnet.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.registration import register

register()

from espnet_multiblank.espnet.task import MultiblankASRTask as ASRTask  # noqa: E402


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


if __name__ == "__main__":
    main()
