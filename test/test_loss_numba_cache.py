"""Numba's on-disk cache of the kernels notices a change in a helper module
(``espnet_multiblank/loss/cpu/numba_cache.py``).

Numba stamps a cached function with its own file only: a kernel whose helper (in
another module) changed would be loaded stale. A throw-away package in a temporary
folder shows the stamp at work, in fresh processes: a kernel calling a helper is
compiled and cached, loaded from the cache, then the helper alone is edited and the
kernel must give the new result. The package's own kernels get the stamped locator.
"""

import os
import subprocess
import sys
import textwrap

from espnet_multiblank.loss.cpu import numba_cache

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUN = textwrap.dedent("""
    import sys
    from espnet_multiblank.loss.cpu import numba_cache
    numba_cache.install(sys.argv[1])
    from cachepkg.kernel import kernel
    print(kernel(), kernel.stats.cache_hits[kernel.signatures[0]])
    """)


def _write(path, text):
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def _run(folder):
    """(result, cache hits) of the kernel in a fresh process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([folder, _ROOT, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _RUN, os.path.join(folder, "cachepkg")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    value, hits = out.stdout.split()
    return int(value), int(hits)


def test_a_changed_helper_invalidates_the_cached_kernel(tmp_path):
    pkg = tmp_path / "cachepkg"
    pkg.mkdir()
    _write(pkg / "__init__.py", "")
    helper = """
        from numba import njit

        @njit(cache=True)
        def value():
            return {}
        """
    _write(pkg / "helper.py", helper.format(1))
    _write(
        pkg / "kernel.py",
        """
        from numba import njit

        from cachepkg.helper import value

        @njit(cache=True)
        def kernel():
            return value() + 10
        """,
    )
    kernel_stat = os.stat(pkg / "kernel.py")
    assert _run(str(tmp_path)) == (11, 0)  # compiled, written to the cache
    assert _run(str(tmp_path)) == (11, 1)  # loaded from the cache
    _write(pkg / "helper.py", helper.format(2))  # the helper alone changes
    os.utime(pkg / "kernel.py", ns=(kernel_stat.st_atime_ns, kernel_stat.st_mtime_ns))
    assert _run(str(tmp_path)) == (12, 0)  # recompiled, not the stale 11
    assert _run(str(tmp_path)) == (12, 1)


def test_the_package_kernels_are_stamped_with_their_helpers():
    from espnet_multiblank.loss.cpu import kernels, tdt_kernels

    for kernel in (kernels.rows_forward, tdt_kernels.tdt_lattice):
        locator = kernel._cache._impl._locator
        assert isinstance(locator, numba_cache.HelperStampedLocator)
    root = numba_cache.PACKAGE_DIR
    imported = numba_cache._imported_files(root, kernels.__file__)
    names = {os.path.relpath(p, root) for p in imported}
    assert {"loss/cpu/row_ops.py", "loss/cpu/common.py"} <= names, names
    # followed further: row_ops reads flush.py's constant
    flush = os.path.join(root, "loss", "flush.py")
    assert flush in numba_cache._imported_files(
        root, os.path.join(root, "loss", "cpu", "row_ops.py")
    )
