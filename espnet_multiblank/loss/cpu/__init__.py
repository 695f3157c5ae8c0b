"""CPU backend: fused Numba kernels (kernels.py: multi-blank, tdt_kernels.py: TDT;
common.py: what they share; driver.py: their drivers, one class).

Numba's on-disk cache of the kernels is stamped with their helpers' sources
(``numba_cache.py``) before any kernel module is imported.
"""

from espnet_multiblank.loss.cpu import numba_cache

numba_cache.install()

from espnet_multiblank.loss.cpu.driver import compute, tdt_compute  # noqa: E402

__all__ = ["compute", "tdt_compute"]
