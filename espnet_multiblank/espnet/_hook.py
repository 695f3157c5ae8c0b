"""Start-up hook: call ``espnet_multiblank.register()`` right after
``espnet2.tasks.asr`` is imported, in any Python process.

The ``.pth`` file written by :mod:`espnet_multiblank.espnet.autoregister` executes this
source at interpreter start-up. It must stay cheap and self-contained: standard library
only, nothing imported until ``espnet2.tasks.asr`` itself is imported (at start-up it
only puts one finder at the front of ``sys.meta_path``; each later import costs that
finder one string comparison, until it fires once and removes itself).
Set ``ESPNET_MULTIBLANK_NO_AUTOREGISTER=1`` to disable it.
"""

import os
import sys

TARGET = "espnet2.tasks.asr"
ENV_DISABLE = "ESPNET_MULTIBLANK_NO_AUTOREGISTER"


def _register_now():
    try:
        from espnet_multiblank.espnet.registration import register

        register()
    except Exception as e:  # never break the user's import of ESPnet
        if isinstance(e, ModuleNotFoundError) and e.name == "espnet_multiblank":
            return  # package uninstalled, .pth left behind: nothing to register
        import warnings

        warnings.warn(
            f"espnet-multiblank: automatic registration failed ({e!r}); call "
            "espnet_multiblank.register() before building the ESPnet parser",
            RuntimeWarning,
            stacklevel=2,
        )


class _RegisteringLoader:
    """Delegates to the real loader; registers once the module has executed."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register_now()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class EspnetMultiblankFinder:
    """Meta-path finder that only reacts to ``espnet2.tasks.asr`` (then removes
    itself)."""

    tag = "espnet_multiblank"

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        cls.uninstall()
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None

    @classmethod
    def uninstall(cls):
        sys.meta_path[:] = [
            f for f in sys.meta_path if getattr(f, "tag", None) != cls.tag
        ]


def install_hook() -> bool:
    """Install the finder (or register at once if ESPnet's ASR task is already
    imported). Returns False when disabled by the environment."""
    if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return False
    if TARGET in sys.modules:
        _register_now()
        return True
    if not any(
        getattr(f, "tag", None) == EspnetMultiblankFinder.tag for f in sys.meta_path
    ):
        sys.meta_path.insert(0, EspnetMultiblankFinder)
    return True
