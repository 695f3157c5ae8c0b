"""The encoder output of a padded batch of utterances, for batched decoding: one
pass over the batch when the model is batch-exact
(:mod:`~espnet_multiblank.espnet.batch_exact.exact_encoding`), else each utterance
encoded alone and the outputs padded; either way each utterance's frames are those
it gets alone."""

from typing import Any, Tuple

import torch
from espnet2.torch_utils.device_funcs import to_device

from espnet_multiblank.espnet.compat import TooShortUttError


def encode_padded(
    model: Any,
    speech: torch.Tensor,
    speech_lengths: torch.Tensor,
    dtype: torch.dtype,
    device: Any,
    exact: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Encode a padded batch.

    Args:
        model: The ESPnet ASR model (its ``encode``).
        speech: (B, L) or (B, L, F) padded input (on any device).
        speech_lengths: (B,) int lengths.
        dtype: The dtype the model takes its input in.
        device: Where the model runs.
        exact: Whether the model encodes a padded batch exactly as one utterance at
            a time (then one pass; else one pass per utterance).

    Returns:
        ``(enc, enc_lens)``: (B, T_max, D) the encoder output, zero-padded, and
        (B,) int its frames per utterance, on ``device``.

    Raises:
        TooShortUttError: the encoder gave an utterance no frames.
    """
    if exact:
        batch = {"speech": speech.to(dtype), "speech_lengths": speech_lengths}
        enc, enc_lens = model.encode(**to_device(batch, device))
        if isinstance(enc, tuple):  # intermediate CTC outputs: not written here
            enc = enc[0]
        if bool((enc_lens <= 0).any()):
            b = int(torch.nonzero(enc_lens <= 0)[0])
            raise TooShortUttError(
                f"utterance {b} of the batch has no encoder frames",
                int(speech_lengths[b]),
                -1,
            )
        return enc, enc_lens
    encs = []
    for b in range(speech.size(0)):
        batch = {
            "speech": speech[b : b + 1, : int(speech_lengths[b])].to(dtype),
            "speech_lengths": speech_lengths[b : b + 1],
        }
        enc, _ = model.encode(**to_device(batch, device))
        if isinstance(enc, tuple):
            enc = enc[0]
        encs.append(enc[0])
    enc_lens = torch.tensor([e.size(0) for e in encs], device=encs[0].device)
    enc = torch.nn.utils.rnn.pad_sequence(encs, batch_first=True)
    return enc, enc_lens
