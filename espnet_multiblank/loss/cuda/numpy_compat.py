"""Let numba-cuda compile kernels beside NumPy 2.5 and later.

NumPy 2.5 removed ``numpy.row_stack`` (an alias of ``numpy.vstack``, deprecated since
NumPy 2.0). numba-cuda 0.30.4 and earlier still register an overload for it when the
first kernel of a process is compiled, so with NumPy >= 2.5 every kernel compile
fails with ``AttributeError: module 'numpy' has no attribute 'row_stack'`` (seen on a
GPU machine with NumPy 2.5.2 and numba-cuda 0.30.4: no kernel, ours or ESPnet's Numba
loss, could run). Importing this module puts the alias back when, and only when,
NumPy lacks it; every module here that imports ``numba.cuda`` imports it first.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    # the same function numpy.row_stack was before its removal
    np.row_stack = np.vstack
