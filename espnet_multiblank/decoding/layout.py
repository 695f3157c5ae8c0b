"""Blank layout of a (multi-blank) transducer model and the decoder blank fix.

The project's vocabulary convention (``docs/lattice.md``): the standard blank has
index ``blank_id`` and big blank ``i`` (duration ``durations[i]``) has index
``blank_id - 1 - i``. With ``<blank>`` first in the token list and durations
``[2, 4, 8]`` the vocabulary starts ``<blank8>, <blank4>, <blank2>, <blank>`` and
``blank_id = 3``.

ESPnet builds ``TransducerDecoder`` with ``embed_pad = 0`` and copies that into
``decoder.blank_id``; for a multi-blank model index 0 is ``<blank8>``, so every ESPnet
search that reads ``decoder.blank_id`` would start hypotheses with, and treat as blank,
the wrong symbol. :func:`fix_decoder_blank` makes the decoder agree with the model.
"""

import logging
from dataclasses import dataclass
from typing import Any, Sequence, Tuple

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlankLayout:
    """Where the blanks of a transducer vocabulary are.

    Attributes:
        blank_id: Index of the standard blank (advances one frame).
        durations: Big-blank durations ``(d_0, ..., d_{N-1})``; ``()`` for a standard
            transducer.
        vocab_size: Size V of the joint network output (all blanks included).
    """

    blank_id: int
    durations: Tuple[int, ...]
    vocab_size: int

    def __post_init__(self):
        if not 0 <= self.blank_id < self.vocab_size:
            raise ValueError(
                f"blank_id={self.blank_id} outside the vocabulary (V={self.vocab_size})"
            )
        if any(int(d) != d or d < 2 for d in self.durations):
            raise ValueError(
                f"big-blank durations must be integers >= 2: {self.durations}"
            )
        if len(set(self.durations)) != len(self.durations):
            raise ValueError(f"big-blank durations must be distinct: {self.durations}")
        if self.blank_id - len(self.durations) < 0:
            raise ValueError(
                f"{len(self.durations)} big blanks need indices "
                "blank_id-1..blank_id-N, "
                f"but blank_id={self.blank_id} (ESPnet would silently read index -1)"
            )

    @property
    def big_blank_ids(self) -> Tuple[int, ...]:
        """Index of big blank ``i``: ``blank_id - 1 - i``."""
        return tuple(self.blank_id - 1 - i for i in range(len(self.durations)))

    @property
    def is_multiblank(self) -> bool:
        return len(self.durations) > 0

    @property
    def blank_ids(self) -> Tuple[int, ...]:
        """All blank indices (big blanks and the standard blank), ascending."""
        return tuple(range(self.blank_id - len(self.durations), self.blank_id + 1))

    def advance(self, symbol: int) -> int:
        """Frames advanced by emitting ``symbol`` (0 for a label)."""
        if symbol == self.blank_id:
            return 1
        i = self.blank_id - 1 - symbol
        if 0 <= i < len(self.durations):
            return int(self.durations[i])
        return 0


def layout_from_model(model: Any) -> BlankLayout:
    """Read the blank layout from a transducer model.

    Understands the plug-in's ``multiblank_espnet`` model (``blank_id``,
    ``big_blank_durations``), ESPnet's own multi-blank ``ESPnetASRModel``
    (``transducer_multi_blank_durations``) and standard transducers (neither).

    Args:
        model: Object with ``blank_id`` and ``decoder`` (``decoder.odim`` = V).
    """
    durations: Sequence[int] = getattr(model, "big_blank_durations", None)
    if durations is None:
        durations = getattr(model, "transducer_multi_blank_durations", None) or ()
    vocab_size = int(getattr(model.decoder, "odim", 0)) or len(model.token_list)
    return BlankLayout(
        blank_id=int(model.blank_id),
        durations=tuple(int(d) for d in durations),
        vocab_size=vocab_size,
    )


def fix_decoder_blank(decoder: Any, layout: BlankLayout) -> None:
    """Make ``decoder.blank_id`` the standard blank of ``layout`` (in place).

    ESPnet's searches start every hypothesis with ``decoder.blank_id`` (training
    starts the prediction network with the model's ``blank_id``) and its greedy search
    treats it as the blank; ESPnet leaves it at ``embed_pad = 0``, which is
    ``<blank{d_max}>`` in a multi-blank model. The embedding's ``padding_idx`` is left
    alone.
    """
    if getattr(decoder, "blank_id", None) != layout.blank_id:
        logger.info(
            "decoder.blank_id %s -> %d (the model's standard blank)",
            getattr(decoder, "blank_id", None),
            layout.blank_id,
        )
        decoder.blank_id = layout.blank_id
