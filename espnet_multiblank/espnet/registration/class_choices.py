"""Make the plug-in's classes selectable from ESPnet ASR configs.

ESPnet has no plug-in mechanism: ``espnet2.tasks.asr`` keeps module-level
``ClassChoices`` whose dicts are frozen into argparse ``choices=`` when the parser is
built and looked up again by ``ASRTask.build_model``. :func:`register` adds

==============  =====================  ===============================================
choices         name                   class (:data:`ENTRIES`: module and class)
==============  =====================  ===============================================
``model``       ``multiblank_espnet``  ``MultiblankESPnetASRModel``
``frontend``    ``grad_scaled``        ``GradScaledFrontend``
``frontend``    ``kaldi_fbank``        ``KaldiFbankFrontend``
``preencoder``  ``grad_scaled``        ``GradScaledPreEncoder``
``encoder``     ``chunk_conformer``    ``ChunkConformerEncoder``
==============  =====================  ===============================================

It must run, before the parser is built or a model is rebuilt, in every process:
``python -m espnet_multiblank.bin.asr_train`` does it at import (so DDP workers
started with ``spawn``, which re-import ``__main__``, do it too); the ``.pth`` hook of
:mod:`espnet_multiblank.espnet.autoregister` does it whenever ``espnet2.tasks.asr``
is imported (stock ``espnet2.bin.*`` scripts included); any other program calls
``espnet_multiblank.register()`` first. It also installs
:mod:`~espnet_multiblank.espnet.registration.best_model_guard` (NaN epochs are never
chosen as the best model), so that both training entry points get it.

This module imports nothing from ESPnet at import time, so the start-up hook can
import it while ``espnet2.tasks.asr`` is being set up.
"""

import threading
from typing import Dict, Type

_LOCK = threading.RLock()

#: choices name -> {choice name -> "module:Class"}
ENTRIES: Dict[str, Dict[str, str]] = {
    "model": {
        "multiblank_espnet": (
            "espnet_multiblank.espnet.model.asr_model:MultiblankESPnetASRModel"
        )
    },
    "frontend": {
        "grad_scaled": (
            "espnet_multiblank.espnet.frontends.grad_scaled:GradScaledFrontend"
        ),
        "kaldi_fbank": (
            "espnet_multiblank.espnet.frontends.kaldi_fbank:KaldiFbankFrontend"
        ),
    },
    "preencoder": {
        "grad_scaled": (
            "espnet_multiblank.espnet.frontends.grad_scaled:GradScaledPreEncoder"
        )
    },
    "encoder": {
        "chunk_conformer": (
            "espnet_multiblank.espnet.encoders.chunk_conformer:ChunkConformerEncoder"
        )
    },
}

#: ``model`` choice names of the plug-in's models: configs naming one get the
#: plug-in's config checks (training.task) and searches (inference.search_choice)
PLUGIN_MODELS = tuple(ENTRIES["model"])


def _load(path: str) -> Type:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def register() -> None:
    """Add the plug-in's classes to ``espnet2.tasks.asr``'s class choices.

    Also keeps NaN epochs out of ESPnet's best-model selection in this process
    (:mod:`~espnet_multiblank.espnet.registration.best_model_guard`). Idempotent and
    thread-safe; cheap after the first call. Raises RuntimeError when another class
    already owns one of the names, ImportError (naming the supported versions) when
    the installed ESPnet is not one the plug-in can work with
    (:func:`~espnet_multiblank.espnet.compat.check_espnet`; an untested version
    gets a warning).
    """
    import importlib

    from espnet_multiblank.espnet.compat import check_espnet
    from espnet_multiblank.espnet.registration import quiet  # noqa: F401  (first)

    check_espnet()
    asr = importlib.import_module("espnet2.tasks.asr")
    from espnet_multiblank.espnet.registration import best_model_guard

    with _LOCK:
        best_model_guard.install()
        for kind, entries in ENTRIES.items():
            choices = getattr(asr, f"{kind}_choices")
            for name, path in entries.items():
                cls = _load(path)
                current = choices.classes.get(name)
                if current is cls:
                    continue
                if current is not None and (
                    current.__module__,
                    current.__qualname__,
                ) != (cls.__module__, cls.__qualname__):
                    raise RuntimeError(
                        f"espnet-multiblank: {kind} choice {name!r} is already taken "
                        f"by {current.__module__}.{current.__qualname__}"
                    )
                if choices.base_type is not None and not issubclass(
                    cls, choices.base_type
                ):  # pragma: no cover - guards against ESPnet API changes
                    raise TypeError(f"{cls} is not a {choices.base_type}")
                choices.classes[name] = cls


def is_registered() -> bool:
    """True when every plug-in class is selectable in this process (does not import
    ESPnet: False when ``espnet2.tasks.asr`` has not been imported yet)."""
    import sys

    asr = sys.modules.get("espnet2.tasks.asr")
    if asr is None:
        return False
    for kind, entries in ENTRIES.items():
        choices = getattr(asr, f"{kind}_choices", None)
        if choices is None or any(name not in choices.classes for name in entries):
            return False
    return True
