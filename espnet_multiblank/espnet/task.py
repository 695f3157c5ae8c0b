"""ESPnet's ASR task with the plug-in registered and its config checked up front.

:class:`MultiblankASRTask` is ``espnet2.tasks.asr.ASRTask`` (same parser, same
``main``, same checkpoints) with two additions:

* importing this module registers the plug-in, and ESPnet's DDP workers (started with
  ``spawn``) unpickle their target ``MultiblankASRTask.main_worker`` by importing this
  module, so they are registered whatever ``__main__`` is;
* ``build_model`` validates the plug-in's ``model_conf`` keys *before* ESPnet's
  ``ASRTask.build_model`` edits the token list with them, so a bad value fails with a
  message naming its YAML key instead of an error from inside ESPnet.
"""

import argparse

import espnet_multiblank.espnet.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.registration import register

register()

from espnet2.asr.espnet_model import ESPnetASRModel  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.errors import ConfigError  # noqa: E402
from espnet_multiblank.espnet.model import check_model_conf  # noqa: E402

#: model choice names whose model_conf this task validates
PLUGIN_MODELS = ("multiblank_espnet",)


def check_args(args: argparse.Namespace) -> None:
    """Validate the plug-in's part of a parsed ASR config (raises ConfigError)."""
    if (getattr(args, "model", None) or "").lower() not in PLUGIN_MODELS:
        return
    conf = dict(getattr(args, "model_conf", None) or {})
    check_model_conf(
        conf.get("transducer_multi_blank_durations", ()),
        conf.get("transducer_multi_blank_sigma", 0.05),
        conf.get("transducer_fastemit_lambda", 0.0),
        conf.get("transducer_clamp", 0.0),
        conf.get("transducer_reduction", "mean"),
        conf.get("transducer_loss_backend", "auto"),
    )
    sym_blank = conf.get("sym_blank", "<blank>")
    token_list = args.token_list
    if isinstance(token_list, str):
        with open(token_list, encoding="utf-8") as f:
            token_list = [line.rstrip() for line in f]
    if token_list is not None and sym_blank not in token_list:
        raise ConfigError(
            f"model_conf.sym_blank={sym_blank!r} is not in token_list: a transducer "
            "needs a blank symbol"
        )
    if getattr(args, "decoder", None) != "transducer":
        raise ConfigError(
            f"model: {args.model} is a transducer: set decoder: transducer (got "
            f"decoder: {getattr(args, 'decoder', None)})"
        )


class MultiblankASRTask(ASRTask):
    """``ASRTask`` whose ``build_model`` first checks the plug-in's config keys."""

    @classmethod
    def build_model(cls, args: argparse.Namespace) -> ESPnetASRModel:
        register()
        check_args(args)
        return super().build_model(args)
