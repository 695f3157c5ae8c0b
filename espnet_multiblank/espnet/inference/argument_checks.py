"""Checks of the plug-in ``Speech2Text``'s arguments: what would decode wrongly or
not at all is refused with the reason, what a transducer search ignores is named in
one warning."""

import logging
from typing import Any, Dict

logger = logging.getLogger(__name__)

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


def require_model_file(asr_model_file: Any, random_weights: bool) -> None:
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


def refuse_espnet_ngram(transducer: bool, ngram_file: Any, plugin: bool) -> None:
    """An n-gram file with a transducer that ESPnet's searches decode (``plugin``
    false): ESPnet would ignore it."""
    if transducer and ngram_file is not None and not plugin:
        raise ValueError(
            "--ngram_file: ESPnet's transducer searches do not use an n-gram LM "
            "(ESPnet would ignore it); decode with the plug-in's searches, e.g. "
            "transducer_conf: {search_type: mb_beam}"
        )


def refuse_half_precision_espnet_search(dtype: str, device: Any) -> None:
    """ESPnet's transducer searches step the prediction network with ``nn.LSTM``,
    which has no half-precision CPU kernel: every utterance would fail."""
    if dtype in ("float16", "bfloat16") and str(device).startswith("cpu"):
        raise ValueError(
            f"--dtype {dtype}: ESPnet's transducer searches cannot run in {dtype} on "
            "a CPU (nn.LSTM has no such kernel); use the plug-in's searches "
            "(transducer_conf search_type: mb_greedy, mb_beam) or --dtype float32"
        )


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
