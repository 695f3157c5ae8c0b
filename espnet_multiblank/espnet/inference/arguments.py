"""The plug-in's additions to ESPnet's ``asr_inference`` parser, shared by both
entry points: ``python -m espnet_multiblank.bin.asr_inference`` and ESPnet's stock
``espnet2.bin.asr_inference`` once the start-up hook has wrapped its ``get_parser``
(:mod:`espnet_multiblank.espnet.inference.stock_inference`).

* ``--dtype`` also takes ``bfloat16``;
* ``--allow_failed_utterances`` (default false): exit status 0 even when some
  utterances could not be decoded (:func:`~.loop.exit_status`);
* ``--write_ctm`` (default false): also write ``<output_dir>/1best_recog/ctm``, the
  1-best's words with their start, duration and confidence (:mod:`.timestamps`).
* the options of ``--streaming true`` for transducer models
  (:mod:`~.stream_loop`): ``--sim_chunk_length``, ``--streaming_chunk_size``,
  ``--streaming_left_chunks``, ``--streaming_partial``.
"""

#: the streaming options (removed from the arguments before Speech2Text is built)
STREAMING_OPTIONS = (
    "sim_chunk_length",
    "streaming_chunk_size",
    "streaming_left_chunks",
    "streaming_partial",
)

#: ``--dtype`` values (ESPnet's parser: float16, float32, float64)
DTYPES = ("float16", "bfloat16", "float32", "float64")


def add_plugin_arguments(parser) -> None:
    """Add the plug-in's arguments to ESPnet's ``asr_inference`` ``parser``."""
    from espnet2.utils.types import str2bool

    for action in parser._actions:
        if action.dest == "dtype":
            action.choices = list(DTYPES)
    group = parser.add_argument_group("Streaming (transducers, --streaming true)")
    group.add_argument(
        "--sim_chunk_length",
        type=int,
        default=0,
        help="feed each utterance to the streaming decoder in pieces of this many "
        "samples (0: the whole utterance in one piece), as ESPnet's "
        "asr_inference_streaming; the final hypotheses do not depend on it",
    )
    group.add_argument(
        "--streaming_chunk_size",
        type=int,
        default=0,
        help="encoder frames per chunk of encoder: chunk_conformer (0: the model's "
        "encoder_conf.decoding_chunk_size, or 16 when that is 0); without "
        "--streaming: decode offline with that chunk mask (the streams' hypotheses)",
    )
    group.add_argument(
        "--streaming_left_chunks",
        type=int,
        default=None,
        help="chunks to the left a chunk attends to (default: the model's "
        "num_left_chunks; -1: all)",
    )
    group.add_argument(
        "--streaming_partial",
        choices=["provisional", "decided"],
        default="provisional",
        help="partial hypotheses: the offline result for the audio so far "
        "(provisional) or only the labels already decided, which never change",
    )
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
