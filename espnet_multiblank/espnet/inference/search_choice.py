"""Which search decodes a model: the plug-in's or ESPnet's.

Read from the training config (``config.yaml``: ``model:``, ``decoder:``) and the
decode config's ``transducer_conf``, before any model is built: the plug-in decodes
its own models (``model: multiblank_espnet``) and any transducer whose
``transducer_conf`` asks for a plug-in search type or key; the start-up hook's
``Speech2Text`` and ``inference`` leave everything else to ESPnet.
"""

from typing import Any, Dict, Optional

from espnet_multiblank.espnet.inference.search import (
    PLUGIN_ONLY_KEYS,
    PLUGIN_SEARCH_TYPES,
)
from espnet_multiblank.espnet.registration import PLUGIN_MODELS


def read_train_config(asr_train_config: Any) -> Dict[str, Any]:
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


def config_model_name(config: Dict[str, Any]) -> Optional[str]:
    """The ``model:`` of a training config, lower case, or None."""
    model = config.get("model")
    return model.lower() if isinstance(model, str) else None


def builds_transducer(config: Dict[str, Any]) -> bool:
    """Whether a training config builds a transducer (ESPnet: ``decoder:
    transducer``)."""
    decoder = config.get("decoder")
    return isinstance(decoder, str) and decoder.lower() == "transducer"


def config_is_transducer(asr_train_config: Any) -> bool:
    """Whether a training config file builds a transducer (``decoder:
    transducer``)."""
    return builds_transducer(read_train_config(asr_train_config))


def is_plugin_model(model: Any) -> bool:
    """Whether a built model is the plug-in's ``MultiblankESPnetASRModel``."""
    # imported when asked: the model pulls in the loss and its kernels, which the
    # config checks of the stock entry point's wrapper never need
    from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel

    return isinstance(model, MultiblankESPnetASRModel)


def requests_plugin_search(transducer_conf: Optional[Dict]) -> bool:
    """True when a decode config's ``transducer_conf`` names a plug-in search type or
    a key only the plug-in's searches know."""
    conf = transducer_conf or {}
    return conf.get("search_type") in PLUGIN_SEARCH_TYPES or any(
        key in conf for key in PLUGIN_ONLY_KEYS
    )


def plugin_decodes_config(
    config: Dict[str, Any], transducer_conf: Optional[Dict]
) -> bool:
    """:func:`plugin_decodes` of a training config already read."""
    return (
        requests_plugin_search(transducer_conf)
        or config_model_name(config) in PLUGIN_MODELS
    )


def plugin_decodes(asr_train_config: Any, transducer_conf: Optional[Dict]) -> bool:
    """Whether the start-up hook's ``Speech2Text`` gives this model and decode config
    the plug-in's search: a plug-in model (``model: multiblank_espnet``) or a
    ``transducer_conf`` that asks for a plug-in search type or key."""
    return plugin_decodes_config(read_train_config(asr_train_config), transducer_conf)
