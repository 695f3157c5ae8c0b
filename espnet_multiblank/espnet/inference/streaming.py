"""Streaming decoding of the plug-in's transducers (``encoder: chunk_conformer``):
the Python API.

* :class:`MultiblankSpeech2TextStreaming`: ESPnet's ``Speech2TextStreaming``
  interface for one stream: built from a trained model, a decode config and a chunk
  size; ``speech2text(piece, is_final=False)`` returns the partial hypothesis,
  ``is_final=True`` the n-best list (then it resets itself for the next utterance, as
  ESPnet's does; ``reset()`` starts over at any time).
* :class:`StreamingDecoder` (:mod:`~espnet_multiblank.espnet.inference.
  stream_decoder`): many streams decoded together, fed waveform pieces of any length;
  each answers a :class:`StreamResult` (:mod:`~espnet_multiblank.espnet.inference.
  stream_state`) per piece. :func:`streaming_search`: the search that streams for a
  ``Speech2Text``'s.

The final hypothesis of a stream is the offline search's on the encoder output the
stream computed (the chunk-masked encoder output, chunk by chunk), whatever the
piece lengths (``docs/streaming.md``). Partial hypotheses are *provisional*: the
labels the offline search would give if the stream ended at the last encoder frame
received (``provisional=False``: only the labels already decided, which never
change).
"""

# before ESPnet's modules: their import prints nothing (quiet's docstring)
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  isort: skip
from typing import Any, List, Optional, Tuple

from espnet_multiblank.espnet.inference.inputs import as_waveform, rate_argument
from espnet_multiblank.espnet.inference.stream_decoder import (
    StreamingDecoder,
    streaming_search,
)
from espnet_multiblank.espnet.inference.stream_state import StreamResult

__all__ = [
    "MultiblankSpeech2TextStreaming",
    "StreamResult",
    "StreamingDecoder",
    "streaming_search",
]


class MultiblankSpeech2TextStreaming:
    """ESPnet's ``Speech2TextStreaming`` interface for one stream (module
    docstring).

    Args:
        chunk_size: Encoder frames per chunk (e.g. 16 = 640 ms at 40 ms a frame).
        num_left_chunks: Chunks to the left a chunk attends to (None: the
            model's).
        provisional: See :class:`StreamingDecoder`.
        sample_rate, fs: The waveform's sample rate (either name), checked against
            the model's with every piece (None: not known, not checked; a piece
            given as a ``(samples, rate)`` pair also says it).
        speech2text: A plug-in ``Speech2Text`` already built (instead of
            ``**kwargs``).
        **kwargs: The arguments of the plug-in's ``Speech2Text``
            (``asr_train_config``, ``asr_model_file``, ``transducer_conf``
            (default: greedy search), ``beam_size``, ``nbest``, ``lm_train_config``,
            ``lm_file``, ``lm_weight``, ``ngram_file``, ``device``, ``dtype``, ...).

    Example::

        s2t = MultiblankSpeech2TextStreaming(
            asr_train_config="exp/asr/config.yaml",
            asr_model_file="exp/asr/valid.loss.ave.pth",
            transducer_conf={"search_type": "mb_greedy"}, chunk_size=8,
            sample_rate=8000)
        for piece in pieces[:-1]:
            text = s2t(piece, is_final=False)[0][0]   # partial hypothesis
        nbest = s2t(pieces[-1], is_final=True)       # [(text, token, token_int, hyp)]
    """

    KEY = "stream"

    def __init__(
        self,
        chunk_size: int = 16,
        num_left_chunks: Optional[int] = None,
        provisional: bool = True,
        sample_rate: Any = None,
        speech2text: Any = None,
        fs: Any = None,
        **kwargs: Any,
    ):
        sample_rate = rate_argument(sample_rate, fs)
        if speech2text is None:
            from espnet_multiblank.espnet.inference.speech2text import (
                MultiblankSpeech2Text,
            )

            # greedy by default (ESPnet's default search, a beam, cannot stream)
            if kwargs.get("transducer_conf") is None:
                kwargs["transducer_conf"] = {"search_type": "mb_greedy"}
            speech2text = MultiblankSpeech2Text(**kwargs)
        elif kwargs:
            raise TypeError(
                f"give either speech2text or its arguments, not both: {sorted(kwargs)}"
            )
        self.speech2text = speech2text
        self.sample_rate = sample_rate
        self.decoder = StreamingDecoder(
            speech2text, chunk_size, num_left_chunks, 1, provisional
        )
        self.reset()

    @property
    def asr_model(self):
        return self.speech2text.asr_model

    def reset(self) -> None:
        """Start a new utterance (what was fed is dropped)."""
        if self.KEY in self.decoder.streams:
            self.decoder.close(self.KEY)
        self.decoder.open(self.KEY, self.sample_rate)
        self.last: Optional[StreamResult] = None

    def __call__(
        self,
        speech: Any,
        is_final: bool = True,
        sample_rate: Any = None,
        fs: Any = None,
    ) -> List[Tuple]:
        """Feed the next piece (any length).

        Args:
            speech: (n,) or (n, 1) samples (numpy, torch), or a ``(samples, rate)``
                pair.
            is_final: The stream ends with this piece.
            sample_rate, fs: The piece's sample rate (either name; default: the
                constructor's), checked against the model's.

        Returns:
            ESPnet's ``[(text, token, token_int, hyp)]``: the partial hypothesis,
            or with ``is_final`` the n-best list (the stream then starts over).

        Raises:
            ValueError: the piece cannot be decoded (NaN or inf samples, several
                channels, another sample rate, too short in all): the stream starts
                over.
        """
        try:
            speech, rate = as_waveform(speech, rate_argument(sample_rate, fs))
        except (TypeError, ValueError):
            self.reset()
            raise
        stream = self.decoder.streams[self.KEY]
        if rate is not None and stream.rate is None:
            stream.rate = rate  # checked with this piece
        elif rate is not None and rate != stream.rate:
            self.reset()
            raise ValueError(
                f"speech: a piece at {rate} Hz in a stream at {stream.rate} Hz"
            )
        result = self.decoder.feed({self.KEY: (speech, is_final)})[self.KEY]
        self.last = result
        if result.is_final:
            self.decoder.open(self.KEY, self.sample_rate)
        if result.error is not None:
            raise ValueError(f"speech: {result.error}")
        return result.results
