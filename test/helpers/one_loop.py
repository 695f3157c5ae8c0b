"""The greedy search's one-utterance loop on each row of a batch: the oracle of the
streams that run that loop row by row (``StreamingRowGreedySearch``), which must
give its hypotheses bit for bit (the batch loops, ``search_projected``, give them up
to float rounding)."""

from typing import List

import torch

from espnet_multiblank.decoding import GreedySearch, Hypothesis


@torch.no_grad()
def one_loop_projected(
    search: GreedySearch, enc_proj: torch.Tensor, lens: torch.Tensor
) -> List[Hypothesis]:
    """``search``'s one-utterance loop (``start_one``, ``run_one``, ``finish_one``)
    on each row of ``enc_proj`` ((B, T_max, J), projected by the search's stepper),
    row b over its first ``lens[b]`` frames ((B,) long)."""
    out = []
    for b, n in enumerate(lens.tolist()):
        run = search.start_one(enc_proj.device)
        search.run_one(run, enc_proj[b, :n], n)
        out.append(search.finish_one(run))
    return out
