"""CPU backend: fused Numba kernels (kernels.py: multi-blank, tdt_kernels.py: TDT;
driver.py: their drivers, one class)."""

from espnet_multiblank.loss.cpu.driver import compute, tdt_compute

__all__ = ["compute", "tdt_compute"]
