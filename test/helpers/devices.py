"""The devices the loss tests run on, as pytest parameters named ``device``.

* ``"cpu"``: the CPU (Numba's CPU kernels, the PyTorch backend);
* ``"sim"``: the CUDA kernels in Numba's CUDA simulator (and the fused loss's Triton
  kernels in Triton's interpreter). The simulator must be
  switched on before numba.cuda is imported and must not leak into other tests, so
  ``test/conftest.py`` runs every selected ``sim`` test, the same test function with
  the same parameters, in ONE pytest subprocess with ``NUMBA_ENABLE_CUDASIM=1`` and
  reports its outcome (passed, failed with the child's traceback, skipped) as the
  parent's. There the tensors are CPU tensors and the loss is routed to the CUDA
  kernels (:func:`route_cpu_tensors_to_cuda_kernels`);
* ``"cuda"``: a real GPU, skipped (with the reason) when there is none.

A test asks for the devices it supports with :func:`params`, and turns the name
into a torch device with :func:`torch_device`.
"""

import importlib.util
import os

import pytest

#: set (to the path of the report) in the simulator's pytest subprocess
SIM_REPORT_ENV = "ESPNET_MULTIBLANK_SIM_REPORT"
#: the JSON list of node ids the subprocess runs
SIM_SELECTION_ENV = "ESPNET_MULTIBLANK_SIM_SELECTION"


def in_simulator_process() -> bool:
    return bool(os.environ.get(SIM_REPORT_ENV))


def numba_cuda_installed() -> bool:
    """numba-cuda installed? (looked up without importing it)"""
    return importlib.util.find_spec("numba_cuda") is not None


def gpu_unavailable_reason():
    """Why no real-GPU test can run here, or None."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "NUMBA_ENABLE_CUDASIM is set: no real GPU run"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    if not numba_cuda_installed():
        return "numba-cuda is not installed"
    try:
        from numba import cuda

        if not cuda.is_available():
            return "numba.cuda sees no GPU (driver / NVVM missing?)"
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"numba.cuda unusable: {e}"
    return None


_GPU_REASON = gpu_unavailable_reason()
gpu = pytest.mark.skipif(_GPU_REASON is not None, reason=str(_GPU_REASON))
simulator = pytest.mark.skipif(
    not numba_cuda_installed(), reason="numba-cuda is not installed (the simulator)"
)
# the simulator's subprocess takes minutes as a whole: "-m 'not slow'" leaves it out
_MARKS = {"cpu": (), "sim": (simulator, pytest.mark.slow), "cuda": (gpu,)}


def marks(name: str):
    """The pytest marks of a device's parameters (skips where it is missing)."""
    return _MARKS[name]


def params(*names, backends=None):
    """pytest parameters for ``device`` (and ``backend``, when ``backends`` is
    given: the simulator runs the Numba backend only, PyTorch on CPU tensors being
    the CPU's test)."""
    out = []
    for name in names:
        if backends is None:
            out.append(pytest.param(name, marks=_MARKS[name], id=name))
            continue
        for backend in backends:
            if name == "sim" and backend != "numba":
                continue
            out.append(
                pytest.param(name, backend, marks=_MARKS[name], id=f"{name}-{backend}")
            )
    return out


def torch_device(name: str) -> str:
    """The torch device of a test device (the simulator takes CPU tensors)."""
    return "cuda" if name == "cuda" else "cpu"


def route_cpu_tensors_to_cuda_kernels(monkeypatch) -> None:
    """In the simulator process: every lattice family's kernel for CPU tensors is its
    CUDA driver (``numba.cuda`` simulated), so the API runs the CUDA kernels."""
    from espnet_multiblank.loss.families import LatticeFamily

    original = LatticeFamily.kernel

    def kernel(self, device):
        return self.cuda_driver() if device.type == "cpu" else original(self, device)

    monkeypatch.setattr(LatticeFamily, "kernel", kernel)
