"""Call ``espnet_multiblank.register()`` right after ``espnet2.tasks.asr`` is imported.

The ``.pth`` file written by :mod:`espnet_multiblank.espnet.autoregister` holds only a
tiny bootstrap (:func:`espnet_multiblank.espnet.autoregister.bootstrap_source`): at
interpreter start-up it puts one finder at the front of ``sys.meta_path`` and imports
nothing. Each later import costs that finder one string comparison until
``espnet2.tasks.asr`` is imported; then it removes itself and hands over to
:func:`find_and_wrap` here, which wraps the module's loader so that :func:`register_now`
runs once the module has executed.

:func:`install_hook` installs an equivalent finder from inside a running process.
Set ``ESPNET_MULTIBLANK_NO_AUTOREGISTER=1`` to disable both.
"""

import os
import sys

TARGET = "espnet2.tasks.asr"
ENV_DISABLE = "ESPNET_MULTIBLANK_NO_AUTOREGISTER"
TAG = "espnet_multiblank"


def register_now():
    """``register()``, turning any failure into a warning (never break ESPnet)."""
    try:
        from espnet_multiblank.espnet.registration import register

        register()
    except Exception as e:
        import warnings

        warnings.warn(
            f"espnet-multiblank: automatic registration failed ({e!r}); call "
            "espnet_multiblank.register() before building the ESPnet parser",
            RuntimeWarning,
            stacklevel=2,
        )


class _RegisteringLoader:
    """Delegates to the real loader; registers once the module has executed."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._callback()

    def __getattr__(self, name):
        return getattr(self._loader, name)


def uninstall() -> None:
    """Remove every plug-in finder from ``sys.meta_path``."""
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "tag", None) != TAG]


def find_and_wrap(fullname, path=None, target=None, callback=None):
    """The spec the other finders give for ``fullname``, with a loader that calls
    ``callback`` (default :func:`register_now`) after executing the module."""
    uninstall()
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _RegisteringLoader(spec.loader, callback or register_now)
            return spec
    return None


class EspnetMultiblankFinder:
    """In-process equivalent of the ``.pth`` bootstrap finder."""

    tag = TAG

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        return find_and_wrap(fullname, path, target)


def install_hook() -> bool:
    """Install the finder (or register at once if ESPnet's ASR task is already
    imported). Returns False when disabled by the environment."""
    if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return False
    if TARGET in sys.modules:
        register_now()
        return True
    if not any(getattr(f, "tag", None) == TAG for f in sys.meta_path):
        sys.meta_path.insert(0, EspnetMultiblankFinder)
    return True
