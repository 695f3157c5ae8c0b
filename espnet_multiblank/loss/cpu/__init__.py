"""CPU backend: fused Numba kernels (kernels.py: multi-blank, tdt_kernels.py: TDT;
common.py: what they share; driver.py: their drivers, one class, and the thread
rule and serial twins of parallel kernels that other CPU kernels of the package use).

Numba's on-disk cache of the kernels is stamped with their helpers' sources
(``numba_cache.py``) before any kernel module is imported.
"""

from espnet_multiblank.loss.cpu import numba_cache

numba_cache.install()

from espnet_multiblank.loss.cpu.driver import (  # noqa: E402
    compute,
    pick_parallel,
    serial_twin,
    tdt_compute,
)

__all__ = ["compute", "pick_parallel", "serial_twin", "tdt_compute"]
