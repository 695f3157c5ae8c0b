#!/usr/bin/env python3
"""ASR decoding with the plug-in's transducer searches (ESPnet's CLI, same outputs).

Usage (every argument of ``espnet2.bin.asr_inference``)::

    python -m espnet_multiblank.bin.asr_inference \\
        --config conf/decode/mb_greedy.yaml \\
        --asr_train_config exp/asr/config.yaml \\
        --asr_model_file exp/asr/valid.loss.ave.pth \\
        --data_path_and_name_and_type dump/raw/test/wav.scp,speech,sound \\
        --output_dir exp/asr/decode_test

It calls :func:`espnet_multiblank.register` first (so models trained with
``model: multiblank_espnet`` rebuild) and runs
:func:`espnet_multiblank.espnet.inference.loop.inference` (ESPnet's output layout,
``decoding_stats.json``, batched decoding, utterances that cannot be decoded reported
by key in ``failed_utterances``). Differences from ESPnet's parser:

* ``--transducer_conf`` also works on the command line (``search_type=mb_beam,...``
  or a YAML mapping; ESPnet's keeps it a string there); its unset keys and
  ``--beam_size`` take the search type's defaults
  (:mod:`~espnet_multiblank.search_defaults`);
* ``--dtype`` also takes ``bfloat16``, ``--token_type`` also ``word``;
* ``--allow_failed_utterances`` (default false): the exit status is 1 when some
  utterance could not be decoded, unless this is true (the outputs are the same).
"""

import sys
from typing import Any, Dict

from espnet_multiblank.espnet.inference.arguments import (
    add_plugin_arguments,
    escape_stray_percents,
    espnet_parser,
)

# inference and exit_status: the decoding loop's, imported on first use (__getattr__)
__all__ = [  # noqa: F822
    "dict_arg",
    "exit_status",
    "get_parser",
    "inference",
    "main",
]


def dict_arg(value: str) -> Dict[str, Any]:
    """``--transducer_conf`` from the command line: a YAML mapping
    (``"{search_type: mb_beam, beam_size: 4}"``) or ``key=value[,key=value...]``."""
    import yaml

    loaded = yaml.safe_load(value)
    if isinstance(loaded, dict):
        return loaded
    out = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value or a YAML mapping, got {value!r}")
        out[key.strip()] = yaml.safe_load(val)
    return out


def get_parser():
    """ESPnet's ``asr_inference`` parser (same arguments, same defaults but
    ``--beam_size``'s) with the module docstring's differences; built without
    importing ESPnet's models where it can (:func:`~espnet_multiblank.espnet.
    inference.arguments.espnet_parser`), so ``--help`` is quick."""
    parser = espnet_parser()
    parser.description = (
        "ASR decoding with espnet-multiblank's transducer searches "
        "(transducer_conf.search_type: mb_greedy, mb_beam, tdt_greedy, tdt_beam, "
        "greedy, default, ...); ESPnet's output layout, inputs that cannot be "
        "decoded reported by key in <output_dir>/failed_utterances"
    )
    for action in parser._actions:
        if action.dest == "transducer_conf":
            action.type = dict_arg
    add_plugin_arguments(parser)
    escape_stray_percents(parser)
    return parser


def main(cmd=None):
    parser = get_parser()
    args = parser.parse_args(cmd)  # --help ends here, before ESPnet's models load
    import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
    from espnet_multiblank.espnet.compat import get_commandline_args
    from espnet_multiblank.espnet.inference.loop import exit_status, inference
    from espnet_multiblank.espnet.registration import register

    register()
    print(get_commandline_args(), file=sys.stderr)
    kwargs = vars(args)
    kwargs.pop("config", None)
    allow_failed = kwargs.pop("allow_failed_utterances")
    stats = inference(**kwargs)
    sys.exit(exit_status(stats, allow_failed))


def __getattr__(name: str):
    # the decoding loop imports torch and ESPnet: only when it is used
    if name in ("inference", "exit_status"):
        from espnet_multiblank.espnet.inference import loop

        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
