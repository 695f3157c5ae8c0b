"""One ESPnet training step of a tiny multi-blank model, in one process over a global
batch or in one DDP rank over its shard (used by test_espnet_ddp.py).

The step is ESPnet's own ``Trainer.train_one_epoch`` with a one-batch iterator, so the
loss weighting ESPnet applies under DDP (loss x shard size / global size x world size,
then DDP's gradient average) is the one under test. Plain SGD: the parameter change is
``-lr x gradient``, so comparing parameters after the step compares gradients, scale
included (Adam's first step would hide the scale).

The model has no batch-dependent layer (the conformer's convolution module holds a
BatchNorm, so it is off) and every utterance has the same number of samples (no
padding of the audio: the STFT and the encoder see the same frames whatever the
batch), so one process over 2b utterances and two ranks over b each compute the same
per-utterance losses.
"""

import datetime
import os
from typing import Dict, List, Tuple

import numpy as np
import torch
import yaml
from espnet_cases import TOKENS, tiny_config

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.training import ddp
from espnet_multiblank.espnet.training.task import MultiblankASRTask

#: variant name -> model_conf overrides
VARIANTS = {
    "mean": {},
    "fastemit_clamp": dict(transducer_fastemit_lambda=0.01, transducer_clamp=0.002),
    "mean_label_normalized": dict(transducer_reduction="mean_label_normalized"),
    # sum: ESPnet weights each rank's loss by its share of the batch, so a summed loss
    # gets 1/world of the one-process gradient; no CTC so that the factor is exact
    "sum": dict(transducer_reduction="sum", ctc_weight=0.0),
    # the fused joint + loss: "mean"'s step, under DDP too
    "fused_mean": dict(transducer_fused_joint=True),
}
BATCH = 8
SAMPLES = 2400
LR = 0.05


def write_configs(root: str) -> None:
    """``root/{variant}.yaml`` and ``root/tokens.txt``."""
    with open(os.path.join(root, "tokens.txt"), "w") as f:
        f.write("\n".join(TOKENS) + "\n")
    for name, overrides in VARIANTS.items():
        conf = tiny_config(**dict(dict(ctc_weight=0.3), **overrides))
        conf["encoder_conf"]["use_cnn_module"] = False  # BatchNorm: batch-dependent
        conf.update(
            optim="sgd",
            optim_conf=dict(lr=LR),
            grad_clip=1.0e9,  # no clipping: the gradient itself is compared
            log_interval=1,
        )
        with open(os.path.join(root, f"{name}.yaml"), "w") as f:
            yaml.safe_dump(conf, f)


def global_batch(token_list: List[str]) -> List[Tuple[str, Dict[str, np.ndarray]]]:
    """``BATCH`` utterances of ``SAMPLES`` samples each, 1 to 4 labels (ids in the
    model's ``token_list``, big blanks included)."""
    rng = np.random.default_rng(7)
    ids = {t: i for i, t in enumerate(token_list)}
    labels = [ids[t] for t in ("a", "b", "c", "<space>")]
    data = []
    for i in range(BATCH):
        n = 1 + i % 4
        data.append(
            (
                f"utt{i}",
                dict(
                    speech=rng.standard_normal(SAMPLES).astype(np.float32) * 0.1,
                    text=rng.choice(labels, size=n).astype(np.int64),
                ),
            )
        )
    return data


def one_step(root: str, variant: str, rank: int, world: int) -> Dict:
    """Build the model (seed 0), run one ESPnet training step on this rank's shard
    (every ``world``-th utterance from ``rank``, as ESPnet shards batches) and return
    the parameters before and after."""
    from espnet2.train.collate_fn import common_collate_fn
    from espnet2.train.distributed_utils import DistributedOption
    from espnet2.train.reporter import Reporter
    from espnet2.train.trainer import Trainer

    parser = MultiblankASRTask.get_parser()
    args = parser.parse_args(
        ["--config", os.path.join(root, f"{variant}.yaml")]
        + ["--token_list", os.path.join(root, "tokens.txt"), "--ngpu", "0"]
    )
    torch.manual_seed(0)
    model = MultiblankASRTask.build_model(args)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimizers = MultiblankASRTask.build_optimizers(args, model=model)
    if world > 1:
        dp_model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        dp_model = model
    shard = global_batch(model.token_list)[rank::world]
    batch = common_collate_fn(shard, float_pad_value=0.0, int_pad_value=-1)
    reporter = Reporter()
    reporter.set_epoch(1)
    with reporter.observe("train") as sub:
        Trainer.train_one_epoch(
            model=dp_model,
            iterator=[batch],
            optimizers=optimizers,
            schedulers=[None],
            scaler=None,
            reporter=sub,
            summary_writer=None,
            options=Trainer.build_options(args),
            distributed_option=DistributedOption(
                distributed=world > 1, ngpu=0, dist_rank=rank, dist_world_size=world
            ),
        )
    after = {k: v.detach().clone() for k, v in model.named_parameters()}
    return dict(before=before, after=after, ids=[u for u, _ in shard])


def rank_main(rank: int, world: int, root: str, port: int) -> None:
    """Spawn target: every variant's step in DDP rank ``rank``; results in
    ``root/{variant}.rank{rank}.pt``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        for variant in VARIANTS:
            out = one_step(root, variant, rank, world)
            torch.save(out, os.path.join(root, f"{variant}.rank{rank}.pt"))
    except BaseException:
        dist.destroy_process_group()
        raise
    # as the plug-in's entry points end a DDP rank (torch's teardown after DDP can
    # abort a finished process)
    ddp.finish_process_group()
    ddp.exit_finished_rank()
