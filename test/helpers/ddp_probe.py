"""Test launcher: ``python -m espnet_multiblank.bin.asr_train`` with a probe in every
DDP rank (used by test_espnet_ddp.py through torchrun and the CPU spawn path).

Importing this file wraps ESPnet's ``Trainer.train_one_epoch`` so that each rank writes
``$DDP_PROBE_DIR/rank{R}.epoch{E}.pt`` after epoch E: the utterance ids it trained on,
the parameters and the whole ``state_dict`` (buffers included) of the model inside
DDP, and its torch thread count. Workers of the spawn path re-import this file as
``__mp_main__``, so they are probed too.

``DDP_PROBE_FAIL=R:E:exit`` makes rank R exit at once (``os._exit(3)``, no Python
error) when epoch E starts; ``R:E:hang`` makes it sleep instead (a rank that stopped
responding); either first creates ``$DDP_PROBE_DIR/{exit,hang}_started``.
"""

import os
import sys
import time

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.bin import asr_train  # the entry point under test

# isort: split
import torch
from espnet2.train.trainer import Trainer

_ORIGINAL = Trainer.train_one_epoch.__func__
_EPOCH = [0]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _fail_here(rank: int, epoch: int) -> None:
    spec = os.environ.get("DDP_PROBE_FAIL")
    if not spec:
        return
    fail_rank, fail_epoch, how = spec.split(":")
    if (int(fail_rank), int(fail_epoch)) != (rank, epoch):
        return
    print(f"ddp_probe: rank {rank} {how} at epoch {epoch}", file=sys.stderr, flush=True)
    open(os.path.join(os.environ["DDP_PROBE_DIR"], f"{how}_started"), "w").close()
    if how == "exit":
        os._exit(3)
    time.sleep(3600)


def train_one_epoch(cls, **kwargs):
    _EPOCH[0] += 1
    epoch, rank = _EPOCH[0], _rank()
    _fail_here(rank, epoch)
    seen = []

    def recorded(iterator):
        for ids, batch in iterator:
            seen.extend(ids)
            yield ids, batch

    kwargs["iterator"] = recorded(kwargs["iterator"])
    result = _ORIGINAL(cls, **kwargs)
    model = getattr(kwargs["model"], "module", kwargs["model"])
    torch.save(
        dict(
            ids=seen,
            params={k: v.detach().clone() for k, v in model.named_parameters()},
            state={k: v.detach().clone() for k, v in model.state_dict().items()},
            threads=torch.get_num_threads(),
            model_class=type(model).__name__,
        ),
        os.path.join(os.environ["DDP_PROBE_DIR"], f"rank{rank}.epoch{epoch}.pt"),
    )
    return result


Trainer.train_one_epoch = classmethod(train_one_epoch)

if __name__ == "__main__":
    asr_train.main()
