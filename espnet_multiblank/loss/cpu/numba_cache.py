"""Numba's on-disk cache of this package's kernels, kept fresh when a helper changes.

Numba stamps a cached kernel with its own source file's modification time and size
only. A kernel's machine code also holds the helpers it calls and the constants it
reads, from other modules (``row_ops.py``, ``common.py``, ``flush.py``...): edit one
of those alone and Numba would keep loading the old machine code until the
``__pycache__`` folders are cleared, so a developer could test stale kernels.

:func:`install` puts a cache locator in front of Numba's own ones. For a function
defined under one of the covered folders (this package's), it wraps the locator
Numba would have chosen (same cache folder, same file names) and adds to its stamp a
digest of the sources of the function's module and of every module of the package
that it imports, directly or through others (read from their import statements).
When any of them changes, the stamp changes and Numba recompiles the kernel, as it
does when the kernel's own file changes. Functions outside the covered folders are
left to Numba's locators.

It must run before the first kernel module is imported (``loss/cpu/__init__.py``
does it); it uses Numba's ``numba.core.caching`` (written against numba 0.68; a list
of locators set with ``NUMBA_CACHE_LOCATOR_CLASSES`` replaces it).
"""

import ast
import functools
import hashlib
import os
from typing import FrozenSet, List

from numba.core import caching

# numba >= 0.62 names it CacheImpl, earlier versions _CacheImpl
_CACHE_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl

#: the package's root folder (``espnet_multiblank/``)
PACKAGE_DIR = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

#: folders (absolute, normalised) whose functions get the stamp; their imports are
#: followed within each folder's top-level package
_ROOTS: List[str] = []


def _module_file(root: str, module: str):
    """The source file of ``module`` (a dotted name starting with the basename of
    ``root``), or None when it is not a file under ``root``."""
    parts = module.split(".")
    if parts[0] != os.path.basename(root):
        return None
    base = os.path.join(os.path.dirname(root), *parts)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _imported_files(root: str, path: str) -> FrozenSet[str]:
    """The files under ``root`` that the module at ``path`` imports (every import
    statement, in functions too)."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), filename=path)
    rel = os.path.relpath(path, os.path.dirname(root))
    package = os.path.dirname(rel).split(os.sep)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.append(mod)
            names += [f"{mod}.{a.name}" for a in node.names]  # submodules
    files = (_module_file(root, n) for n in names if n)
    return frozenset(f for f in files if f is not None)


@functools.lru_cache(maxsize=None)
def sources_digest(root: str, path: str) -> str:
    """sha256 over the source of ``path`` and of every file under ``root`` that it
    imports, directly or not (read once per process)."""
    seen, todo = set(), [os.path.abspath(path)]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo += [f for f in _imported_files(root, p) if f not in seen]
    h = hashlib.sha256()
    for p in sorted(seen):
        with open(p, "rb") as f:
            h.update(os.path.relpath(p, root).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def _root_of(py_file: str):
    path = os.path.abspath(py_file)
    for root in _ROOTS:
        if path.startswith(root + os.sep):
            return root
    return None


class HelperStampedLocator(caching._CacheLocator):
    """Numba's locator for a function, with the digest of its module's package
    imports added to the source stamp (module docstring)."""

    def __init__(self, inner, root: str, py_file: str):
        self._inner = inner
        self._root = root
        self._py_file = py_file

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_source_stamp(self):
        return (
            self._inner.get_source_stamp(),
            sources_digest(self._root, self._py_file),
        )

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    @classmethod
    def from_function(cls, py_func, py_file):
        root = _root_of(py_file)
        if root is None:
            return None
        for other in _CACHE_IMPL._locator_classes:
            if other is cls:
                continue
            inner = other.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, root, py_file)
        return None


def install(root: str = PACKAGE_DIR) -> None:
    """Stamp the cached functions defined under the folder ``root`` (a package's
    top folder: its imports are followed) with the digest of their helpers' sources;
    idempotent."""
    root = os.path.normpath(os.path.abspath(root))
    if root not in _ROOTS:
        _ROOTS.append(root)
    classes = _CACHE_IMPL._locator_classes
    if HelperStampedLocator not in classes:
        classes.insert(0, HelperStampedLocator)
