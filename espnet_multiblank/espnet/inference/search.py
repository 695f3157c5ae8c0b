"""The transducer search of an ESPnet model, chosen by a decode config.

``search_type`` values (the ``transducer_conf.search_type`` key of a decode config):

=============  =========================================================================
``mb_greedy``  :class:`~espnet_multiblank.decoding.GreedySearch` (batched over
               utterances by the plug-in's inference).
``mb_beam``    :class:`~espnet_multiblank.decoding.BeamSearch`, ``beam_size``
               (batched over utterances; ``beam_sync``: ``frame``, ``step`` or
               ``label``).
``greedy``     ESPnet's greedy search (``BeamSearchTransducer`` with beam 1).
``default``    ESPnet's default beam search (beam 1: ESPnet's greedy search).
``tsd`` ...    ESPnet's other searches (``tsd``, ``alsd``, ``nsc``, ``maes``).
``mbg``        ESPnet's multi-blank greedy: served by ``mb_greedy`` (the same
               algorithm on the lattice's blank indices).
``tdt_greedy`` :class:`~espnet_multiblank.decoding.GreedySearch` of a TDT model
               (batched like ``mb_greedy``).
``tdt_beam``   :class:`~espnet_multiblank.decoding.BeamSearch` of a TDT model,
               ``beam_size`` (batched like ``mb_beam``).
=============  =========================================================================

On a multi-blank model ESPnet's searches would emit the big blanks as labels, so
``greedy`` / ``mbg`` / ``default`` with beam 1 run as ``mb_greedy`` and ``default``
with a beam as ``mb_beam`` (a warning says so); ESPnet's other search types are
refused. A TDT model (``model.tdt_durations``) decodes with the TDT searches only:
every greedy type (``greedy``, ``mbg``, ``mb_greedy``, ``default`` with beam 1) runs as
``tdt_greedy`` and every beam type (``default`` with a beam, ``mb_beam``) as
``tdt_beam``; ``tdt_greedy`` / ``tdt_beam`` on a model that is not a TDT are refused.
``loop_labels: true`` (NeMo's name) makes the greedy search label-looping
(:class:`~espnet_multiblank.decoding.LabelLoopingGreedySearch`: the same hypotheses,
batched differently); it is refused with any search that does not run as
``mb_greedy`` or ``tdt_greedy``. The ``mb_*`` / ``tdt_*`` types choose the rules a
model kind accepts; the search classes are the same for every lattice (the lattice
comes from the model).
Before any search is built ``decoder.blank_id`` is set to the model's standard blank
(ESPnet leaves it at 0, which is ``<blank8>`` in a multi-blank vocabulary). ESPnet's
beam searches other than greedy hard-code index 0 as the blank,
so they are refused when the model's blank is elsewhere.

:func:`build_transducer_search` takes its arguments as given (the search classes'
own defaults); the decode-config defaults of each search type
(:mod:`~espnet_multiblank.espnet.inference.search_defaults`) are filled in by the
plug-in's ``Speech2Text`` before it calls it.
"""

import logging
from typing import Any, Dict, List, Optional, Tuple, Union

from espnet2.asr.transducer.beam_search_transducer import BeamSearchTransducer
from typeguard import typechecked

from espnet_multiblank.decoding import (
    BeamSearch,
    GreedySearch,
    JointStepper,
    LabelLoopingGreedySearch,
    ShallowFusion,
)
from espnet_multiblank.espnet.inference.lm_fusion import build_fusion
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

logger = logging.getLogger(__name__)

MULTIBLANK_SEARCH_TYPES = ("mb_greedy", "mb_beam")
TDT_SEARCH_TYPES = ("tdt_greedy", "tdt_beam")
#: search types only the plug-in serves
PLUGIN_SEARCH_TYPES = MULTIBLANK_SEARCH_TYPES + TDT_SEARCH_TYPES
ESPNET_SEARCH_TYPES = ("greedy", "default", "tsd", "alsd", "nsc", "maes", "mbg")
#: transducer_conf keys understood by the plug-in's searches
MULTIBLANK_KEYS = (
    "max_sym_per_frame",
    "score_norm",
    "loop_labels",
    "blank_decision",
    "beam_sync",
    "frame_prune",
)
TDT_KEYS = MULTIBLANK_KEYS
#: transducer_conf keys that ESPnet's searches do not know
PLUGIN_ONLY_KEYS = (
    "max_sym_per_frame",
    "beam_size",
    "blank_decision",
    "loop_labels",
    "beam_sync",
    "frame_prune",
)
#: the greedy search types that ``loop_labels: true`` turns into label-looping
GREEDY_SEARCH_TYPES = ("mb_greedy", "tdt_greedy")


def lattice_from_model(model: Any) -> Union[MultiblankLattice, TDTLattice]:
    """The lattice of an ESPnet transducer model.

    Reads the plug-in's ``multiblank_espnet`` model (``blank_id``,
    ``big_blank_durations``, ``tdt_durations``), ESPnet's own multi-blank
    ``ESPnetASRModel`` (``transducer_multi_blank_durations``) and standard transducers
    (none of them).
    """
    tdt = getattr(model, "tdt_durations", None)
    if tdt:
        return TDTLattice.create(
            model.blank_id,
            tdt,
            blank_name="model.blank_id",
            durations_name="model.tdt_durations",
        )
    durations = getattr(model, "big_blank_durations", None)
    if durations is None:
        durations = getattr(model, "transducer_multi_blank_durations", None) or ()
    return MultiblankLattice.create(
        model.blank_id,
        durations,
        blank_name="model.blank_id",
        durations_name="model.big_blank_durations",
    )


def vocab_size_of(model: Any) -> int:
    """V, the number of tokens: ``decoder.odim`` or the token list's length."""
    return int(getattr(model.decoder, "odim", 0)) or len(model.token_list)


def joint_size_of(model: Any, lattice: Union[MultiblankLattice, TDTLattice]) -> int:
    """The joint network's output size: V, plus the duration logits of a TDT."""
    return vocab_size_of(model) + lattice.num_duration_outputs


def fix_decoder_blank(
    decoder: Any, lattice: Union[MultiblankLattice, TDTLattice]
) -> None:
    """Make ``decoder.blank_id`` the lattice's standard blank (in place).

    ESPnet's searches start every hypothesis with ``decoder.blank_id`` (training starts
    the prediction network with the model's ``blank_id``) and its greedy search treats
    it as the blank; ESPnet leaves it at ``embed_pad = 0``, which is ``<blank{d_max}>``
    in a multi-blank model. The embedding's ``padding_idx`` is left alone.
    """
    if getattr(decoder, "blank_id", None) != lattice.blank:
        logger.info(
            "decoder.blank_id %s -> %d (the model's standard blank)",
            getattr(decoder, "blank_id", None),
            lattice.blank,
        )
        decoder.blank_id = lattice.blank


def resolve_search_type(
    search_type: str, beam_size: int, multiblank: bool, tdt: bool = False
) -> str:
    """The search type that runs for a requested one (see the module docstring).

    Args:
        search_type: ``transducer_conf.search_type``.
        beam_size: The beam size.
        multiblank: Whether the model has big blanks.
        tdt: Whether the model is a TDT.
    """
    known = PLUGIN_SEARCH_TYPES + ESPNET_SEARCH_TYPES
    if search_type not in known:
        raise ValueError(
            f"transducer_conf.search_type must be one of {list(known)}, got "
            f"{search_type!r} (unknown search type)"
        )
    if tdt:
        return _resolve_tdt(search_type, beam_size)
    if search_type in TDT_SEARCH_TYPES:
        raise ValueError(
            f"transducer_conf.search_type {search_type!r} decodes token-and-duration "
            "transducers (model_conf.transducer_tdt_durations); this model is not "
            "one: use mb_greedy or mb_beam"
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
            f"transducer_conf.search_type {search_type!r} does not know big blanks; "
            "use mb_greedy or mb_beam for a multi-blank model"
        )
    logger.warning(
        "multi-blank model: search_type %r runs as %r", search_type, resolved
    )
    return resolved


def _resolve_tdt(search_type: str, beam_size: int) -> str:
    if search_type in TDT_SEARCH_TYPES:
        return search_type
    if search_type in ("greedy", "mbg", "mb_greedy") or (
        search_type == "default" and beam_size <= 1
    ):
        resolved = "tdt_greedy"
    elif search_type in ("default", "mb_beam"):
        resolved = "tdt_beam"
    else:
        raise ValueError(
            f"transducer_conf.search_type {search_type!r} does not know TDT "
            "durations; use tdt_greedy or tdt_beam for a TDT model"
        )
    logger.warning("TDT model: search_type %r runs as %r", search_type, resolved)
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
    lm_token_list: Optional[List[str]] = None,
    ngram_file: Optional[str] = None,
    ngram_weight: float = 0.9,
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
        lm, lm_weight: Shallow-fusion LM (an ESPnet LM module, ``lm.lm`` of what
            ``espnet2.bin.lm_train`` trains) and its weight. Fused into every plug-in
            search (:mod:`espnet_multiblank.espnet.inference.lm_fusion`); ESPnet's
            greedy type then runs as ``mb_greedy`` with ESPnet's greedy rule (one
            label per frame, the arg-max symbol) so that the LM is used; ESPnet's
            beam searches fuse it their own way.
        token_list: The model's token list (default ``model.token_list``).
        lm_token_list: The LM's token list (required with ``lm``).
        ngram_file, ngram_weight: An n-gram LM (ARPA / KenLM file, through
            ``kenlm``) and its weight, fused like ``lm`` into the plug-in's searches;
            refused with ESPnet's beam searches (which cannot use one).
        **conf: Other ``transducer_conf`` keys: ``max_sym_per_frame`` and
            ``score_norm`` for the plug-in's searches, ``blank_decision`` for the
            multi-blank ones, ``loop_labels`` (bool) for the greedy ones,
            ``beam_sync`` (``"frame"``, ``"step"`` or ``"label"``) and
            ``frame_prune`` (``"label"``) for the beam ones; ESPnet's
            keys (``score_norm``, ``score_norm_during``, ``max_sym_exp``,
            ``u_max``, ...) for ESPnet's.

    Returns:
        The plug-in's :class:`~espnet_multiblank.decoding.TransducerSearch` or ESPnet's
        ``BeamSearchTransducer``: ``search(enc_out (T, D_enc))`` returns the n-best
        hypotheses, best first.
    """
    lattice = lattice_from_model(model)
    fix_decoder_blank(model.decoder, lattice)
    tdt = lattice.kind == "tdt"  # the tdt_* search types
    resolved = resolve_search_type(
        search_type, beam_size, not tdt and lattice.is_multiblank, tdt=tdt
    )
    tokens = list(token_list if token_list is not None else model.token_list)
    fused = lm is not None or ngram_file is not None
    resolved, conf = _greedy_with_lm(resolved, beam_size, fused, conf)
    loop_labels = _pop_loop_labels(conf, resolved, search_type)
    if resolved in PLUGIN_SEARCH_TYPES:
        fusion = build_fusion(
            lattice.blank_ids,
            tokens,
            lm=lm,
            lm_token_list=lm_token_list,
            lm_weight=lm_weight,
            ngram_file=ngram_file,
            ngram_weight=ngram_weight,
        )
        return _plugin_search(
            model, lattice, resolved, beam_size, nbest, loop_labels, fusion, conf
        )
    if ngram_file is not None:
        raise ValueError(
            f"--ngram_file: ESPnet's {resolved!r} transducer search cannot use an "
            "n-gram LM (it would be ignored); use search_type: mb_beam (any "
            "standard or multi-blank model) or a greedy search"
        )
    if lm is not None and lm_token_list is not None and lm_token_list != tokens:
        raise ValueError(
            f"--lm_train_config: ESPnet's {resolved!r} beam search needs an LM over "
            "the model's own token list (it feeds the ASR token ids to the LM); this "
            "LM has another one: use search_type: mb_beam"
        )
    return _espnet_search(
        model, lattice, resolved, beam_size, nbest, lm, lm_weight, tokens, conf
    )


def _greedy_with_lm(
    resolved: str, beam_size: int, fused: bool, conf: Dict[str, Any]
) -> Tuple[str, Dict[str, Any]]:
    """ESPnet's greedy search ignores an LM (it warns): with one, run it as
    ``mb_greedy`` with ESPnet's greedy rule (one label per frame, the arg-max
    symbol), which fuses the LM like every plug-in greedy search."""
    espnet_greedy = resolved == "greedy" or (resolved == "default" and beam_size <= 1)
    if not (fused and espnet_greedy):
        return resolved, conf
    logger.warning(
        "search_type %r with a language model runs as 'mb_greedy' (ESPnet's greedy "
        "rule: max_sym_per_frame 1, blank_decision symbol) so that the LM is fused",
        resolved,
    )
    conf = dict(conf)
    conf.pop("score_norm", None)  # ESPnet's key; greedy search has nothing to rank
    conf.setdefault("max_sym_per_frame", 1)
    conf.setdefault("blank_decision", "symbol")
    return "mb_greedy", conf


def _pop_loop_labels(conf: Dict[str, Any], resolved: str, search_type: str) -> bool:
    """``transducer_conf.loop_labels`` (removed from ``conf``), checked."""
    loop_labels = conf.pop("loop_labels", False)
    if not isinstance(loop_labels, bool):
        raise TypeError(
            f"transducer_conf.loop_labels must be true or false, got {loop_labels!r}"
        )
    if loop_labels and resolved not in GREEDY_SEARCH_TYPES:
        raise ValueError(
            "transducer_conf.loop_labels: true selects label-looping greedy search, "
            f"which serves search_type mb_greedy or tdt_greedy (and the greedy types "
            f"mapped on them); {search_type!r} runs as {resolved!r} here"
        )
    return loop_labels


def _plugin_search(
    model: Any,
    lattice: Union[MultiblankLattice, TDTLattice],
    resolved: str,
    beam_size: int,
    nbest: int,
    loop_labels: bool,
    fusion: Optional[ShallowFusion],
    conf: Dict[str, Any],
):
    """One of the plug-in's searches (``resolved`` in ``PLUGIN_SEARCH_TYPES``)."""
    tdt = resolved in TDT_SEARCH_TYPES
    keys = TDT_KEYS if tdt else MULTIBLANK_KEYS
    unknown = sorted(set(conf) - set(keys))
    if unknown:
        raise ValueError(
            f"transducer_conf keys not used by {resolved}: {unknown} (it takes "
            f"{list(keys)})"
        )
    stepper = JointStepper(
        model.decoder, model.joint_network, joint_size_of(model, lattice)
    )
    max_sym = conf.get("max_sym_per_frame", 10)
    # blank_decision, beam_sync: each search has its own default
    extra = {k: conf[k] for k in ("blank_decision", "beam_sync") if k in conf}
    if resolved in GREEDY_SEARCH_TYPES:
        if "frame_prune" in conf:
            raise ValueError(
                f"transducer_conf.frame_prune prunes the label-synchronous beam "
                f"search (beam_sync: label); {resolved} is a greedy search"
            )
        if "beam_sync" in conf:
            raise ValueError(
                f"transducer_conf.beam_sync chooses how a beam search prunes; "
                f"{resolved} is a greedy search (use mb_beam or tdt_beam)"
            )
        greedy = LabelLoopingGreedySearch if loop_labels else GreedySearch
        return greedy(
            stepper, lattice, max_sym_per_frame=max_sym, fusion=fusion, **extra
        )
    return BeamSearch(
        stepper,
        lattice,
        beam_size=beam_size,
        nbest=nbest,
        max_sym_per_frame=max_sym,
        score_norm=conf.get("score_norm", False),
        fusion=fusion,
        frame_prune=conf.get("frame_prune"),
        **extra,
    )


def _espnet_search(
    model: Any,
    lattice: MultiblankLattice,
    resolved: str,
    beam_size: int,
    nbest: int,
    lm: Optional[Any],
    lm_weight: float,
    token_list: List[str],
    conf: Dict[str, Any],
) -> BeamSearchTransducer:
    """ESPnet's ``BeamSearchTransducer`` (standard transducers)."""
    if "max_sym_per_frame" in conf:
        logger.warning("max_sym_per_frame is ignored by ESPnet's %s search", resolved)
        conf = {k: v for k, v in conf.items() if k != "max_sym_per_frame"}
    if resolved == "greedy":
        resolved, beam_size = "default", 1
    if beam_size > 1 and lattice.blank != 0:
        raise ValueError(
            f"ESPnet's {resolved!r} beam search assumes the blank is index 0, but this "
            f"model's blank is {lattice.blank}; use search_type: mb_beam (it handles "
            "any blank)"
        )
    if lm is not None and hasattr(lm, "eval"):
        lm.eval()  # ESPnet's transducer path leaves the LM in training mode
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
    assert search.blank_id == lattice.blank
    return search
