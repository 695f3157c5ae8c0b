"""Chunk attention masks and the chunk sizes of dynamic chunk training.

A chunked encoder splits its T frames into chunks of ``chunk`` frames (the last one
may be shorter): frame i belongs to chunk ``i // chunk`` and attends to the frames of
its own chunk and of ``left_chunks`` chunks before it (all of them when
``left_chunks < 0``), never to a later chunk. So the output of a chunk depends only
on the input up to the chunk's end: it can be computed as soon as the chunk's input
has arrived (``docs/streaming.md``).

Dynamic chunk training (WeNet / U2, ESPnet's ``asr_transducer``): every training
batch draws its chunk size, full context (no chunk) with probability
``full_context_prob``, else uniformly from ``[chunk_min, chunk_max]``; one model then
decodes at full context and at any chunk size.
"""

from typing import Optional, Tuple

import torch


def chunk_mask(
    num_frames: int, chunk: int, left_chunks: int, device: torch.device
) -> torch.Tensor:
    """(T, T) bool: ``mask[i, j]`` is True when frame i may attend to frame j.

    Args:
        num_frames: T.
        chunk: Frames per chunk (>= 1).
        left_chunks: Chunks to the left a frame sees (< 0: all).
        device: Where the mask is made.
    """
    idx = torch.arange(num_frames, device=device) // chunk
    query, key = idx.unsqueeze(1), idx.unsqueeze(0)
    mask = key <= query
    if left_chunks >= 0:
        mask = mask & (key >= query - left_chunks)
    return mask


def draw_chunk(
    full_context_prob: float,
    chunk_range: Tuple[int, int],
    generator: Optional[torch.Generator] = None,
) -> int:
    """A training batch's chunk size: 0 (full context) with probability
    ``full_context_prob``, else uniform in ``chunk_range`` (inclusive).

    Drawn from torch's random generator, so ESPnet's ``--seed`` makes it
    reproducible.
    """
    if float(torch.rand((), generator=generator)) < full_context_prob:
        return 0
    lo, hi = chunk_range
    return int(torch.randint(lo, hi + 1, (), generator=generator))
