"""Start-up hook: register the plug-in, and wrap ESPnet's stock inference.

Two ESPnet modules are watched:

* ``espnet2.tasks.asr``: right after it has executed, :func:`register_now` adds the
  plug-in's classes to its choices (``model: multiblank_espnet`` ...);
* ``espnet2.bin.asr_inference``: right after it has executed, its ``Speech2Text`` is
  replaced by a subclass that decodes the plug-in's models with the plug-in's searches
  (:mod:`espnet_multiblank.espnet.inference.stock_inference`). ``python -m
  espnet2.bin.asr_inference`` runs that module as ``__main__`` through ``runpy``,
  which asks the loader for the module's code instead of executing it: the loader then
  hands out a stub (:func:`run_as_main`) that executes the real code without its final
  ``main()`` call, wraps the namespace, and calls ``main()``.

The ``.pth`` file written by :mod:`espnet_multiblank.espnet.autoregister` holds only a
tiny bootstrap (:func:`espnet_multiblank.espnet.autoregister.bootstrap_source`): at
interpreter start-up it puts one finder at the front of ``sys.meta_path`` and imports
nothing. Each later import costs that finder one membership test until a watched
module is imported; then it hands over to :func:`find_and_wrap` here, which wraps the
module's loader; the finder goes once every watched module has been executed.

:func:`install_hook` installs the same finder from inside a running process.
Set ``ESPNET_MULTIBLANK_NO_AUTOREGISTER=1`` to disable both.
"""

import os
import sys
from typing import Dict

TARGET = "espnet2.tasks.asr"
INFERENCE_TARGET = "espnet2.bin.asr_inference"
ENV_DISABLE = "ESPNET_MULTIBLANK_NO_AUTOREGISTER"
TAG = "espnet_multiblank"

#: real code of a watched module that runpy is about to run as __main__
_PENDING_MAIN: Dict[str, object] = {}


def _warn(what: str, error: Exception) -> None:
    import warnings

    warnings.warn(
        f"espnet-multiblank: {what} failed ({error!r})", RuntimeWarning, stacklevel=3
    )


def register_now():
    """``register()``, turning any failure into a warning (never break ESPnet)."""
    try:
        from espnet_multiblank.espnet.registration import register

        register()
    except Exception as e:
        _warn(
            "automatic registration (call espnet_multiblank.register() before "
            "building the ESPnet parser)",
            e,
        )


def quiet_espnet_import() -> None:
    """Import g2p_en with nltk's downloads off before ESPnet would import it (see
    :mod:`~espnet_multiblank.espnet.registration.quiet`): a stock ESPnet entry point
    on a machine without network then prints no nltk_data errors either."""
    try:
        from espnet_multiblank.espnet.registration import quiet  # noqa: F401
    except Exception as e:  # never break ESPnet
        _warn("importing g2p_en without nltk downloads", e)


def wrap_inference_now(namespace: dict) -> None:
    """Wrap ``Speech2Text`` (and ``inference``) in an executed
    ``espnet2.bin.asr_inference`` namespace; a failure becomes a warning."""
    try:
        from espnet_multiblank.espnet.inference.stock_inference import wrap

        wrap(namespace)
    except Exception as e:
        _warn(
            "wrapping espnet2.bin.asr_inference (use python -m "
            "espnet_multiblank.bin.asr_inference for the plug-in's models)",
            e,
        )


def run_as_main(namespace: dict, fullname: str) -> None:
    """What ``python -m <watched module>`` executes instead of the module's code.

    Executes the real code in ``namespace`` under the module's own name (so its
    ``if __name__ == "__main__": main()`` does not fire yet; ``sys.modules`` lists the
    module under both names), wraps it, restores ``__name__`` and calls ``main()``.
    """
    code = _PENDING_MAIN.pop(fullname)
    quiet_espnet_import()
    name = namespace["__name__"]
    # the module object runs under its own name too (typeguard's @typechecked reads
    # the source of sys.modules[function.__module__]); later imports of that name get
    # this module instead of executing a second copy
    sys.modules.setdefault(fullname, sys.modules[name])
    namespace["__name__"] = fullname
    try:
        exec(code, namespace)
    finally:
        namespace["__name__"] = name
    wrap_inference_now(namespace)
    if name == "__main__":
        main = namespace.get("main")
        if not callable(main):
            raise RuntimeError(f"{fullname} has no main() to run")
        main()


_MAIN_STUB = (
    "import espnet_multiblank.espnet._hook as _mb_hook\n"
    "_mb_hook.run_as_main(globals(), {name!r})\n"
)


class _WrappingLoader:
    """Delegates to the real loader; runs the plug-in's step once the module has
    executed (``exec_module``), or serves :func:`run_as_main` to runpy
    (``get_code``)."""

    def __init__(self, loader, fullname: str, callback=None):
        self._loader = loader
        self._fullname = fullname
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        _forget(self._fullname)
        quiet_espnet_import()
        self._loader.exec_module(module)
        if self._fullname == INFERENCE_TARGET:
            wrap_inference_now(module.__dict__)
        elif self._callback is not None:
            self._callback()
        else:
            register_now()

    def get_code(self, fullname):
        code = self._loader.get_code(fullname)
        if fullname != INFERENCE_TARGET or code is None:
            return code
        _forget(fullname)
        _PENDING_MAIN[fullname] = code
        return compile(_MAIN_STUB.format(name=fullname), f"<{TAG} hook>", "exec")

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _plugin_finder(finder) -> bool:
    return getattr(finder, "tag", None) == TAG


def uninstall() -> None:
    """Remove every plug-in finder from ``sys.meta_path``."""
    sys.meta_path[:] = [f for f in sys.meta_path if not _plugin_finder(f)]


def _forget(fullname: str) -> None:
    """Stop watching ``fullname`` (it is being executed); drop idle finders."""
    kept = []
    for finder in sys.meta_path:
        if isinstance(finder, EspnetMultiblankFinder):
            finder.targets = tuple(t for t in finder.targets if t != fullname)
            if not finder.targets:
                continue
        kept.append(finder)
    sys.meta_path[:] = kept


def find_and_wrap(fullname, path=None, target=None, watch=None, callback=None):
    """The spec the other finders give for ``fullname``, with a wrapping loader.

    The calling finder (the ``.pth`` bootstrap or an :class:`EspnetMultiblankFinder`)
    is replaced by an :class:`EspnetMultiblankFinder` watching the modules of
    ``watch`` not imported yet; each leaves its list when its loader runs it.

    Args:
        fullname, path, target: ``find_spec``'s arguments.
        watch: The modules the calling finder watched (default: both of this
            module's).
        callback: Run after ``fullname`` has executed instead of :func:`register_now`
            (not for the inference module).
    """
    if watch is None:
        watch = (TARGET, INFERENCE_TARGET)
    uninstall()
    remaining = tuple(t for t in watch if t not in sys.modules)
    spec = None
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _WrappingLoader(spec.loader, fullname, callback)
            break
    if remaining:
        sys.meta_path.insert(0, EspnetMultiblankFinder(remaining))
    return spec


class EspnetMultiblankFinder:
    """In-process equivalent of the ``.pth`` bootstrap finder.

    Attributes:
        targets: The module names it watches.
    """

    tag = TAG

    def __init__(self, targets):
        self.targets = tuple(targets)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.targets:
            return None
        return find_and_wrap(fullname, path, target, self.targets)


def install_hook() -> bool:
    """Install the finder; act at once for watched modules already imported.

    Returns False when disabled by the environment.
    """
    if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return False
    pending = []
    for name in (TARGET, INFERENCE_TARGET):
        module = sys.modules.get(name)
        if module is None:
            pending.append(name)
        elif name == INFERENCE_TARGET:
            wrap_inference_now(module.__dict__)
        else:
            register_now()
    if pending and not any(_plugin_finder(f) for f in sys.meta_path):
        sys.meta_path.insert(0, EspnetMultiblankFinder(pending))
    return True
