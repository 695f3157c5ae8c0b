"""Old import path of the TDT loss's API: :func:`tdt_loss` and :class:`TDTLoss` live in
:mod:`espnet_multiblank.loss.api` with the multi-blank ones (one loss path)."""

from espnet_multiblank.loss.api import TDTLoss, tdt_loss  # noqa: F401
