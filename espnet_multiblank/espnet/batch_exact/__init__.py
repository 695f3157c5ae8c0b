"""Batch-exact encoding: each utterance of a padded batch encoded as if alone.

* :mod:`~espnet_multiblank.espnet.batch_exact.exact_encoding`: ``make_batch_exact``
  inspects a model's path from the waveform to the encoder output and swaps in
* :mod:`~espnet_multiblank.espnet.batch_exact.exact_layers`: the padding-invariant
  versions of the ESPnet layers that mix padding into valid frames.

Used by the model (training) and by inference (decoding, any ESPnet model); it
imports only ESPnet and :mod:`~espnet_multiblank.espnet.frontends` (to look through
the gradient-scaling wrappers).
"""
