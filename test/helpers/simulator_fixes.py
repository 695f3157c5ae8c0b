"""A fix for Numba's CUDA simulator, installed in the simulator's pytest subprocess
(``conftest.py``).

The simulator runs a block's threads as Python threads. ``cuda.shared.array`` hands
every thread of a launch one array per declaring line, allocated by the first thread
that gets there: a look-up, an allocation and a store (``FakeCUDAShared.array``),
without a lock. Two threads that interleave between the look-up and the store each
get their own array, and the block's reduction in shared memory then reads slots
that the other threads wrote elsewhere. The kernels' results come out wrong now and
then, in a way no GPU produces: a row's log-sum-exp, and so a cost, changed (seen in
``test_loss_kernels.py``, ``mb_d24_varlen``, about once in five runs of the file
while the CPU tests ran beside it). The look-up walks the stack
(``traceback.extract_stack``), which makes the window wide.

:func:`make_shared_arrays_thread_safe` puts the look-up, allocation and store under
one lock, with the simulator's own keying (the declaring frame's file and line). The
kernels are unchanged, and a kernel that uses a shared array wrongly (a missing
``syncthreads``, a slot read that nobody wrote) still fails.
"""

import sys
import threading
import traceback

_LOCK = threading.Lock()


def make_shared_arrays_thread_safe() -> None:
    """Replace ``FakeCUDAShared.array`` of numba-cuda's simulator (imported here:
    call it only where ``NUMBA_ENABLE_CUDASIM=1``) with a locked one. Raises
    RuntimeError when the simulator no longer looks as this fix expects."""
    try:
        from numba.cuda.simulator import kernelapi
    except ImportError:  # no simulator: the sim tests are skipped
        return

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "thread_safe", False):
        return
    original = shared.array
    probe = shared(0)
    if not isinstance(getattr(probe, "_allocations", None), dict):
        raise RuntimeError(
            "numba-cuda's simulator changed (FakeCUDAShared has no _allocations "
            "dict): review test/helpers/simulator_fixes.py"
        )

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            # dynamic shared memory (one buffer for all, no look-up), or the
            # simulator's error for an alignment
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):  # as the simulator converts
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        # the simulator's key: the file and line that declare the array
        frame = traceback.extract_stack(sys._getframe(1), limit=1)[-1]
        key = (frame.filename, frame.lineno)
        with _LOCK:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = kernelapi.np.empty(shape, dtype)
        return res

    array.thread_safe = True
    shared.array = array
