"""Old import path of the CUDA TDT launch layer: ``tdt_compute`` lives in
:mod:`espnet_multiblank.loss.cuda.launch` with the multi-blank one."""

from espnet_multiblank.loss.cuda.launch import tdt_compute  # noqa: F401
