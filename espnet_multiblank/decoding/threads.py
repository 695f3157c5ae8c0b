"""Intra-op threads while a search runs."""

import contextlib
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def single_thread_on_cpu(device: Any) -> Iterator[None]:
    """Run the block with one intra-op thread when ``device`` is the CPU.

    A search step works on a handful of rows ((A, J) matrices, one RNN step): extra
    threads cannot split that work and only add synchronisation, which on a loaded
    machine costs more than the step itself (``bench/decode_steps.py`` measures it).
    The encoder, which does gain from threads, runs outside this block.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
