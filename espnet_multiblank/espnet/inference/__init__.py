"""Decoding ESPnet models with the plug-in's searches (both inference entry points).

* :mod:`~espnet_multiblank.espnet.inference.search`: the transducer search a decode
  config chooses (``transducer_conf.search_type``), the decoder's blank fixed.
* :mod:`~espnet_multiblank.espnet.inference.lm_fusion`: ESPnet LMs and n-gram files
  as the searches' shallow-fusion LMs.
* :mod:`~espnet_multiblank.espnet.inference.speech2text`: ESPnet's ``Speech2Text``
  with those searches, decoding statistics and batched decoding; what it puts
  together: :mod:`~.search_choice` (which models and decode configs the plug-in
  decodes), :mod:`~.argument_checks`, :mod:`~.half_precision` (the frontend in
  float32), :mod:`~.batch_encoding` (a padded batch's encoder output),
  :mod:`~.results` (ESPnet's n-best tuples), :mod:`~.decoding_stats`.
* :mod:`~espnet_multiblank.espnet.inference.inputs`: the utterances of a run read one
  by one, and what cannot be decoded correctly refused with a reason.
* :mod:`~espnet_multiblank.espnet.inference.loop`: the decoding loop (``inference``),
  failed utterances reported by key; :mod:`~.stream_loop`: its ``--streaming true``
  run; :mod:`~.outputs`: what both write (ESPnet's output layout, the statistics,
  ``failed_utterances``, the CTM of ``--write_ctm``).
* :mod:`~espnet_multiblank.espnet.inference.arguments`: the entry points' additions to
  ESPnet's ``asr_inference`` parser.
* :mod:`~espnet_multiblank.espnet.inference.stock_inference`: ESPnet's stock
  ``espnet2.bin.asr_inference`` wrapped so that it decodes the plug-in's models right
  (the start-up hook calls it).

Imports the model, batch-exact encoding, registration (``PLUGIN_MODELS``) and
:mod:`espnet_multiblank.decoding`; nothing imports it but the entry points and the
start-up hook.
"""
