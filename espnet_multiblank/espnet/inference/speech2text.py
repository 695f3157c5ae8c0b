"""ESPnet's ``Speech2Text`` with the plug-in's transducer searches.

:func:`plugin_speech2text` derives, from ESPnet's ``Speech2Text`` class, a class that
builds everything as ESPnet does (model from ``config.yaml`` + ``model.pth``, LM,
tokenizer, converter) and then replaces ``beam_search_transducer`` by
:func:`~espnet_multiblank.espnet.inference.search.build_transducer_search`, which
reads the lattice from the model, fixes ``decoder.blank_id`` and serves the plug-in's
search types. It also keeps decoding statistics and adds
:meth:`PluginSearchMixin.decode_batch` (batched encoder, when exact, and greedy
search). Two flavours:

* ``MultiblankSpeech2Text`` (the plug-in's inference entry point): every transducer
  model gets :func:`build_transducer_search`;
* ESPnet's own ``espnet2.bin.asr_inference.Speech2Text`` once the start-up hook has
  wrapped it (:mod:`espnet_multiblank.espnet._hook`): the plug-in's models, and any
  transducer model whose decode config asks for a plug-in search type, get
  :func:`build_transducer_search`; everything else decodes exactly as ESPnet does.

This module does not import ``espnet2.bin.asr_inference`` until
``MultiblankSpeech2Text`` is first used, so the start-up hook can wrap that module
while it is being executed.
"""

# before ESPnet's modules: their import prints nothing (quiet's docstring)
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  isort: skip
import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from espnet2.asr.transducer.beam_search_transducer import (
    Hypothesis as ESPnetTransducerHypothesis,
)
from espnet2.torch_utils.device_funcs import to_device

from espnet_multiblank.decoding import (
    Hypothesis,
    TransducerSearch,
    single_thread_on_cpu,
)
from espnet_multiblank.espnet.batch_exact.exact_encoding import (
    BatchExactness,
    make_batch_exact,
)
from espnet_multiblank.espnet.compat import TooShortUttError
from espnet_multiblank.espnet.inference.inputs import (
    InputChecks,
    as_waveform,
    input_checks,
    is_utterance_list,
    min_encoder_samples,
    rate_argument,
)
from espnet_multiblank.espnet.inference.lm_fusion import read_token_list
from espnet_multiblank.espnet.inference.search import (
    PLUGIN_ONLY_KEYS,
    PLUGIN_SEARCH_TYPES,
    build_transducer_search,
    lattice_from_model,
)
from espnet_multiblank.espnet.inference.search_defaults import (
    ESPNET_BEAM_SIZE,
    search_settings,
)
from espnet_multiblank.espnet.registration import PLUGIN_MODELS

logger = logging.getLogger(__name__)


@dataclass
class DecodedHypothesis(ESPnetTransducerHypothesis):
    """ESPnet's transducer ``Hypothesis`` (what ESPnet's ``Speech2Text`` and tools
    accept: ``score``, ``yseq`` with the start symbol first, ``dec_state``) plus the
    plug-in's counts: ``frame``, ``big_blank_emissions``, ``frames_skipped``, and
    the labels' ``timing`` (:attr:`espnet_multiblank.decoding.Hypothesis.timing`)."""

    frame: int = 0
    big_blank_emissions: int = 0
    frames_skipped: int = 0
    timing: List[Tuple[int, int, float]] = field(default_factory=list)


def to_espnet_hypothesis(hyp: Any) -> ESPnetTransducerHypothesis:
    """A search's :class:`~espnet_multiblank.decoding.Hypothesis` as ESPnet's type
    (ESPnet's own hypotheses are returned as they are)."""
    if isinstance(hyp, ESPnetTransducerHypothesis):
        # ESPnet's beam search with an LM adds tensors to the score: keep a number
        hyp.score = float(hyp.score)
        return hyp
    return DecodedHypothesis(
        score=float(hyp.score),
        yseq=list(hyp.yseq),
        dec_state=hyp.dec_state,
        frame=hyp.frame,
        big_blank_emissions=hyp.big_blank_emissions,
        frames_skipped=hyp.frames_skipped,
        timing=list(getattr(hyp, "timing", ())),
    )


class DecodingStats:
    """Counters for ``decoding_stats.json`` (1-best hypotheses only)."""

    def __init__(self):
        # the plug-in's search class, when the plug-in chose the search
        self.search: Optional[str] = None
        self.num_utterances = 0
        self.total_frames = 0
        self.big_blank_emissions = 0
        # frames whose joint network the 1-best paths never evaluated: d - 1 per
        # emission covering d > 1 frames (big blanks; TDT blanks and labels)
        self.frames_skipped = 0
        # wall time inside the transducer search alone (no encoder, no I/O): the part
        # that big blanks shorten
        self.search_seconds = 0.0

    def add(self, frames: int, hyp: Any) -> None:
        """Count a decoded utterance (not one whose score is not finite: the
        decoding loop reports it instead of writing it)."""
        if not math.isfinite(float(hyp.score)):
            return
        self.num_utterances += 1
        self.total_frames += int(frames)
        self.big_blank_emissions += int(getattr(hyp, "big_blank_emissions", 0))
        self.frames_skipped += int(getattr(hyp, "frames_skipped", 0))

    @property
    def frames_skipped_by_big_blanks(self) -> int:
        """:attr:`frames_skipped` under its first name (multi-blank models: only big
        blanks skip frames)."""
        return self.frames_skipped

    def as_dict(self) -> Dict[str, Any]:
        """The search counters under their ``decoding_stats.json`` keys."""
        return {
            "search_seconds": self.search_seconds,
            "total_frames": self.total_frames,
            "frames_skipped": self.frames_skipped,
            "frames_skipped_by_big_blanks": self.frames_skipped_by_big_blanks,
            "big_blank_emissions": self.big_blank_emissions,
        }


def write_decoding_stats(output_dir: Any, stats: Dict[str, Any]) -> None:
    """Write ``<output_dir>/decoding_stats.json``."""
    import json
    from pathlib import Path

    Path(output_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(output_dir) / "decoding_stats.json", "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")


def _read_config(asr_train_config: Any) -> Dict[str, Any]:
    """A training config file as a dict ({} when it cannot be read: ESPnet reports
    that)."""
    if asr_train_config is None:
        return {}
    import yaml

    try:
        with open(asr_train_config, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def _config_model_name(config: Dict[str, Any]) -> Optional[str]:
    """The ``model:`` of a training config, lower case, or None."""
    model = config.get("model")
    return model.lower() if isinstance(model, str) else None


def _config_is_transducer(config: Dict[str, Any]) -> bool:
    """Whether a training config builds a transducer (ESPnet: ``decoder:
    transducer``)."""
    decoder = config.get("decoder")
    return isinstance(decoder, str) and decoder.lower() == "transducer"


def config_is_transducer(asr_train_config: Any) -> bool:
    """Whether a training config file builds a transducer (``decoder:
    transducer``)."""
    return _config_is_transducer(_read_config(asr_train_config))


def is_plugin_model(model: Any) -> bool:
    from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel

    return isinstance(model, MultiblankESPnetASRModel)


def _plugin_decodes(config: Dict[str, Any], transducer_conf: Optional[Dict]) -> bool:
    return (
        requests_plugin_search(transducer_conf)
        or _config_model_name(config) in PLUGIN_MODELS
    )


def plugin_decodes(asr_train_config: Any, transducer_conf: Optional[Dict]) -> bool:
    """Whether the start-up hook's ``Speech2Text`` gives this model and decode config
    the plug-in's search: a plug-in model (``model: multiblank_espnet``) or a
    ``transducer_conf`` that asks for a plug-in search type or key."""
    return _plugin_decodes(_read_config(asr_train_config), transducer_conf)


#: ESPnet's options that a transducer search does not use, with their defaults
TRANSDUCER_UNUSED = {
    "ctc_weight": 0.5,
    "penalty": 0.0,
    "streaming": False,
    "lang_prompt_token": None,
    "nlp_prompt_token": None,
    "maxlenratio": 0.0,
    "minlenratio": 0.0,
    "normalize_length": False,
    "time_sync": False,
    "partial_ar": False,
    "hugging_face_decoder": False,
}


def warn_unused_options(kwargs: Dict[str, Any], nbest: int, search: Any) -> None:
    """One warning naming the options given (not at their defaults) that a
    transducer search ignores, and ``--nbest N`` with a search that gives one
    hypothesis."""
    unused = [
        f"--{k} {kwargs[k]}"
        for k, default in TRANSDUCER_UNUSED.items()
        if k in kwargs and kwargs[k] != default
    ]
    if nbest > 1 and getattr(search, "beam_size", 1) <= 1:
        unused.append(f"--nbest {nbest} (a greedy search gives one hypothesis)")
    if unused:
        logger.warning(
            "options that do not apply to a transducer search, ignored: %s",
            ", ".join(unused),
        )


def _inputs_to_float32(module, args):
    """Forward pre-hook: the first argument (the waveform) in float32."""
    return (args[0].float(),) + tuple(args[1:])


def _features_to(dtype: torch.dtype, module, args, out):
    """Forward hook: the features (the output's first entry) in ``dtype``."""
    return (out[0].to(dtype),) + tuple(out[1:])


def _refuse_half_precision_espnet_search(dtype: str, device: Any) -> None:
    """ESPnet's transducer searches step the prediction network with ``nn.LSTM``,
    which has no half-precision CPU kernel: every utterance would fail."""
    if dtype in ("float16", "bfloat16") and str(device).startswith("cpu"):
        raise ValueError(
            f"--dtype {dtype}: ESPnet's transducer searches cannot run in {dtype} on "
            "a CPU (nn.LSTM has no such kernel); use the plug-in's searches "
            "(transducer_conf search_type: mb_greedy, mb_beam) or --dtype float32"
        )


class _without_espnet_lm_warning:
    """Drop ESPnet's "LM is provided but not used" warning while active (when the
    plug-in replaces the search that logs it)."""

    def __init__(self, active: bool):
        self.active = active

    @staticmethod
    def filter(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("LM is provided but not used")

    def __enter__(self):
        if self.active:
            logging.getLogger().addFilter(self.filter)
        return self

    def __exit__(self, *exc):
        logging.getLogger().removeFilter(self.filter)
        return False


def _require_model_file(asr_model_file: Any, random_weights: bool) -> None:
    """No untrained model by accident: ESPnet builds the config's model with its
    random initial weights when ``asr_model_file`` is None (which then decodes
    nothing useful, silently)."""
    if not isinstance(random_weights, bool):
        raise TypeError(f"random_weights must be True or False, got {random_weights!r}")
    if asr_model_file is None and not random_weights:
        raise ValueError(
            "asr_model_file is required: without it the model keeps the random "
            "initial weights of its config and decodes nothing useful (give the "
            "trained model's file, e.g. exp/asr/valid.loss.ave.pth, or "
            "random_weights=True to decode with untrained weights on purpose)"
        )
    if asr_model_file is not None and random_weights:
        raise ValueError(
            f"random_weights=True and asr_model_file={str(asr_model_file)!r}: give "
            "one of them"
        )


def requests_plugin_search(transducer_conf: Optional[Dict]) -> bool:
    """True when a decode config's ``transducer_conf`` names a plug-in search type or
    a key only the plug-in's searches know."""
    conf = transducer_conf or {}
    return conf.get("search_type") in PLUGIN_SEARCH_TYPES or any(
        key in conf for key in PLUGIN_ONLY_KEYS
    )


class PluginSearchMixin:
    """Replaces ESPnet's transducer search by the plug-in's (put before ESPnet's
    ``Speech2Text`` in the bases; see :func:`plugin_speech2text`).

    Accepts every argument of ESPnet's ``Speech2Text``. ``transducer_conf`` takes
    ``search_type`` (``mb_greedy``, ``mb_beam``, ``tdt_greedy``, ``tdt_beam``, or
    ESPnet's ``greedy``, ``default``, ``tsd``, ``alsd``, ``nsc``, ``maes``, ``mbg``),
    the plug-in searches' keys (``max_sym_per_frame``, ``blank_decision``,
    ``score_norm``, ``beam_sync``, ``frame_prune``, ``loop_labels``) or ESPnet's
    search keys, and optionally ``beam_size`` (overrides the ``beam_size``
    argument); what is not given comes from the search type's defaults
    (:data:`~espnet_multiblank.espnet.inference.search_defaults.SEARCH_DEFAULTS`:
    the settings of ``conf/decode/<search_type>.yaml``). Non-transducer models are
    decoded exactly as by ESPnet.

    Args:
        asr_model_file: The trained model's parameters (required: without it ESPnet
            would decode with the config's random initial weights).
        random_weights: Decode with random initial weights on purpose (tests,
            demos); ``asr_model_file`` must then be None.
        beam_size: None: the search type's default (ESPnet's 20 for the models the
            plug-in leaves to ESPnet).

    Attributes:
        stats (DecodingStats): counters of the utterances decoded so far.
        plugin_search (bool): whether the plug-in chose the transducer search.
    """

    #: "all": every transducer model; "plugin": the plug-in's models and configs that
    #: ask for a plug-in search type (ESPnet's class wrapped by the start-up hook)
    replace_search = "all"

    def __init__(
        self,
        asr_train_config: Any = None,
        asr_model_file: Any = None,
        transducer_conf: Optional[Dict] = None,
        beam_size: Optional[int] = None,
        nbest: int = 1,
        ngram_file: Any = None,
        ngram_weight: float = 0.9,
        random_weights: bool = False,
        **kwargs: Any,
    ):
        config = _read_config(asr_train_config)
        replace = self.replace_search == "all" or _plugin_decodes(
            config, transducer_conf
        )
        if replace:
            _require_model_file(asr_model_file, random_weights)
        transducer = _config_is_transducer(config)
        if transducer and ngram_file is not None and not replace:
            raise ValueError(
                "--ngram_file: ESPnet's transducer searches do not use an n-gram LM "
                "(ESPnet would ignore it); decode with the plug-in's searches, e.g. "
                "transducer_conf: {search_type: mb_beam}"
            )
        if replace:
            # ESPnet 202611's Speech2Text takes batch_size and refuses a transducer
            # at > 1 (202511's has no such argument): the plug-in batches itself
            # (decode_batch, batch_decode, a list given to __call__)
            kwargs.pop("batch_size", None)
        search_type, search_beam, conf = search_settings(transducer_conf, beam_size)
        search_beam = int(search_beam)
        if beam_size is None:
            beam_size = ESPNET_BEAM_SIZE
        # ESPnet would build its own BeamSearchTransducer from transducer_conf, and
        # reject the plug-in's search types and keys: give it a neutral one and
        # replace the object below (its greedy search would also warn that the LM
        # is unused, which is not true of the search that replaces it)
        with _without_espnet_lm_warning(replace):
            super().__init__(
                asr_train_config=asr_train_config,
                asr_model_file=asr_model_file,
                transducer_conf=(
                    {"search_type": "default"} if replace else transducer_conf
                ),
                beam_size=search_beam if replace else beam_size,
                nbest=nbest,
                # the plug-in fuses an n-gram itself: ESPnet would build an unused
                # scorer (and need kenlm) for a transducer
                ngram_file=None if transducer else ngram_file,
                ngram_weight=ngram_weight,
                **kwargs,
            )
        self.stats = DecodingStats()
        self.plugin_search = False
        self.float32_frontend = False
        if self.beam_search_transducer is None:
            return
        if replace or is_plugin_model(self.asr_model):
            self._use_plugin_search(
                search_beam, search_type, nbest, ngram_file, ngram_weight, conf, kwargs
            )
            self._float32_frontend()
        warn_unused_options(kwargs, nbest, self.beam_search_transducer)
        if not isinstance(self.beam_search_transducer, TransducerSearch):
            _refuse_half_precision_espnet_search(self.dtype, self.device)

    def _use_plugin_search(
        self,
        beam_size: int,
        search_type: str,
        nbest: int,
        ngram_file: Any,
        ngram_weight: float,
        conf: Dict[str, Any],
        kwargs: Dict[str, Any],
    ) -> None:
        """Replace ESPnet's transducer search by :func:`build_transducer_search`'s,
        with ESPnet's LM (built by ``Speech2Text``) and the n-gram fused."""
        espnet_search = self.beam_search_transducer
        lm = espnet_search.lm
        lm_config = kwargs.get("lm_train_config")
        self.beam_search_transducer = build_transducer_search(
            self.asr_model,
            beam_size=beam_size,
            search_type=search_type,
            nbest=nbest,
            lm=lm,
            lm_weight=espnet_search.lm_weight,
            token_list=list(self.asr_model.token_list),
            lm_token_list=read_token_list(lm_config) if lm is not None else None,
            ngram_file=None if ngram_file is None else str(ngram_file),
            ngram_weight=ngram_weight,
            **conf,
        )
        self.plugin_search = True
        self.stats.search = type(self.beam_search_transducer).__name__
        self.lattice = lattice_from_model(self.asr_model)
        logger.info(
            "transducer search: %s (%s)",
            type(self.beam_search_transducer).__name__,
            self.lattice,
        )

    def _float32_frontend(self) -> None:
        """With ``--dtype float16`` / ``bfloat16``, run the frontend and the feature
        normalisation in float32 and give the encoder their output in the model's
        dtype: in float16 the STFT's power spectrum overflows (inf features, NaN
        scores for every utterance), in bfloat16 the waveform and the features lose
        all but 8 bits. The encoder and the search run in the model's dtype."""
        model = self.asr_model
        dtype = getattr(torch, self.dtype)
        frontend = getattr(model, "frontend", None)
        if dtype not in (torch.float16, torch.bfloat16) or frontend is None:
            return
        # the batch-exact layers first (they may replace these modules): the hooks
        # go on the modules that will run
        self.batch_exactness()
        frontend, normalize = model.frontend, getattr(model, "normalize", None)
        for module in (frontend, normalize):
            if module is not None:
                module.float()
        frontend.register_forward_pre_hook(_inputs_to_float32)
        last = normalize if normalize is not None else frontend
        last.register_forward_hook(functools.partial(_features_to, dtype))
        self.float32_frontend = True

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype the model's input is given in (float32 when the frontend runs in
        float32)."""
        return torch.float32 if self.float32_frontend else getattr(torch, self.dtype)

    def __call__(self, speech: Any, sample_rate: Any = None, fs: Any = None):
        """ESPnet's ``Speech2Text.__call__`` (one utterance), the input checked first
        (:meth:`checked_input`) and left in float32 when the frontend runs in
        float32. A list of utterances (what ESPnet 202611's ``__call__`` also takes)
        is decoded by :meth:`batch_decode`.

        Args:
            speech: (L,) or (L, 1) samples (numpy, torch), a ``(samples, rate)``
                pair (``soundfile.read``'s), or an audio file's path; (L, F)
                features for a model without a frontend.
            sample_rate, fs: The audio's sample rate (either name), checked against
                the model's when given (a pair or a file gives it too).

        Returns:
            The n-best list ``[(text, token, token_int, hyp)]``, best first.

        Raises:
            ValueError: an input the model cannot decode correctly, named with the
                reason (``speech: 2 channels, the model takes one ...``).
        """
        rate = rate_argument(sample_rate, fs)
        if is_utterance_list(speech):
            if self.plugin_search:
                return self.batch_decode(speech, sample_rate=rate)
            # ESPnet's searches: its own list handling, on checked inputs
            return super().__call__(
                [
                    self.checked_input(item, rate, f"speech[{b}]")
                    for b, item in enumerate(speech)
                ]
            )
        speech = self.checked_input(speech, rate)
        if not getattr(self, "float32_frontend", False):
            return super().__call__(speech)
        dtype, self.dtype = self.dtype, "float32"  # ESPnet casts speech to self.dtype
        try:
            return super().__call__(speech)
        finally:
            self.dtype = dtype

    def input_checks(self) -> InputChecks:
        """The model's :class:`~espnet_multiblank.espnet.inference.inputs.InputChecks`
        (built once; shared with the decoding loop and the streaming decoder)."""
        if getattr(self, "_input_checks", None) is None:
            self._input_checks = input_checks(self)
        return self._input_checks

    def checked_input(
        self, speech: Any, sample_rate: Optional[int] = None, name: str = "speech"
    ) -> torch.Tensor:
        """One input as the model takes it ((L,) float32 samples or (L, F)
        features), or a ``ValueError`` naming ``name`` and what is wrong: several
        channels, NaN / inf samples, empty or too short for the encoder, a sample
        rate (``sample_rate``, a pair's or a file's) other than the model's, an
        array of another rank. Takes what :meth:`__call__` takes."""
        speech, rate = as_waveform(speech, sample_rate, name)
        return self.input_checks().require(speech, rate, name)

    def min_input_samples(self) -> Optional[int]:
        """The fewest waveform samples the model's frontend and encoder take (None:
        not known), found once per ``Speech2Text`` by encoding silence
        (:func:`~espnet_multiblank.espnet.inference.inputs.min_encoder_samples`) and
        shared by every input check."""
        if not hasattr(self, "_min_samples"):
            model = self.asr_model
            was_training = model.training
            model.eval()
            try:
                self._min_samples = min_encoder_samples(
                    model, self.device, self.input_dtype
                )
            finally:
                model.train(was_training)
        return self._min_samples

    def frame_shift(self) -> float:
        """Seconds per encoder frame, measured once
        (:func:`~espnet_multiblank.espnet.inference.timestamps.encoder_frame_shift`).

        Raises:
            ValueError: the search gives no label timing (ESPnet's own searches), or
                the model takes features or has no known sample rate.
        """
        if getattr(self, "_frame_shift", None) is None:
            from espnet_multiblank.espnet.inference.timestamps import (
                encoder_frame_shift,
            )

            if not isinstance(self.beam_search_transducer, TransducerSearch):
                raise ValueError(
                    "word times come from the plug-in's searches; "
                    f"{type(self.beam_search_transducer).__name__} gives none (use "
                    "search_type mb_greedy, mb_beam, tdt_greedy or tdt_beam)"
                )
            self._frame_shift = encoder_frame_shift(
                self.asr_model,
                self.input_checks().fs,
                self.device,
                self.input_dtype,
            )
        return self._frame_shift

    def word_times(self, result: Tuple) -> List[Any]:
        """The words of one result ``(text, token, token_int, hyp)`` (an entry of
        an n-best list) with their start and end (seconds) and confidence:
        ``[WordTime(word, start, end, confidence)]``
        (:func:`~espnet_multiblank.espnet.inference.timestamps.word_times`; what
        the times mean: that module's docstring). Words by the model's
        ``token_type``."""
        from espnet_multiblank.espnet.inference.timestamps import word_times

        _, token, _, hyp = result
        token_type = getattr(self.asr_train_args, "token_type", None)
        return word_times(token, hyp.timing, token_type, self.frame_shift())

    @property
    def supports_batch(self) -> bool:
        """True when the search decodes several utterances at once."""
        search = self.beam_search_transducer
        return isinstance(search, TransducerSearch) and search.batched

    def _decode_single_sample(self, enc: torch.Tensor):
        if not self.plugin_search:
            return super()._decode_single_sample(enc)
        start = time.perf_counter()
        with single_thread_on_cpu(enc.device):
            nbest = self.beam_search_transducer(enc)
            # the log lines of ESPnet's own _decode_single_sample (same cost)
            best = nbest[0]
            logging.info(f"total log probability: {best.score:.2f}")
            logging.info(
                f"normalized log probability: {best.score / len(best.yseq):.2f}"
            )
            logging.info(
                "best hypo: " + "".join(self.converter.ids2tokens(best.yseq[1:])) + "\n"
            )
            results = self.hyps_to_results(nbest)
        self.stats.search_seconds += time.perf_counter() - start
        if results:
            self.stats.add(enc.shape[0], results[0][3])
        return results

    def hyps_to_results(self, nbest_hyps: List[Hypothesis]) -> List[Tuple]:
        """Hypotheses -> ESPnet's ``[(text, token, token_int, hyp)]``.

        ``yseq[0]`` is the start symbol; the transducer searches never put a blank
        after it, so no id is filtered out (ESPnet's own conversion drops id 0, which
        is a label when the blank is elsewhere).
        """
        results = []
        for hyp in nbest_hyps[: self.nbest]:
            token_int = [int(x) for x in hyp.yseq[1:]]
            token = self.converter.ids2tokens(token_int)
            text = self.tokenizer.tokens2text(token) if self.tokenizer else None
            results.append((text, token, token_int, to_espnet_hypothesis(hyp)))
        return results

    def batch_exactness(self) -> BatchExactness:
        """Whether the model encodes a padded batch exactly as one utterance at a time
        (:func:`~espnet_multiblank.espnet.batch_exact.exact_encoding.make_batch_exact`,
        applied on first use; logged once when it cannot be)."""
        result = getattr(self, "_batch_exactness", None)
        if result is None:
            result = make_batch_exact(self.asr_model)
            self._batch_exactness = result
            if not result.exact:
                logger.warning(
                    "batched decoding encodes one utterance at a time: %s",
                    result.reason,
                )
        return result

    @torch.no_grad()
    def batch_decode(
        self,
        speech: Union[torch.Tensor, np.ndarray, Sequence[Any]],
        speech_lengths: Optional[Any] = None,
        sample_rate: Any = None,
        fs: Any = None,
    ) -> List[List[Tuple]]:
        """ESPnet 202611's ``Speech2Text.batch_decode`` (same arguments, same
        results) with the plug-in's searches: the n-best list of each utterance, in
        the given order, as one at a time gives it; batched (:meth:`decode_batch`)
        when the search decodes several utterances at once.

        Args:
            speech: a list of unpadded inputs (anything :meth:`__call__` takes:
                ``(L_b,)`` samples, ``(samples, rate)`` pairs, file paths), or
                padded ``(B, L)`` samples with ``speech_lengths``.
            speech_lengths: ``(B,)`` valid samples of a padded ``speech``.
            sample_rate, fs: The sample rate of every utterance (either name).

        Returns:
            For each utterance, ``[(text, token, token_int, hyp)]``.

        Raises:
            ValueError: an utterance the model cannot decode correctly, named by
                its index (``speech[2]: non-finite samples ...``).
        """
        if not self.plugin_search:
            return super().batch_decode(speech, speech_lengths)
        rate = rate_argument(sample_rate, fs)
        if isinstance(speech, (list, tuple)):
            items = list(speech)
        else:
            speech, _ = as_waveform(speech, None)
            if speech_lengths is None:
                raise ValueError(
                    "speech_lengths is required with a padded speech array (B, L)"
                )
            lengths = torch.as_tensor(np.asarray(speech_lengths)).tolist()
            if speech.dim() < 2 or len(lengths) != speech.size(0):
                raise ValueError(
                    f"speech_lengths: {len(lengths)} lengths for a padded speech "
                    f"array of shape {tuple(speech.shape)} (expected (B, L) and B "
                    "lengths)"
                )
            items = [speech[b, : int(n)] for b, n in enumerate(lengths)]
        waves = [
            self.checked_input(item, rate, f"speech[{b}]")
            for b, item in enumerate(items)
        ]
        if not self.supports_batch or len(waves) < 2:
            return [self(wave) for wave in waves]
        lengths = torch.tensor([w.numel() for w in waves], dtype=torch.long)
        order = torch.argsort(lengths, descending=True).tolist()
        padded = torch.nn.utils.rnn.pad_sequence(
            [waves[i].float() for i in order], batch_first=True
        )
        decoded = self.decode_batch(padded, lengths[order])
        results: List[Any] = [None] * len(waves)
        for position, i in enumerate(order):
            results[i] = decoded[position]
        return results

    @torch.no_grad()
    def decode_batch(
        self,
        speech: torch.Tensor,
        speech_lengths: torch.Tensor,
        sample_rate: Any = None,
        fs: Any = None,
    ) -> List[List[Tuple]]:
        """Batched encoder and search; the same hypotheses as one at a time.

        The encoder runs on the padded batch when the model is batch-exact
        (:meth:`batch_exactness`: ESPnet's conformer and transformer, with the
        padding-invariant layers of
        :mod:`~espnet_multiblank.espnet.batch_exact.exact_encoding`), otherwise on each
        utterance alone. The search decodes the batch's utterances independently
        (:meth:`~espnet_multiblank.decoding.TransducerSearch.search_batch_nbest`:
        batched greedy and beam searches).

        Args:
            speech: (B, L) or (B, L, F) padded float input.
            speech_lengths: (B,) int lengths.
            sample_rate, fs: The utterances' sample rate (either name), checked
                against the model's when given.

        Returns:
            For each utterance, ESPnet's n-best list
            ``[(text, token, token_int, hyp)]``.

        Raises:
            ValueError: an utterance the model cannot decode correctly (the checks
                of :meth:`checked_input`), named by its row.
            TooShortUttError: the encoder gave an utterance no frames all the same.
        """
        if not self.supports_batch:
            raise NotImplementedError(
                f"{type(self.beam_search_transducer).__name__} decodes one utterance "
                "at a time"
            )
        rate = rate_argument(sample_rate, fs)
        speech = torch.as_tensor(speech)
        speech_lengths = torch.as_tensor(speech_lengths)
        for b in range(speech.size(0)):
            self.input_checks().require(
                speech[b, : int(speech_lengths[b])].float(), rate, f"speech[{b}]"
            )
        dtype = self.input_dtype
        if self.batch_exactness().exact:
            batch = {"speech": speech.to(dtype), "speech_lengths": speech_lengths}
            enc, enc_lens = self.asr_model.encode(**to_device(batch, self.device))
            if isinstance(enc, tuple):  # intermediate CTC outputs: not written here
                enc = enc[0]
            if bool((enc_lens <= 0).any()):
                b = int(torch.nonzero(enc_lens <= 0)[0])
                raise TooShortUttError(
                    f"utterance {b} of the batch has no encoder frames",
                    int(speech_lengths[b]),
                    -1,
                )
        else:
            encs = []
            for b in range(speech.size(0)):
                batch = {
                    "speech": speech[b : b + 1, : int(speech_lengths[b])].to(dtype),
                    "speech_lengths": speech_lengths[b : b + 1],
                }
                enc, _ = self.asr_model.encode(**to_device(batch, self.device))
                if isinstance(enc, tuple):
                    enc = enc[0]
                encs.append(enc[0])
            enc_lens = torch.tensor([e.size(0) for e in encs], device=encs[0].device)
            enc = torch.nn.utils.rnn.pad_sequence(encs, batch_first=True)
        start = time.perf_counter()
        with single_thread_on_cpu(enc.device):
            nbests = self.beam_search_transducer.search_batch_nbest(enc, enc_lens)
        self.stats.search_seconds += time.perf_counter() - start
        out = []
        for nbest, frames in zip(nbests, enc_lens.tolist()):
            results = self.hyps_to_results(nbest)
            if results:  # none: the decoding loop reports the utterance
                self.stats.add(frames, results[0][3])
            out.append(results)
        return out


def plugin_speech2text(base: type, replace_search: str = "all", name: str = "") -> type:
    """``base`` (ESPnet's ``Speech2Text`` class) with :class:`PluginSearchMixin`.

    Args:
        base: ESPnet's class (an already wrapped class is unwrapped first).
        replace_search: ``"all"`` or ``"plugin"`` (see
            :attr:`PluginSearchMixin.replace_search`).
        name: Class name (default: ``base``'s, so ESPnet's messages stay the same).
    """
    if replace_search not in ("all", "plugin"):
        raise ValueError(
            f"replace_search must be 'all' or 'plugin', got {replace_search!r}"
        )
    base = getattr(base, "espnet_speech2text", base)
    return type(
        name or base.__name__,
        (PluginSearchMixin, base),
        {
            "replace_search": replace_search,
            "espnet_speech2text": base,
            "__module__": base.__module__ if not name else __name__,
            "__qualname__": name or base.__qualname__,
            "__doc__": (
                f"ESPnet's ``{base.__name__}`` with the plug-in's transducer searches "
                f"(espnet_multiblank; replace_search={replace_search!r}).\n\n"
                + (PluginSearchMixin.__doc__ or "")
            ),
        },
    )


def __getattr__(name: str):
    # MultiblankSpeech2Text is made on first use: importing espnet2.bin.asr_inference
    # here at import time would re-enter the start-up hook while it wraps that module
    if name == "MultiblankSpeech2Text":
        from espnet2.bin import asr_inference

        cls = plugin_speech2text(asr_inference.Speech2Text, "all", name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
