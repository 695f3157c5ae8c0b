"""Per-vocabulary tensors of a multi-blank lattice, and which symbols a search allows.

Built from :class:`espnet_multiblank.lattice.MultiblankLattice` (the owner of the
symbol rules): the standard blank covers 1 frame, big blank ``i`` (index
``blank - 1 - i``) covers ``d_i`` frames, every other symbol is a label (0 frames).
"""

from typing import List

import torch

from espnet_multiblank.lattice import MultiblankLattice


class SymbolTable:
    """Frames covered by each symbol, as tensors on one device, and the masks.

    Args:
        lattice: The lattice.
        vocab_size: V, the joint network's output size.
        device: Where the tensors live.

    Attributes:
        frames: (V,) long, frames covered by each symbol (0 for labels);
            ``frames_list`` is the same as a Python list.
        is_label: (V,) bool.
        big_ids: (N,) long, index of big blank i.
        durations: (N,) long, d_i.
        max_frames: The most frames one symbol covers.
    """

    def __init__(
        self, lattice: MultiblankLattice, vocab_size: int, device: torch.device
    ):
        lattice.check_vocab_size(vocab_size)
        self.lattice = lattice
        self.vocab_size = vocab_size
        self.frames = torch.zeros(vocab_size, dtype=torch.long, device=device)
        for symbol, n in lattice.blank_moves:
            self.frames[symbol] = n
        self.big_ids = torch.tensor(
            lattice.big_blank_ids, dtype=torch.long, device=device
        )
        self.durations = torch.tensor(
            lattice.big_blank_durations, dtype=torch.long, device=device
        )
        self.is_label = self.frames == 0
        self.frames_list: List[int] = self.frames.tolist()
        self.max_frames = lattice.max_frames

    def mask(
        self,
        logp: torch.Tensor,
        frame: torch.Tensor,
        length: torch.Tensor,
        num_sym: torch.Tensor,
        max_sym: int,
    ) -> torch.Tensor:
        """Set the log-probability of the symbols a search may not emit to -inf.

        Not allowed: labels once ``max_sym`` labels were emitted at this frame, and big
        blank ``i`` where ``frame + d_i > length`` (a path ends exactly on T, as in
        the loss). The standard blank is always allowed.

        Args:
            logp: (A, V) log-probabilities (not modified).
            frame: (A,) long, current frame t of each row.
            length: (A,) long, T of each row.
            num_sym: (A,) long, labels already emitted at ``frame``.
            max_sym: Labels allowed per frame.

        Returns:
            (A, V) masked copy.
        """
        neg = torch.tensor(float("-inf"), dtype=logp.dtype, device=logp.device)
        out = torch.where(
            (num_sym >= max_sym).unsqueeze(1) & self.is_label.unsqueeze(0), neg, logp
        )
        if self.big_ids.numel():
            over = (frame.unsqueeze(1) + self.durations.unsqueeze(0)) > (
                length.unsqueeze(1)
            )
            out[:, self.big_ids] = torch.where(over, neg, out[:, self.big_ids])
        return out
