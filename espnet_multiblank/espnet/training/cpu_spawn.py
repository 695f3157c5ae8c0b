"""Start N CPU DDP workers on this machine (``--multiprocessing_distributed true
--dist_world_size N --ngpu 0``) and wait for them.

ESPnet's ``AbsTask.main`` spawns one worker per GPU and none on CPU. This launcher does
what ESPnet does for GPUs (``spawn`` start method; rendezvous on ``localhost`` at a free
port unless ``--dist_master_addr``, ``--dist_master_port`` (or ``MASTER_PORT``) or
``--dist_init_method`` say otherwise; rank ``i`` for worker ``i``; the task's
``main_worker`` as target) with ``torch.multiprocessing.start_processes``, which sends
each worker's traceback back to this process. When a worker fails or dies, the others
are stopped at once and this process raises
:class:`~espnet_multiblank.espnet.training.ddp.DistributedTrainingError` naming the
rank and the cause; SIGTERM or Ctrl-C here stops the workers too.

Each worker gets ``cpus // N`` torch threads (at least 1) unless ``OMP_NUM_THREADS``
is set, as torchrun does.
"""

import argparse
import os
import signal
import sys
from typing import List, Optional

from espnet_multiblank.espnet.training import ddp
from espnet_multiblank.espnet.training.ddp import DistributedTrainingError


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_threads(nprocs: int) -> Optional[int]:
    """torch threads per worker: ``None`` (keep) when ``OMP_NUM_THREADS`` is set,
    else the machine's CPUs shared among the ``nprocs`` workers."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, _available_cpus() // nprocs)


def _worker(rank: int, task_cls, args: argparse.Namespace, nprocs: int) -> None:
    """Target of worker ``rank`` (module level: pickled by reference; unpickling
    ``task_cls`` imports the task's module, which registers the plug-in)."""
    import torch

    threads = worker_threads(nprocs)
    if threads is not None:
        torch.set_num_threads(threads)
    local = argparse.Namespace(**vars(args))
    local.dist_rank = rank
    local.dist_world_size = nprocs
    task_cls.main_worker(local)
    # the worker's normal exit can abort in torch's teardown after DDP (see there)
    ddp.exit_finished_rank()


def _describe(error: Exception, nprocs: int) -> str:
    from torch.multiprocessing.spawn import ProcessExitedException

    rank = getattr(error, "error_index", "?")
    head = f"DDP worker rank {rank} of {nprocs} "
    if isinstance(error, ProcessExitedException):
        if getattr(error, "signal_name", None):
            cause = f"signal {error.signal_name}"
        else:
            cause = f"exit code {error.exit_code}"
        return (
            head + f"died ({cause}) without a Python error (killed, out of memory, "
            "or exited on its own); the other workers were stopped"
        )
    return (
        head
        + "failed; the other workers were stopped. Its error:\n"
        + str(error).strip()
    )


def _stop(processes: List) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()


def launch(task_cls, args: argparse.Namespace, nprocs: int) -> None:
    """Run ``task_cls.main_worker`` in ``nprocs`` spawned CPU workers (ranks 0..N-1)
    and wait for all of them; raise ``DistributedTrainingError`` if one fails."""
    import torch.multiprocessing as mp
    from espnet2.train.distributed_utils import free_port, get_master_port
    from torch.multiprocessing.spawn import ProcessException

    args = argparse.Namespace(**vars(args))
    args.distributed = True
    args.dist_world_size = nprocs
    if args.dist_init_method == "env://":
        # all workers are on this machine (ESPnet's GPU spawn path does the same)
        args.dist_master_addr = args.dist_master_addr or "localhost"
        args.dist_master_port = get_master_port(args.dist_master_port) or free_port()
    # ESPnet configures logging only inside the workers
    print(
        f"espnet_multiblank: starting {nprocs} CPU DDP workers ({args.dist_backend}, "
        f"{worker_threads(nprocs) or os.environ.get('OMP_NUM_THREADS')} torch "
        "threads each)",
        file=sys.stderr,
        flush=True,
    )

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
        installed = True
    except ValueError:  # not the main thread: leave signals alone
        installed = False
    context = None
    try:
        context = mp.start_processes(
            _worker,
            args=(task_cls, args, nprocs),
            nprocs=nprocs,
            join=False,
            start_method="spawn",
        )
        while not context.join():
            pass
    except ProcessException as error:
        raise DistributedTrainingError(_describe(error, nprocs)) from None
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous)
        if context is not None:
            _stop(context.processes)
