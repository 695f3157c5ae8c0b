"""ESPnet's stock ``espnet2.bin.asr_inference`` with the plug-in's models decoded right.

ESPnet's ``Speech2Text`` builds its own ``BeamSearchTransducer``, which emits a
multi-blank model's big blanks as labels (its greedy search knows only one blank):
without help, ``python -m espnet2.bin.asr_inference`` turns the plug-in's multi-blank
models into big-blank tokens and repeated labels, silently. The start-up hook
(:mod:`espnet_multiblank.espnet._hook`) calls :func:`wrap` on that module's namespace
as soon as it has executed:

* ``Speech2Text`` becomes a subclass (same name, same arguments) that decodes the
  plug-in's models, and any transducer model whose decode config asks for a plug-in
  search type (``mb_greedy``, ``mb_beam``, ``tdt_greedy``, ``tdt_beam``,
  ``max_sym_per_frame``), with the plug-in's searches, chosen by ``transducer_conf``
  exactly as in the plug-in's own entry point; other models decode exactly as ESPnet
  does (Python users of ``Speech2Text`` get the same);
* ``inference``, for the models and configs above, runs the plug-in's decoding loop
  (:func:`espnet_multiblank.espnet.inference.loop.inference`, with ``"entry_point":
  "espnet2.bin.asr_inference"`` in ``decoding_stats.json``): ``--batch_size N``
  decodes N utterances at a time with the same hypotheses as one at a time
  (ESPnet's own loop refuses transducers there), an utterance that cannot be decoded
  is reported by its key and the run goes on, and the process ends with exit status
  1 when one failed (``--allow_failed_utterances true``: 0), as the plug-in's entry
  point does; everything else runs ESPnet's loop (which batches attention / CTC
  models from ESPnet 202611 on, and refuses ``--batch_size > 1`` in 202511);
* ``get_parser`` gets the plug-in's additions (``--dtype bfloat16``,
  ``--allow_failed_utterances``, ``--write_ctm``, the streaming options), and help
  texts that argparse cannot format (ESPnet 202611's ``--ctc_window_margin`` help
  says "3.19% CER", so its own ``--help`` raises ``ValueError: unsupported format
  character``) get their stray ``%`` escaped.
"""

import functools

from espnet_multiblank.espnet.inference.arguments import (
    add_plugin_arguments,
    escape_stray_percents,
)
from espnet_multiblank.espnet.inference.search_choice import plugin_decodes
from espnet_multiblank.espnet.inference.speech2text import plugin_speech2text

STOCK_NAME = "espnet2.bin.asr_inference"


def _wrap_inference(inference, namespace: dict):
    @functools.wraps(inference)
    def wrapped(*args, **kwargs):
        allow_failed = kwargs.pop("allow_failed_utterances", False)
        if args or not plugin_decodes(
            kwargs.get("asr_train_config"), kwargs.get("transducer_conf")
        ):
            if kwargs.pop("write_ctm", False):
                raise ValueError(
                    "--write_ctm: word times come from the plug-in's searches; this "
                    "model and decode config run ESPnet's"
                )
            return inference(*args, **kwargs)
        from espnet_multiblank.espnet.inference.loop import (
            exit_status,
        )
        from espnet_multiblank.espnet.inference.loop import (
            inference as plugin_inference,
        )

        stats = plugin_inference(
            entry_point=STOCK_NAME,
            speech2text_class=namespace["Speech2Text"],
            **kwargs,
        )
        status = exit_status(stats, allow_failed)
        if status:
            raise SystemExit(status)
        return None

    wrapped.espnet_inference = inference
    return wrapped


def _wrap_get_parser(get_parser):
    @functools.wraps(get_parser)
    def wrapped(*args, **kwargs):
        parser = get_parser(*args, **kwargs)
        add_plugin_arguments(parser)
        escape_stray_percents(parser)
        return parser

    wrapped.espnet_get_parser = get_parser
    return wrapped


def wrap(namespace: dict) -> None:
    """Wrap ``Speech2Text``, ``inference`` and ``get_parser`` of an executed
    ``espnet2.bin.asr_inference`` namespace (idempotent)."""
    speech2text = namespace.get("Speech2Text")
    if speech2text is None:
        raise RuntimeError("espnet2.bin.asr_inference has no Speech2Text to wrap")
    if getattr(speech2text, "espnet_speech2text", None) is None:
        namespace["Speech2Text"] = plugin_speech2text(speech2text, "plugin")
    inference = namespace.get("inference")
    if inference is not None and not hasattr(inference, "espnet_inference"):
        namespace["inference"] = _wrap_inference(inference, namespace)
    get_parser = namespace.get("get_parser")
    if get_parser is not None and not hasattr(get_parser, "espnet_get_parser"):
        namespace["get_parser"] = _wrap_get_parser(get_parser)
