"""Encoders that a training config selects (``encoder: chunk_conformer``).

* :mod:`~espnet_multiblank.espnet.encoders.chunk_conformer`: ESPnet's conformer with
  chunk-masked self-attention, causal convolution and dynamic chunk training: one
  model decodes offline at full context and streaming at a chunk size chosen when
  decoding;
* :mod:`~espnet_multiblank.espnet.encoders.chunk_layers`: its layers (causal
  convolution module, conformer block) and their chunk-by-chunk forward with caches;
* :mod:`~espnet_multiblank.espnet.encoders.chunk_masks`: the chunk attention masks
  and the chunk sizes of dynamic chunk training.

Imports :mod:`~espnet_multiblank.espnet.batch_exact` (masked batch norm, and to
declare the encoder padding-invariant) and ESPnet.
"""
