"""ESPnet ``Speech2Text`` whose transducer search knows the model's (big) blanks.

:class:`MultiblankSpeech2Text` builds everything through ESPnet's ``Speech2Text``
(model from ``config.yaml`` + ``model.pth``, LM, tokenizer, converter) and then replaces
``beam_search_transducer`` by :func:`build_transducer_search`, which reads the blank
layout from the model and fixes ``decoder.blank_id``. It also keeps decoding statistics
(encoder frames, big-blank emissions, frames skipped) and adds :meth:`decode_batch`,
batched greedy decoding of several utterances. On CPU the transducer search (not the
encoder) runs with one intra-op thread, see
:func:`~espnet_multiblank.decoding.common.single_thread_on_cpu`.
"""

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from espnet2.bin.asr_inference import Speech2Text
from espnet2.torch_utils.device_funcs import to_device
from typeguard import typechecked

from espnet_multiblank.decoding.common import single_thread_on_cpu
from espnet_multiblank.decoding.layout import layout_from_model
from espnet_multiblank.decoding.search import build_transducer_search

logger = logging.getLogger(__name__)


class DecodingStats:
    """Counters for ``decoding_stats.json`` (1-best hypotheses only)."""

    def __init__(self):
        self.num_utterances = 0
        self.total_frames = 0
        self.big_blank_emissions = 0
        self.frames_skipped_by_big_blanks = 0
        # wall time inside the transducer search alone (no encoder, no I/O): the part
        # that big blanks shorten
        self.search_seconds = 0.0

    def add(self, frames: int, hyp: Any) -> None:
        self.num_utterances += 1
        self.total_frames += int(frames)
        self.big_blank_emissions += int(getattr(hyp, "big_blank_emissions", 0))
        self.frames_skipped_by_big_blanks += int(getattr(hyp, "frames_skipped", 0))


class MultiblankSpeech2Text(Speech2Text):
    """``Speech2Text`` with the multi-blank transducer searches.

    Accepts every argument of ESPnet's ``Speech2Text``. ``transducer_conf`` takes
    ``search_type`` (``mb_greedy``, ``mb_beam``, or ESPnet's ``greedy``, ``default``,
    ``tsd``, ``alsd``, ``nsc``, ``maes``, ``mbg``), ``max_sym_per_frame`` and
    ``score_norm`` (multi-blank searches) or ESPnet's search keys, and optionally
    ``beam_size`` (overrides the ``beam_size`` argument). Non-transducer models are
    decoded exactly as by ESPnet.
    """

    @typechecked
    def __init__(
        self,
        asr_train_config: Any = None,
        asr_model_file: Any = None,
        transducer_conf: Optional[Dict] = None,
        beam_size: int = 20,
        nbest: int = 1,
        **kwargs: Any,
    ):
        conf = dict(transducer_conf or {})
        beam_size = int(conf.pop("beam_size", beam_size))
        search_type = conf.pop("search_type", "default")
        # ESPnet builds its own BeamSearchTransducer from transducer_conf and would
        # reject our search types: give it a neutral one, then replace the object.
        super().__init__(
            asr_train_config=asr_train_config,
            asr_model_file=asr_model_file,
            transducer_conf={"search_type": "default"},
            beam_size=beam_size,
            nbest=nbest,
            **kwargs,
        )
        self.stats = DecodingStats()
        if self.beam_search_transducer is None:
            return
        espnet_search = self.beam_search_transducer
        self.beam_search_transducer = build_transducer_search(
            self.asr_model,
            beam_size=beam_size,
            search_type=search_type,
            nbest=nbest,
            lm=espnet_search.lm,
            lm_weight=espnet_search.lm_weight,
            token_list=list(self.asr_model.token_list),
            **conf,
        )
        self.blank_layout = layout_from_model(self.asr_model)
        logger.info(
            "transducer search: %s (blank_id=%d, big blanks %s at %s)",
            type(self.beam_search_transducer).__name__,
            self.blank_layout.blank_id,
            list(self.blank_layout.durations),
            list(self.blank_layout.big_blank_ids),
        )

    @property
    def supports_batch(self) -> bool:
        """True when the search can decode several utterances at once."""
        return hasattr(self.beam_search_transducer, "search_batch")

    def _decode_single_sample(self, enc: torch.Tensor):
        if self.beam_search_transducer is None:
            return super()._decode_single_sample(enc)
        start = time.perf_counter()
        with single_thread_on_cpu(enc.device):
            results = super()._decode_single_sample(enc)
        self.stats.search_seconds += time.perf_counter() - start
        if results:
            self.stats.add(enc.shape[0], results[0][3])
        return results

    def hyps_to_results(self, nbest_hyps: List[Any]) -> List[Tuple]:
        """Hypotheses -> ESPnet's ``[(text, token, token_int, hyp), ...]``.

        ``yseq[0]`` is the start symbol; the searches never put blanks in ``yseq``.
        """
        results = []
        for hyp in nbest_hyps[: self.nbest]:
            token_int = [int(x) for x in hyp.yseq[1:]]
            token = self.converter.ids2tokens(token_int)
            text = self.tokenizer.tokens2text(token) if self.tokenizer else None
            results.append((text, token, token_int, hyp))
        return results

    @torch.no_grad()
    def decode_batch(
        self, speech: torch.Tensor, speech_lengths: torch.Tensor
    ) -> List[List[Tuple]]:
        """Batched greedy search over utterances encoded one at a time.

        The encoder sees each utterance alone, exactly as with ``batch_size: 1``:
        ESPnet's encoders are not padding-invariant (the conformer's convolution module
        does not mask padded frames, and conv2d subsampling can report one extra frame
        for a padded input). Measured on the digits recipe's conformer: encoder outputs
        of a padded utterance differed from its unpadded ones by up to 4.6 in its last
        frames, and a multi-blank model decoded in batches of 16 (batched encoder) gave
        313% WER instead of 9.2%. Only the search, whose rows are independent, is
        batched, so the hypotheses do not depend on the batch size.

        Args:
            speech: (B, L) or (B, L, F) padded input.
            speech_lengths: (B,) lengths.

        Returns:
            For each utterance, ESPnet's n-best list
            ``[(text, token, token_int, hyp)]``.
        """
        if not self.supports_batch:
            raise NotImplementedError(
                f"{type(self.beam_search_transducer).__name__} decodes one utterance "
                "at a time"
            )
        encs = []
        for b in range(speech.size(0)):
            batch = {
                "speech": speech[b : b + 1, : int(speech_lengths[b])].to(
                    getattr(torch, self.dtype)
                ),
                "speech_lengths": speech_lengths[b : b + 1],
            }
            batch = to_device(batch, device=self.device)
            enc, _ = self.asr_model.encode(**batch)
            if isinstance(enc, tuple):  # intermediate CTC outputs: not written here
                enc = enc[0]
            encs.append(enc[0])
        enc_lens = torch.tensor([e.size(0) for e in encs], device=encs[0].device)
        enc = torch.nn.utils.rnn.pad_sequence(encs, batch_first=True)
        start = time.perf_counter()
        with single_thread_on_cpu(enc.device):
            hyps = self.beam_search_transducer.search_batch(enc, enc_lens)
        self.stats.search_seconds += time.perf_counter() - start
        out = []
        for hyp, frames in zip(hyps, enc_lens.tolist()):
            self.stats.add(frames, hyp)
            out.append(self.hyps_to_results([hyp]))
        return out
