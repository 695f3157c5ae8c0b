"""The defaults of every transducer search type: one table for every route.

A search is named by its ``transducer_conf.search_type`` (and the keys that make a
variant of it: ``beam_sync``, ``loop_labels``, ...). Whatever a decode config, the
command line or a Python constructor leaves unset is taken from
:data:`SEARCH_DEFAULTS`, so one name means one search whichever way it is asked for:

* ``MultiblankSpeech2Text(transducer_conf={"search_type": "mb_greedy"})`` (and the
  streaming classes, which build one);
* ``--transducer_conf search_type=mb_greedy`` on the command line (``--beam_size``
  defaults to the table's);
* ``--config conf/decode/mb_greedy.yaml``: the files in ``conf/decode/`` name the
  search and the keys of their variant, the table gives the rest.

Precedence: a key of ``transducer_conf``, then the top-level argument (``beam_size``),
then the table. The table applies where the plug-in chooses the search (its
``Speech2Text``; ESPnet's stock class for the plug-in's models); ESPnet's own models
through the stock class keep ESPnet's defaults. The low-level
:func:`~espnet_multiblank.espnet.inference.search.build_transducer_search` takes its
arguments as given (the search classes' own defaults).

This module imports nothing (plain Python, the bottom layer beside ``lattice.py``):
the torch-free runtime (:mod:`espnet_multiblank.runtime`) takes its greedy and beam
defaults from it too, and the entry points' ``--help`` lists it. Its old path,
``espnet_multiblank.espnet.inference.search_defaults``, re-exports it.
"""

from typing import Any, Dict, Optional, Tuple

#: ESPnet's ``Speech2Text`` beam size, for the models the plug-in leaves to ESPnet
ESPNET_BEAM_SIZE = 20

_BEAM = dict(
    beam_size=4,
    max_sym_per_frame=10,
    score_norm=False,
    blank_decision="symbol",
    beam_sync="frame",
)

#: search_type -> the settings it runs with unless told otherwise (``beam_size``:
#: the top-level option). Why these values: docs/decoding.md ("Search defaults").
SEARCH_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # one label per frame, as ESPnet's greedy search: on the digits recipe's dev set
    # it beat 2, 3 and 10 for the standard and multi-blank models (with 10 a model
    # looped on one label at one frame); a blank when the blanks together beat the
    # best label
    "mb_greedy": dict(beam_size=1, max_sym_per_frame=1, blank_decision="total"),
    "mb_beam": dict(_BEAM),
    # the TDT greedy search was not affected by max_sym_per_frame (same WER, 1-10)
    "tdt_greedy": dict(beam_size=1, max_sym_per_frame=10, blank_decision="total"),
    "tdt_beam": dict(_BEAM),
    # ESPnet's search types (standard models; mapped on the plug-in's searches for
    # multi-blank and TDT models, docs/decoding.md); their other keys: ESPnet's
    "greedy": dict(beam_size=1),
    "mbg": dict(beam_size=1),
    "default": dict(beam_size=4, score_norm=False),
    "tsd": dict(beam_size=4),
    "alsd": dict(beam_size=4),
    "nsc": dict(beam_size=4),
    "maes": dict(beam_size=4),
}

#: the search type of a ``transducer_conf`` without one (ESPnet's)
DEFAULT_SEARCH_TYPE = "default"

#: the ``transducer_conf`` keys, explained (``--help`` lists them)
TRANSDUCER_CONF_KEYS: Dict[str, str] = {
    "search_type": "mb_greedy, mb_beam (standard and multi-blank models), "
    "tdt_greedy, tdt_beam (TDT models), or ESPnet's greedy, default, tsd, alsd, "
    "nsc, maes, mbg",
    "beam_size": "overrides the top-level --beam_size",
    "max_sym_per_frame": "labels a hypothesis may emit at one frame (TDT: labels "
    "that stay, duration 0)",
    "blank_decision": "total (a blank when the blanks together beat the best label) "
    "or symbol (the arg-max arc)",
    "score_norm": "true: rank final hypotheses by score / length",
    "beam_sync": "frame, step or label: how a beam search prunes (mb_beam, "
    "tdt_beam)",
    "frame_prune": "nats; prunes the label rule (beam_sync: label) to the frames "
    "near the greedy path's score",
    "loop_labels": "true: label-looping greedy search (the same hypotheses)",
}


def search_settings(
    transducer_conf: Optional[Dict[str, Any]], beam_size: Optional[int] = None
) -> Tuple[str, int, Dict[str, Any]]:
    """The search a decode config asks for, with the table's defaults filled in.

    Args:
        transducer_conf: ``transducer_conf`` as given (``search_type`` and other
            keys; None: ESPnet's ``default`` search).
        beam_size: The top-level ``beam_size`` (None: not given).

    Returns:
        ``(search_type, beam_size, conf)``: ``conf`` holds the other keys, the
        given ones over the table's.
    """
    conf = dict(transducer_conf or {})
    search_type = conf.pop("search_type", DEFAULT_SEARCH_TYPE)
    defaults = dict(SEARCH_DEFAULTS.get(search_type, {}))
    table_beam = defaults.pop("beam_size", ESPNET_BEAM_SIZE)
    beam = conf.pop("beam_size", None)
    if beam is None:
        beam = table_beam if beam_size is None else beam_size
    return search_type, beam, {**defaults, **conf}


def defaults_help() -> str:
    """The table, one line per search type: ``  mb_greedy  beam_size=1 ...``."""
    import textwrap

    width = max(map(len, SEARCH_DEFAULTS))
    return "\n".join(
        textwrap.fill(
            " ".join(f"{k}={_yaml(v)}" for k, v in settings.items()),
            78,
            initial_indent=f"  {name:<{width}}  ",
            subsequent_indent=" " * (width + 4),
        )
        for name, settings in SEARCH_DEFAULTS.items()
    )


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
