"""Which per-tile stages (gather, extract, apply, scatter) run a batch: the choice of
``tile_backend``.

* ``"numba"``: the Numba CPU tile kernels (``cpu_tile_ops.py``), beside the Numba CPU
  lattice (CPU tensors, ``backend`` "auto" or "numba");
* ``"triton"``: Triton kernels (``triton_tile_ops.py``): CUDA tensors, or CPU tensors
  under Triton's interpreter (``TRITON_INTERPRET=1``);
* ``"torch"``: torch operations (``torch_tile_ops.py``), on any device;
* ``"auto"``: the Numba kernels with the Numba CPU lattice; Triton with the Numba
  CUDA lattice where Triton can run (CUDA tensors of a device of compute capability
  8.0 or newer, or the interpreter), else torch operations.
"""

import importlib.util

import torch

from espnet_multiblank.fused.torch_tile_ops import TorchTileOps

TILE_BACKENDS = ("auto", "numba", "triton", "torch")

#: the oldest GPUs "auto" gives Triton kernels (Ampere: what Triton is built and
#: tested for; older GPUs keep the torch operations)
MIN_TRITON_CAPABILITY = (8, 0)


def check_tile_backend(tile_backend) -> str:
    if not isinstance(tile_backend, str) or tile_backend not in TILE_BACKENDS:
        raise ValueError(
            f"tile_backend must be one of {TILE_BACKENDS}, got {tile_backend!r}"
        )
    return tile_backend


def triton_unavailable(device: torch.device):
    """Why the Triton tile kernels cannot run on tensors of ``device`` (None: they
    can)."""
    from espnet_multiblank.fused.triton_tile_ops import interpreting

    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (torch's CUDA wheels bring it)"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreting():
        return None
    return (
        f"Triton kernels run on CUDA tensors (or on CPU tensors with "
        f"TRITON_INTERPRET=1 set before triton is imported), got enc on {device}"
    )


def _triton_by_default(device: torch.device) -> bool:
    if triton_unavailable(device) is not None:
        return False
    if device.type != "cuda":  # the interpreter
        return True
    return torch.cuda.get_device_capability(device) >= MIN_TRITON_CAPABILITY


def tile_ops_for(kernel, tile_backend: str, device: torch.device):
    """The tile stages' class (a :class:`~espnet_multiblank.fused.tile_ops.TileOps`)
    for ``tile_backend`` (checked) with the lattice ``kernel`` (a device's Numba
    driver, or None for the PyTorch lattice) on ``device``.

    Raises:
        ValueError naming ``tile_backend`` when it cannot run there.
    """
    on_cpu_kernels = kernel is not None and kernel.device_type == "cpu"
    if tile_backend == "auto":
        if on_cpu_kernels:
            tile_backend = "numba"
        elif kernel is not None and _triton_by_default(device):
            tile_backend = "triton"
        else:
            tile_backend = "torch"
    if tile_backend == "numba":
        if not on_cpu_kernels:
            raise ValueError(
                "tile_backend='numba' runs on CPU tensors with the Numba lattice "
                f"(backend 'auto' or 'numba'), got enc on {device} with "
                f"{'the PyTorch lattice' if kernel is None else 'CUDA kernels'}; "
                "use tile_backend 'auto', 'triton' or 'torch'"
            )
        from espnet_multiblank.fused.cpu_tile_ops import CpuTileOps  # imports Numba

        return CpuTileOps
    if tile_backend == "triton":
        reason = triton_unavailable(device)
        if reason is not None:
            raise ValueError(f"tile_backend='triton': {reason}")
        from espnet_multiblank.fused.triton_tile_ops import TritonTileOps

        return TritonTileOps
    return TorchTileOps
