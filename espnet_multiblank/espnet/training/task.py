"""ESPnet's ASR task with the plug-in registered, its config checked up front and
DDP that also works on CPU.

:class:`MultiblankASRTask` is ``espnet2.tasks.asr.ASRTask`` (same parser, same
``main``, same checkpoints) with three additions:

* importing this module registers the plug-in, and ESPnet's DDP workers (started with
  ``spawn``) unpickle their target ``MultiblankASRTask.main_worker`` by importing this
  module, so they are registered whatever ``__main__`` is;
* ``build_model`` validates the plug-in's ``model_conf`` keys *before* ESPnet's
  ``ASRTask.build_model`` edits the token list with them, so a bad value fails with a
  message naming its YAML key instead of an error from inside ESPnet;
* distributed training (:mod:`espnet_multiblank.espnet.training.ddp`):
  ``--dist_backend`` defaults to gloo with ``--ngpu 0``, ``--dist_timeout`` bounds
  every collective operation, torchrun works with GPUs hidden, and
  ``--multiprocessing_distributed true --dist_world_size N --ngpu 0`` starts N CPU
  workers (:mod:`espnet_multiblank.espnet.training.cpu_spawn`). GPU runs take
  ESPnet's own paths.
"""

import argparse
import sys
from typing import Optional, Sequence

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.registration import PLUGIN_MODELS, register

register()

from espnet2.asr.espnet_model import ESPnetASRModel  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.errors import ConfigError  # noqa: E402
from espnet_multiblank.espnet.model.asr_model import model_conf_defaults  # noqa: E402
from espnet_multiblank.espnet.model.model_conf import (  # noqa: E402
    KEYS,
    check_model_conf,
)
from espnet_multiblank.espnet.training import cpu_spawn, ddp  # noqa: E402


def check_args(args: argparse.Namespace) -> None:
    """Validate the plug-in's part of a parsed ASR config (raises ConfigError)."""
    if (getattr(args, "model", None) or "").lower() not in PLUGIN_MODELS:
        return
    conf = dict(getattr(args, "model_conf", None) or {})
    # the keys the config leaves out take the model constructor's defaults
    check_model_conf(
        **{**model_conf_defaults(), **{k: conf[k] for k in KEYS if k in conf}}
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


#: help texts of ESPnet's training options that have none (the others keep ESPnet's)
TRAINING_HELP = {
    "output_dir": "the experiment's directory: config.yaml, checkpoints, "
    "*epoch.pth, valid.*.ave.pth, train.log, images (with --collect_stats: the "
    "shape and feature statistics files)",
    "train_shape_file": "a shape file of the training data (key and length per "
    "line; --collect_stats writes <output_dir>/train/speech_shape); repeatable",
    "valid_shape_file": "a shape file of the validation data; repeatable",
    "fold_length": "per input, a length above which an utterance halves its "
    "batch (batch_type folded); repeatable",
    "valid_data_path_and_name_and_type": "PATH,NAME,TYPE of the validation data, "
    "as --train_data_path_and_name_and_type; repeatable",
}


class MultiblankASRTask(ASRTask):
    """``ASRTask`` whose ``build_model`` first checks the plug-in's config keys and
    whose ``main`` / ``main_worker`` also run DDP on CPU."""

    @classmethod
    def get_parser(cls) -> argparse.ArgumentParser:
        """ESPnet's ASR parser; ``--dist_backend`` defaults by device,
        ``--dist_timeout`` is added, and the options without a help text get one
        (:data:`TRAINING_HELP`: ``--help`` then shows their defaults too)."""
        register()
        parser = ddp.add_arguments(super().get_parser())
        for action in parser._actions:
            if not action.help and action.dest in TRAINING_HELP:
                action.help = TRAINING_HELP[action.dest]
        return parser

    @classmethod
    def build_model(cls, args: argparse.Namespace) -> ESPnetASRModel:
        register()
        check_args(args)
        return super().build_model(args)

    @classmethod
    def main(
        cls,
        args: Optional[argparse.Namespace] = None,
        cmd: Optional[Sequence[str]] = None,
    ):
        """ESPnet's ``main``, plus the CPU spawn path (N CPU workers on this machine
        for ``--multiprocessing_distributed true --dist_world_size N --ngpu 0``)."""
        register()
        if args is None:
            args = cls.get_parser().parse_args(cmd)
        if args.print_config:
            return super().main(args=args)
        ddp.prepare(args)
        nprocs = ddp.cpu_spawn_world_size(args)
        if not nprocs:
            return super().main(args=args)
        # what ESPnet's main does before it starts workers
        from espnet2 import __version__

        from espnet_multiblank.espnet.compat import get_commandline_args

        print(get_commandline_args(), file=sys.stderr)
        args.version = __version__
        if args.pretrain_path is not None:
            raise RuntimeError("--pretrain_path is deprecated. Use --init_param")
        cls.check_required_command_args(args)
        ddp.check_backend(args)
        check_args(args)  # fail once here rather than in every worker
        cpu_spawn.launch(cls, args, nprocs)

    @classmethod
    def main_worker(cls, args: argparse.Namespace):
        """ESPnet's ``main_worker`` (one DDP rank, or the whole single-process run)
        with the backend resolved, CPU ranks' ``local_rank`` fixed, the process-group
        timeout applied, a failed collective explained and the group torn down on every
        rank at the end."""
        register()
        ddp.prepare_worker(args)
        with ddp.process_group_timeout(args.dist_timeout):
            with ddp.explain_rank_failure(args.dist_timeout):
                result = super().main_worker(args)
                ddp.finish_process_group()
        return result
