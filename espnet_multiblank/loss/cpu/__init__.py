"""CPU backend: fused Numba kernels (see kernels.py for the recursion)."""

from espnet_multiblank.loss.cpu.driver import compute

__all__ = ["compute"]
