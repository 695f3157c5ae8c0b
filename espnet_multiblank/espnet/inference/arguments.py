"""The plug-in's additions to ESPnet's ``asr_inference`` parser, shared by both
entry points: ``python -m espnet_multiblank.bin.asr_inference`` and ESPnet's stock
``espnet2.bin.asr_inference`` once the start-up hook has wrapped its ``get_parser``
(:mod:`espnet_multiblank.espnet.inference.stock_inference`).

* ``--dtype`` also takes ``bfloat16``, ``--token_type`` also ``word``;
* ``--beam_size`` defaults to the search type's (:mod:`.search_defaults`);
* ``--allow_failed_utterances`` (default false): exit status 0 even when some
  utterances could not be decoded (:func:`~.loop.exit_status`);
* ``--write_ctm`` (default false): also write ``<output_dir>/1best_recog/ctm``, the
  1-best's words with their start, duration and confidence (:mod:`.timestamps`).
* the options of ``--streaming true`` for transducer models
  (:mod:`~.stream_loop`): ``--sim_chunk_length``, ``--streaming_chunk_size``,
  ``--streaming_left_chunks``, ``--streaming_partial``;
* help texts, with their defaults, for ESPnet's options that the plug-in relies on
  and ESPnet leaves unexplained or explains for its own searches
  (:data:`RELIED_ON_HELP`), and ``%`` escaped where argparse cannot format a text.

:func:`espnet_parser` builds ESPnet's parser from the source of its ``get_parser``
alone when it can: importing ``espnet2.bin.asr_inference`` imports every model class
of ESPnet, most of a ``--help``'s time. This module imports nothing heavy.
"""

import argparse
import ast
import builtins
import importlib.util
import os
import re
import textwrap
from typing import Callable, Optional

from espnet_multiblank.espnet.inference.search_defaults import (
    TRANSDUCER_CONF_KEYS,
    defaults_help,
)

#: the streaming options (removed from the arguments before Speech2Text is built)
STREAMING_OPTIONS = (
    "sim_chunk_length",
    "streaming_chunk_size",
    "streaming_left_chunks",
    "streaming_partial",
)

#: ``--dtype`` values (ESPnet's parser: float16, float32, float64)
DTYPES = ("float16", "bfloat16", "float32", "float64")

#: ``--token_type`` values (ESPnet's parser: char, bpe, None); ``word`` works with
#: ESPnet's word tokenizer (the digits recipe's models use it)
TOKEN_TYPES = ("char", "bpe", "word", None)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """ESPnet's formatter (help texts with their defaults), the epilog as written
    (the table of search defaults)."""

    def _fill_text(self, text, width, indent):
        return "".join(indent + line for line in text.splitlines(keepends=True))


def transducer_conf_epilog() -> str:
    """The ``--transducer_conf`` keys and every search type's defaults, for the end
    of ``--help``."""
    width = max(map(len, TRANSDUCER_CONF_KEYS))
    keys = [
        textwrap.fill(
            v,
            78,
            initial_indent=f"  {k:<{width}}  ",
            subsequent_indent=" " * (width + 4),
        )
        for k, v in TRANSDUCER_CONF_KEYS.items()
    ]
    return (
        "--transducer_conf keys (ESPnet's own search keys also go to its searches):\n"
        + "\n".join(keys)
        + "\n\nWhat a decode config (--config), --transducer_conf and --beam_size "
        "leave unset, the\nsearch type sets (the same for Python's "
        "MultiblankSpeech2Text; conf/decode/*.yaml\nadd only their variant keys):\n"
        + defaults_help()
        + "\n"
    )


#: help texts of ESPnet's options that the plug-in relies on, where ESPnet gives
#: none or one about its own searches (the others keep ESPnet's)
RELIED_ON_HELP = {
    "output_dir": "where the results go: 1best_recog/{text,token,token_int,score} "
    "(Nbest_recog with --nbest N), 1best_recog/ctm (--write_ctm), "
    "decoding_stats.json, failed_utterances",
    "data_path_and_name_and_type": "PATH,NAME,TYPE of a Kaldi-style 'key value' "
    "file, e.g. data/test/wav.scp,speech,sound (repeatable); the input named speech "
    "is decoded; type sound keeps each file's sample rate, checked against the "
    "model's",
    "key_file": "the keys to decode, one per line (None: those of the first "
    "--data_path_and_name_and_type file)",
    "allow_variable_data_keys": "ESPnet's data-loader option; the plug-in's "
    "decoding loop reads the keys of --key_file itself and does not use it",
    "num_workers": "ESPnet's data-loader workers; the plug-in's decoding loop reads "
    "one utterance at a time and does not use them",
    "dtype": "the model's dtype while decoding (float16, bfloat16: the frontend runs "
    "in float32, the searches sum scores in float32)",
    "batch_size": "utterances decoded at once by the plug-in's batched searches "
    "(mb_greedy, mb_beam, tdt_greedy, tdt_beam: the hypotheses of --batch_size 1); "
    "with --streaming true: streams at once",
    "beam_size": "beam size (None: the search type's, see --transducer_conf; 20, "
    "ESPnet's, for the models the plug-in leaves to ESPnet)",
    "lm_weight": "weight of the --lm_file LM (shallow fusion; the plug-in's "
    "searches fuse it into greedy and beam search)",
    "ngram_weight": "weight of the --ngram_file n-gram LM (natural-log scores in "
    "the plug-in's searches)",
    "ngram_file": "an n-gram LM (ARPA or KenLM binary) fused into the plug-in's "
    "searches (needs kenlm)",
    "transducer_conf": "the transducer search: a YAML mapping or "
    "key=value[,key=value...], e.g. search_type=mb_beam,beam_sync=label (replaces "
    "the whole mapping of --config); None: search_type default. Its keys and each "
    "search type's defaults: at the end of this help",
    "streaming": "true: decode a transducer with encoder: chunk_conformer as streams "
    "(the streaming options below); other models: ESPnet's streaming",
    "hugging_face_decoder": "ESPnet's: decode with a Hugging Face decoder (not for "
    "transducers)",
    "token_type": "the tokenizer of the text output (None: the model's training "
    "token_type; word: tokens are words)",
}


def add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the plug-in's arguments to ESPnet's ``asr_inference`` ``parser`` (the
    module docstring's list)."""
    from espnet2.utils.types import str2bool

    for action in parser._actions:
        if action.dest == "dtype":
            action.choices = list(DTYPES)
        elif action.dest == "token_type" and action.choices is not None:
            action.choices = list(TOKEN_TYPES)
        elif action.dest == "beam_size":
            action.default = None
        if action.dest in RELIED_ON_HELP:
            action.help = RELIED_ON_HELP[action.dest]
    parser.formatter_class = HelpFormatter
    parser.epilog = transducer_conf_epilog()
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
        help="chunks to the left a chunk attends to (None: the model's "
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


def escape_stray_percents(parser: argparse.ArgumentParser) -> None:
    """Escape the ``%`` of every help text that argparse's ``--help`` cannot format
    (it expands ``help % {"default": ...}``; ESPnet 202611's ``--ctc_window_margin``
    help says "3.19% CER"); texts that format are left alone."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.help:
            continue
        try:
            formatter._expand_help(action)
        except (ValueError, TypeError, KeyError):
            # "%%" and "%(name)" stay; a lone "%" becomes "%%"
            action.help = re.sub(r"%%|%\(|%", _escape_percent, action.help)


def _escape_percent(match: "re.Match[str]") -> str:
    return "%%" if match.group(0) == "%" else match.group(0)


def espnet_parser() -> argparse.ArgumentParser:
    """ESPnet's ``asr_inference`` parser (same arguments, same defaults), built from
    the source of its ``get_parser`` and the imports that function names when they
    are all plain imports (:func:`get_parser_from_source`), else by importing the
    module (the start-up hook's additions, if any, left out)."""
    get_parser = get_parser_from_source()
    if get_parser is None:
        from espnet2.bin import asr_inference

        get_parser = asr_inference.get_parser
        get_parser = getattr(get_parser, "espnet_get_parser", get_parser)
    return get_parser()


#: the module whose parser :func:`espnet_parser` builds
ESPNET_INFERENCE = ("espnet2.bin", "asr_inference.py")


def get_parser_from_source(
    package: str = ESPNET_INFERENCE[0], filename: str = ESPNET_INFERENCE[1]
) -> Optional[Callable[[], argparse.ArgumentParser]]:
    """``get_parser`` of ``package/filename`` executed from its source with only the
    module-level imports that bind the names it uses, or None when another name is
    needed (a module constant, a function of the module) or anything fails: then
    the caller imports the module. A test holds the result equal to the imported
    function's parser for every installed ESPnet."""
    try:
        spec = importlib.util.find_spec(package)
        path = os.path.join(list(spec.submodule_search_locations)[0], filename)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        func = next(
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == "get_parser"
        )
        free = _free_names(func)
        imports = []
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound = {(a.asname or a.name).split(".")[0] for a in node.names}
                if bound & free:
                    imports.append(node)
                    free -= bound
        if free:  # names bound otherwise: the module itself is needed
            return None
        module = ast.Module(body=imports + [func], type_ignores=[])
        namespace = {"__name__": f"{package}.{filename[:-3]}", "__file__": path}
        exec(compile(module, path, "exec"), namespace)
        return namespace["get_parser"]
    except Exception:  # any surprise: import the module instead
        return None


def _free_names(func: ast.FunctionDef) -> set:
    """The global names a function reads (not its locals, not builtins)."""
    loads, stores = set(), set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, ast.arg):
            stores.add(node.arg)
    return {n for n in loads - stores if not hasattr(builtins, n)}
