"""Install a ``.pth`` start-up hook that registers the plug-in in every process.

With ``espnet_multiblank_autoregister.pth`` in ``site-packages`` every Python process
of that environment registers the plug-in's classes right after it imports
``espnet2.tasks.asr`` (stock ``python -m espnet2.bin.asr_train`` /
``espnet2.bin.asr_inference``, ``--collect_stats`` jobs, DDP workers started with
``spawn``, ``ASRTask.build_model_from_file`` in notebooks), and makes
``espnet2.bin.asr_inference`` decode the plug-in's models with the plug-in's searches.
Processes that never import ESPnet pay for one tiny ``exec`` at start-up (see
:mod:`._hook`).

Usage::

    python -m espnet_multiblank.espnet.autoregister install    # into site-packages
    python -m espnet_multiblank.espnet.autoregister uninstall
    python -m espnet_multiblank.espnet.autoregister status
    python -m espnet_multiblank.espnet.autoregister write DIR   # e.g. a build dir

This module uses only the standard library and can be loaded by file path (from
``setup.py``) without importing the package.
"""

import argparse
import marshal
import os
import sys
import sysconfig
from typing import Optional

PTH_NAME = "espnet_multiblank_autoregister.pth"

#: Executed at every interpreter start-up: keep it tiny (no imports beyond ``os`` and
#: ``sys``, which ``site`` has already imported). Mirrors ``_hook.install_hook``.
_BOOTSTRAP = """\
import os, sys
if os.environ.get('ESPNET_MULTIBLANK_NO_AUTOREGISTER', '') in ('', '0'):
    class EspnetMultiblankBootstrap:
        tag = 'espnet_multiblank'
        targets = {targets!r}

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name not in cls.targets:
                return None
            try:
                from espnet_multiblank.espnet._hook import find_and_wrap
            except ImportError:  # package uninstalled, .pth left behind
                sys.meta_path[:] = [f for f in sys.meta_path
                                    if getattr(f, 'tag', None) != 'espnet_multiblank']
                return None
            return find_and_wrap(name, path, target, cls.targets)

    if not any(getattr(f, 'tag', None) == 'espnet_multiblank' for f in sys.meta_path):
        sys.meta_path.insert(0, EspnetMultiblankBootstrap)
"""

#: the modules the hook watches (see :mod:`._hook`)
TARGETS = ("espnet2.tasks.asr", "espnet2.bin.asr_inference")


def _targets(targets) -> tuple:
    return (targets,) if isinstance(targets, str) else tuple(targets)


def bootstrap_source(targets=TARGETS) -> str:
    """Source of the start-up bootstrap watching the modules ``targets``."""
    return _BOOTSTRAP.format(targets=_targets(targets))


def pth_line(targets=TARGETS) -> str:
    """The single ``import ...`` line of the ``.pth`` file.

    It embeds the bootstrap twice: marshalled for the interpreter that writes it (no
    compilation at each interpreter's start-up, which every Python process pays) and
    as source for any other interpreter. It does not need to know where the package
    is installed.
    """
    source = bootstrap_source(targets)
    filename = "<" + PTH_NAME + ">"
    blob = marshal.dumps(compile(source, filename, "exec"))
    return (
        "import sys; exec(__import__('marshal').loads({blob!r}) "
        "if sys.implementation.cache_tag == {tag!r} else "
        "compile({source!r}, {filename!r}, 'exec'), "
        "{{'__name__': 'espnet_multiblank_autoregister'}})\n"
    ).format(
        blob=blob,
        tag=sys.implementation.cache_tag,
        source=source,
        filename=filename,
    )


def default_dir() -> str:
    """``site-packages`` (purelib) of the running interpreter."""
    return sysconfig.get_paths()["purelib"]


def write(directory: Optional[str] = None) -> str:
    """Write the ``.pth`` file into ``directory`` (default: site-packages)."""
    directory = directory or default_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, PTH_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(pth_line())
    return path


def remove(directory: Optional[str] = None) -> bool:
    """Remove the ``.pth`` file; True if there was one."""
    path = os.path.join(directory or default_dir(), PTH_NAME)
    if os.path.exists(path):
        os.remove(path)
        return True
    return False


def main(cmd=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m espnet_multiblank.espnet.autoregister",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for action in ("install", "uninstall", "status"):
        p = sub.add_parser(action)
        p.add_argument("--dir", default=None, help="default: site-packages")
    p = sub.add_parser("write")
    p.add_argument("dir")
    args = parser.parse_args(cmd)
    directory = args.dir or default_dir()
    if args.action in ("install", "write"):
        print(f"wrote {write(directory)}")
    elif args.action == "uninstall":
        print(
            ("removed " if remove(directory) else "no ")
            + os.path.join(directory, PTH_NAME)
        )
    else:
        path = os.path.join(directory, PTH_NAME)
        if not os.path.exists(path):
            print(f"not installed ({path} missing)")
            return 1
        with open(path, encoding="utf-8") as f:
            current = f.read() == pth_line()
        print(f"installed: {path}" + ("" if current else " (outdated: reinstall)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
