"""Choose the transducer search for a model, always with the model's real blank.

``search_type`` values (the ``transducer_conf.search_type`` key of a decode config):

=============  =========================================================================
``mb_greedy``  :class:`MultiblankGreedySearch` (batched over utterances in the CLI).
``mb_beam``    :class:`MultiblankBeamSearch` with ``beam_size``.
``greedy``     ESPnet's greedy search (``BeamSearchTransducer`` with beam 1).
``default``    ESPnet's default beam search (beam 1: ESPnet's greedy search).
``tsd`` ...    ESPnet's other searches (``tsd``, ``alsd``, ``nsc``, ``maes``).
``mbg``        ESPnet's multi-blank greedy: served by ``mb_greedy`` (same algorithm,
               correct blank indices).
=============  =========================================================================

On a multi-blank model (big blanks present) ESPnet's searches would treat the big blanks
as labels, so ``greedy`` / ``mbg`` / ``default`` with beam 1 become ``mb_greedy`` and
``default`` with a beam becomes ``mb_beam`` (with a warning); other ESPnet search types
are rejected. On every model ``decoder.blank_id`` is set to the model's standard blank
before a search is built (ESPnet leaves it at 0, which is ``<blank8>`` in a multi-blank
vocabulary). ESPnet's beam searches other than greedy also hard-code index 0 as the
blank, so they are refused when the model's blank is elsewhere.
"""

import logging
from typing import Any, List, Optional

from espnet2.asr.transducer.beam_search_transducer import BeamSearchTransducer
from typeguard import typechecked

from espnet_multiblank.decoding.beam import MultiblankBeamSearch
from espnet_multiblank.decoding.greedy import MultiblankGreedySearch
from espnet_multiblank.decoding.layout import fix_decoder_blank, layout_from_model

logger = logging.getLogger(__name__)

MULTIBLANK_SEARCH_TYPES = ("mb_greedy", "mb_beam")
ESPNET_SEARCH_TYPES = ("greedy", "default", "tsd", "alsd", "nsc", "maes", "mbg")
# keys of transducer_conf understood by the multi-blank searches
MULTIBLANK_KEYS = ("max_sym_per_frame", "score_norm")


def resolve_search_type(search_type: str, beam_size: int, multiblank: bool) -> str:
    """Map a requested search type to the one actually run (see module docstring)."""
    if search_type not in MULTIBLANK_SEARCH_TYPES + ESPNET_SEARCH_TYPES:
        raise ValueError(
            f"unknown transducer search_type {search_type!r}; choose one of "
            f"{MULTIBLANK_SEARCH_TYPES + ESPNET_SEARCH_TYPES}"
        )
    if search_type == "mbg":
        return "mb_greedy"
    if not multiblank or search_type in MULTIBLANK_SEARCH_TYPES:
        return search_type
    if search_type == "greedy" or (search_type == "default" and beam_size <= 1):
        resolved = "mb_greedy"
    elif search_type == "default":
        resolved = "mb_beam"
    else:
        raise ValueError(
            f"search_type {search_type!r} does not know big blanks; use mb_greedy or "
            "mb_beam for a multi-blank model"
        )
    logger.warning(
        "multi-blank model: search_type %r runs as %r", search_type, resolved
    )
    return resolved


@typechecked
def build_transducer_search(
    model: Any,
    beam_size: int = 1,
    search_type: str = "default",
    nbest: int = 1,
    lm: Optional[Any] = None,
    lm_weight: float = 0.1,
    token_list: Optional[List[str]] = None,
    **conf: Any,
):
    """Build the transducer search for ``model``.

    Args:
        model: Transducer model with ``decoder``, ``joint_network``, ``blank_id`` and,
            for multi-blank models, ``big_blank_durations`` (the plug-in's model) or
            ``transducer_multi_blank_durations`` (ESPnet's).
        beam_size: Beam size (``mb_greedy`` and ``greedy`` use 1).
        search_type: See the module docstring.
        nbest: Hypotheses returned.
        lm, lm_weight: Shallow-fusion LM for ESPnet's searches (not supported by the
            multi-blank searches).
        token_list: For ESPnet's debug logging.
        **conf: Other ``transducer_conf`` keys: ``max_sym_per_frame`` and
            ``score_norm`` for the multi-blank searches; ESPnet's keys (``score_norm``,
            ``score_norm_during``, ``max_sym_exp``, ``u_max``, ...) for ESPnet's.

    Returns:
        A callable ``search(enc_out (T, D_enc)) -> List[Hypothesis]`` (best first);
        ``MultiblankGreedySearch`` also has ``search_batch(enc_out (B, T, D_enc),
        enc_lens (B,))``.
    """
    layout = layout_from_model(model)
    fix_decoder_blank(model.decoder, layout)
    resolved = resolve_search_type(search_type, beam_size, layout.is_multiblank)

    if resolved in MULTIBLANK_SEARCH_TYPES:
        unknown = sorted(set(conf) - set(MULTIBLANK_KEYS))
        if unknown:
            raise ValueError(f"transducer_conf keys not used by {resolved}: {unknown}")
        if lm is not None:
            raise NotImplementedError(f"{resolved} does not support LM fusion")
        common = dict(
            decoder=model.decoder,
            joint_network=model.joint_network,
            blank_id=layout.blank_id,
            big_blank_durations=layout.durations,
            max_sym_per_frame=int(conf.get("max_sym_per_frame", 10)),
            vocab_size=layout.vocab_size,
        )
        if resolved == "mb_greedy":
            return MultiblankGreedySearch(**common)
        return MultiblankBeamSearch(
            beam_size=beam_size,
            nbest=nbest,
            score_norm=bool(conf.get("score_norm", False)),
            **common,
        )

    # ESPnet's own searches (standard transducer)
    if "max_sym_per_frame" in conf:
        logger.warning("max_sym_per_frame is ignored by ESPnet's %s search", resolved)
        conf = {k: v for k, v in conf.items() if k != "max_sym_per_frame"}
    if resolved == "greedy":
        resolved, beam_size = "default", 1
    if beam_size > 1 and layout.blank_id != 0:
        raise ValueError(
            f"ESPnet's {resolved!r} beam search assumes the blank is index 0, but this "
            f"model's blank is {layout.blank_id}; use mb_beam (it handles any blank)"
        )
    search = BeamSearchTransducer(
        decoder=model.decoder,
        joint_network=model.joint_network,
        beam_size=beam_size,
        lm=lm,
        lm_weight=lm_weight,
        search_type=resolved,
        nbest=nbest,
        token_list=token_list,
        **conf,
    )
    assert search.blank_id == layout.blank_id
    return search
