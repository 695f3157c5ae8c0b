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

The class puts together what its sibling modules do: which models and decode configs
the plug-in decodes (:mod:`.search_choice`), the checks of its arguments
(:mod:`.argument_checks`) and inputs (:mod:`.inputs`), the frontend in float32 under
half precision (:mod:`.half_precision`), the encoder output of a padded batch
(:mod:`.batch_encoding`), ESPnet's results of the hypotheses (:mod:`.results`) and
the decoding statistics (:mod:`.decoding_stats`).

This module does not import ``espnet2.bin.asr_inference`` until
``MultiblankSpeech2Text`` is first used, so the start-up hook can wrap that module
while it is being executed.
"""

# before ESPnet's modules: their import prints nothing (quiet's docstring)
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  isort: skip
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from espnet_multiblank.decoding import (
    Hypothesis,
    TransducerSearch,
    single_thread_on_cpu,
)
from espnet_multiblank.espnet.batch_exact.exact_encoding import (
    BatchExactness,
    make_batch_exact,
)
from espnet_multiblank.espnet.inference.argument_checks import (
    TRANSDUCER_UNUSED,
    refuse_espnet_ngram,
    refuse_half_precision_espnet_search,
    require_model_file,
    warn_unused_options,
)
from espnet_multiblank.espnet.inference.batch_encoding import encode_padded
from espnet_multiblank.espnet.inference.decoding_stats import (
    DecodingStats,
    write_decoding_stats,
)
from espnet_multiblank.espnet.inference.half_precision import (
    needs_float32_frontend,
    run_frontend_in_float32,
)
from espnet_multiblank.espnet.inference.inputs import (
    InputChecks,
    as_waveform,
    batch_items,
    input_checks,
    is_utterance_list,
    min_encoder_samples,
    rate_argument,
)
from espnet_multiblank.espnet.inference.lm_fusion import read_token_list
from espnet_multiblank.espnet.inference.results import (
    DecodedHypothesis,
    espnet_results,
    to_espnet_hypothesis,
)
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    lattice_from_model,
)
from espnet_multiblank.espnet.inference.search_choice import (
    builds_transducer,
    config_is_transducer,
    is_plugin_model,
    plugin_decodes,
    plugin_decodes_config,
    read_train_config,
    requests_plugin_search,
)
from espnet_multiblank.espnet.inference.search_defaults import (
    ESPNET_BEAM_SIZE,
    search_settings,
)

#: the names this module serves: its own, and those that moved to the modules above
#: (imported from here still); MultiblankSpeech2Text is made on first use (F822)
__all__ = [  # noqa: F822
    "MultiblankSpeech2Text",
    "PluginSearchMixin",
    "plugin_speech2text",
    "DecodedHypothesis",
    "to_espnet_hypothesis",
    "DecodingStats",
    "write_decoding_stats",
    "config_is_transducer",
    "is_plugin_model",
    "plugin_decodes",
    "requests_plugin_search",
    "TRANSDUCER_UNUSED",
    "warn_unused_options",
]

logger = logging.getLogger(__name__)


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
        config = read_train_config(asr_train_config)
        replace = self.replace_search == "all" or plugin_decodes_config(
            config, transducer_conf
        )
        if replace:
            require_model_file(asr_model_file, random_weights)
        transducer = builds_transducer(config)
        refuse_espnet_ngram(transducer, ngram_file, replace)
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
            refuse_half_precision_espnet_search(self.dtype, self.device)

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
        normalisation in float32
        (:mod:`~espnet_multiblank.espnet.inference.half_precision`)."""
        dtype = getattr(torch, self.dtype)
        if not needs_float32_frontend(self.asr_model, dtype):
            return
        # the batch-exact layers first (they may replace these modules): the hooks
        # go on the modules that will run
        self.batch_exactness()
        run_frontend_in_float32(self.asr_model, dtype)
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
        """Hypotheses, best first -> ESPnet's ``[(text, token, token_int, hyp)]``
        of the first ``nbest``
        (:func:`~espnet_multiblank.espnet.inference.results.espnet_results`)."""
        return espnet_results(nbest_hyps[: self.nbest], self.converter, self.tokenizer)

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
        waves = [
            self.checked_input(item, rate, f"speech[{b}]")
            for b, item in enumerate(batch_items(speech, speech_lengths))
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
        enc, enc_lens = encode_padded(
            self.asr_model,
            speech,
            speech_lengths,
            self.input_dtype,
            self.device,
            self.batch_exactness().exact,
        )
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
