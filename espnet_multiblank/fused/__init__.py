"""The fused joint + transducer loss: the joint network's output layer and the loss
in one, exact, tile by tile, without a (B, T, U, V) tensor (``docs/fused.md``)."""

from espnet_multiblank.fused.api import FusedTransducerLoss, fused_transducer_loss

__all__ = ["FusedTransducerLoss", "fused_transducer_loss"]
