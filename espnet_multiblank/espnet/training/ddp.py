"""Distributed (DDP) options of the plug-in's training entry point.

ESPnet 202511 trains with ``torch.distributed`` but assumes GPUs in three places; the
plug-in's :class:`~espnet_multiblank.espnet.training.task.MultiblankASRTask` uses the
helpers here to make the same flags work on CPU:

* ``--dist_backend`` defaults to ``gloo`` with ``--ngpu 0`` and to ``nccl`` otherwise
  (ESPnet's default ``nccl`` makes torch raise on CPU); an explicit ``nccl`` on CPU is
  rejected with a message that names the flag;
* a CPU rank's ``local_rank`` is pinned to 0: ESPnet checks ``LOCAL_RANK`` against
  ``CUDA_VISIBLE_DEVICES`` (a GPU index), so torchrun with hidden GPUs failed;
* ``--dist_timeout SECONDS`` bounds every collective operation and the start-up
  rendezvous (torch's default: 30 min for gloo, 10 min for NCCL): a rank that died or
  stopped responding makes the others fail instead of waiting; the error they raise
  says so (:class:`DistributedTrainingError`);
* ``--multiprocessing_distributed true --dist_world_size N --ngpu 0`` starts N CPU
  workers on this machine (:mod:`espnet_multiblank.espnet.training.cpu_spawn`);
  ESPnet's own spawn path only starts one worker per GPU.

Nothing here imports ESPnet at import time.
"""

import argparse
import contextlib
import datetime
import logging
import os
import sys
from typing import Iterator, Optional

from espnet_multiblank.espnet.errors import ConfigError

#: backend chosen when ``--dist_backend`` is not given
DEFAULT_BACKEND = {"cpu": "gloo", "gpu": "nccl"}

#: substrings of the errors torch's backends raise when a peer rank is gone
_PEER_FAILURE_MARKS = (
    "gloo",
    "NCCL",
    "Timed out",  # gloo: "Timed out waiting 600000ms for recv operation"
    "Connection closed",
    "Connection reset",
    "Broken pipe",
)


class DistributedTrainingError(RuntimeError):
    """A DDP rank failed because another rank died or stopped responding, or a worker
    of the CPU spawn path failed (the message names the rank and the cause)."""


def _positive_seconds(value) -> Optional[float]:
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(
            "--dist_timeout must be a positive number of seconds (e.g. 600) or none "
            f"for torch's default, got {value!r}"
        )
    return seconds


def _seconds_arg(value: str) -> Optional[float]:
    try:
        return _positive_seconds(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Change ESPnet's ``--dist_backend`` default to "by device" and add
    ``--dist_timeout`` (both in place; returns ``parser``)."""
    for action in parser._actions:  # argparse keeps no public accessor
        if action.dest == "dist_backend":
            action.default = None
            action.help = (
                "distributed backend; default: gloo with --ngpu 0, nccl with GPUs"
            )
    parser.set_defaults(dist_backend=None)
    parser.add_argument(
        "--dist_timeout",
        type=_seconds_arg,
        default=None,
        help="seconds a rank waits in a collective operation (and at start-up for the "
        "other ranks) before it fails; default: torch's (30 min gloo, 10 min nccl)",
    )
    return parser


def prepare(args: argparse.Namespace) -> argparse.Namespace:
    """Resolve the backend default and validate ``dist_timeout`` (in place, idempotent;
    also accepts a namespace from ESPnet's stock parser)."""
    if getattr(args, "dist_backend", None) is None:
        gpu = (getattr(args, "ngpu", 0) or 0) > 0
        args.dist_backend = DEFAULT_BACKEND["gpu" if gpu else "cpu"]
    args.dist_timeout = _positive_seconds(getattr(args, "dist_timeout", None))
    return args


def check_backend(args: argparse.Namespace) -> None:
    """Reject NCCL for a distributed CPU run (torch would raise deep inside ESPnet)."""
    if args.ngpu == 0 and str(args.dist_backend).lower() == "nccl":
        raise ConfigError(
            "--dist_backend nccl needs GPUs (--ngpu > 0); with --ngpu 0 use "
            "--dist_backend gloo (the default when --dist_backend is not given)"
        )


def prepare_worker(args: argparse.Namespace) -> None:
    """Per-rank fixes before ESPnet's ``main_worker`` (in place)."""
    prepare(args)
    if not getattr(args, "distributed", False):
        return
    check_backend(args)
    if args.ngpu == 0:
        # ESPnet's local_rank is a GPU index, checked against CUDA_VISIBLE_DEVICES
        # (torchrun's LOCAL_RANK=1 with CUDA_VISIBLE_DEVICES= fails that check) and
        # otherwise read from LOCAL_RANK or taken out of CUDA_VISIBLE_DEVICES; a CPU
        # rank uses no GPU, so any fixed value is right and 0 passes the check.
        args.local_rank = 0


def cpu_spawn_world_size(args: argparse.Namespace) -> int:
    """Number of CPU workers to start on this machine, or 0 for ESPnet's own paths.

    The CPU spawn path is taken for ``--multiprocessing_distributed true --ngpu 0``
    with ``--dist_world_size N`` (N > 1) when no launcher and no node rank are given
    (``--dist_rank`` unset, no ``RANK`` in the environment: torchrun, slurm and ESPnet's
    launch.py set one). With a node rank ESPnet's meaning applies: one CPU process per
    node, N nodes.
    """
    if not args.multiprocessing_distributed or args.ngpu != 0:
        return 0
    if args.dist_launcher is not None or args.dist_rank is not None:
        return 0
    if "RANK" in os.environ:
        return 0
    n = args.dist_world_size
    if n is None:
        return 0
    if n < 1:
        raise ConfigError(f"--dist_world_size must be >= 1, got {n}")
    return n if n > 1 else 0


@contextlib.contextmanager
def process_group_timeout(seconds: Optional[float]) -> Iterator[None]:
    """Give ``torch.distributed.init_process_group`` a timeout while inside.

    ESPnet's ``DistributedOption.init_torch_distributed`` calls it without one; the
    timeout bounds the rendezvous and every later collective of the default group.
    Only calls that pass no timeout of their own are changed.
    """
    if seconds is None:
        yield
        return
    import torch.distributed as dist

    original = dist.init_process_group
    timeout = datetime.timedelta(seconds=seconds)

    def init_process_group(*args, **kwargs):
        kwargs.setdefault("timeout", timeout)
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group
    try:
        yield
    finally:
        dist.init_process_group = original


def _is_peer_failure(error: BaseException) -> bool:
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    return isinstance(error, RuntimeError) and any(
        mark in str(error) for mark in _PEER_FAILURE_MARKS
    )


@contextlib.contextmanager
def explain_rank_failure(timeout: Optional[float]) -> Iterator[None]:
    """Turn a failed collective into :class:`DistributedTrainingError` naming this rank,
    the likely cause (another rank died or hangs) and the timeout."""
    try:
        yield
    except Exception as error:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise
        if not _is_peer_failure(error) or isinstance(error, DistributedTrainingError):
            raise
        rank, world = dist.get_rank(), dist.get_world_size()
        waited = (
            f"--dist_timeout {timeout:g} s"
            if timeout is not None
            else "torch's default timeout (--dist_timeout)"
        )
        message = (
            f"DDP rank {rank} of {world}: a collective operation failed "
            f"({type(error).__name__}: {str(error).strip()[:500]}). Another rank has "
            f"most likely died or stopped responding (ranks wait at most {waited}); "
            "its own log shows the first error."
        )
        logging.error(message)
        raise DistributedTrainingError(message) from error


#: set once this process tore down a process group after a finished DDP training
_finished = {"ddp": False}


def finish_process_group() -> None:
    """After a rank's training returned: wait for every rank (rank 0 still averages and
    saves the models while the others are done), then tear the default process group
    down.

    ESPnet leaves the group alive when ``main_worker`` returns; a rank that then exits
    while a peer still holds the connection can be aborted from gloo's threads at
    interpreter shutdown ("terminate called without an active exception", SIGABRT),
    which failed the CPU DDP tests here in two of five runs of them (one 2-rank
    training of six each time). Tearing down is not enough on its own: see
    :func:`exit_finished_rank`.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _finished["ddp"] = True


def _flush_open_writers() -> None:
    """Flush what a process may still buffer: ESPnet's tensorboard writers (its
    trainer never closes them), logging handlers, stdout and stderr."""
    import gc

    tensorboard = sys.modules.get("torch.utils.tensorboard")
    writer_type = getattr(tensorboard, "SummaryWriter", None)
    if writer_type is not None:
        for obj in gc.get_objects():
            # type(), not isinstance(): the latter reads __class__, which some
            # objects turn into a warning (torch.distributed.reduce_op)
            if issubclass(type(obj), writer_type):
                try:
                    obj.flush()
                except Exception as e:  # a closed writer; nothing to keep
                    logging.debug("tensorboard writer not flushed: %s", e)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def exit_finished_rank() -> None:
    """End this process now, with status 0, if it ran a DDP rank whose training
    finished (:func:`finish_process_group` tore its group down); otherwise return.

    Why: with torch 2.14, a gloo process group that ``DistributedDataParallel`` used
    outlives ``destroy_process_group`` (its ``pt_gloo_runloop`` and ``gloo_tcp_loop``
    threads were still running after it, after deleting the model and a garbage
    collection; plain collectives without DDP leave none), and the interpreter's normal
    exit then sometimes aborts ("terminate called without an active exception",
    SIGABRT, in a rank of the CPU spawn path: once in about 30 runs of that test here,
    once in the six 2-rank trainings of a CI run; most likely while C++ objects are
    destroyed beside those threads: no failing run was caught in a debugger): a
    finished, saved training reported as a crash. ``os._exit`` skips that teardown.
    Only entry points that own their process call this (the CPU spawn path's workers,
    ``python -m espnet_multiblank.bin.asr_train``); buffered output is flushed first.
    """
    if not _finished["ddp"]:
        return
    _flush_open_writers()
    os._exit(0)
