"""Old import path of the CPU TDT driver: ``tdt_compute`` lives in
:mod:`espnet_multiblank.loss.cpu.driver` with the multi-blank one."""

from espnet_multiblank.loss.cpu.driver import tdt_compute  # noqa: F401
