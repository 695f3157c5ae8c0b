"""The plug-in's additions to ESPnet's ``asr_inference`` parser, shared by both
entry points: ``python -m espnet_multiblank.bin.asr_inference`` and ESPnet's stock
``espnet2.bin.asr_inference`` once the start-up hook has wrapped its ``get_parser``
(:mod:`espnet_multiblank.espnet.inference.stock_inference`).

* ``--dtype`` also takes ``bfloat16``;
* ``--allow_failed_utterances`` (default false): exit status 0 even when some
  utterances could not be decoded (:func:`~.loop.exit_status`);
* ``--write_ctm`` (default false): also write ``<output_dir>/1best_recog/ctm``, the
  1-best's words with their start, duration and confidence (:mod:`.timestamps`).
"""

#: ``--dtype`` values (ESPnet's parser: float16, float32, float64)
DTYPES = ("float16", "bfloat16", "float32", "float64")


def add_plugin_arguments(parser) -> None:
    """Add the plug-in's arguments to ESPnet's ``asr_inference`` ``parser``."""
    from espnet2.utils.types import str2bool

    for action in parser._actions:
        if action.dest == "dtype":
            action.choices = list(DTYPES)
    parser.add_argument(
        "--allow_failed_utterances",
        type=str2bool,
        default=False,
        help="exit with status 0 even when some utterances could not be decoded "
        "(they are listed in <output_dir>/failed_utterances either way)",
    )
    parser.add_argument(
        "--write_ctm",
        type=str2bool,
        default=False,
        help="also write <output_dir>/1best_recog/ctm: '<key> 1 <start> <duration> "
        "<word> <confidence>' lines of the 1-best's words (the plug-in's searches)",
    )
