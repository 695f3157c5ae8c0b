"""``--streaming true``: the decoding loop of both entry points, streaming.

For a transducer model with ``encoder: chunk_conformer``,
:func:`~espnet_multiblank.espnet.inference.loop.inference` decodes the data set
through the streaming decoder (:class:`~espnet_multiblank.espnet.inference.
stream_decoder.StreamingDecoder`) instead of warning that ``--streaming`` does not
apply: every utterance is fed in pieces of
``--sim_chunk_length`` samples (0: one piece), as ESPnet's
``asr_inference_streaming`` simulates a stream, with the encoder's chunk
``--streaming_chunk_size``. ``--batch_size N`` decodes N streams at once: each round
gives every open stream its next piece, and an ended stream's row takes the next
utterance (streams start and end at different times, as on a server). The outputs
are the offline loop's (``1best_recog/{text,token,token_int,score}``, written in
input order; ``failed_utterances``; ``decoding_stats.json`` with the streaming
settings and the encoder / search times), plus ``1best_recog/emission`` and
``1best_recog/decided``: per label of the hypothesis, the audio (seconds) received
when it appeared for good in the partial hypotheses, and when it was decided.
"""

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from espnet_multiblank.espnet.inference.decoding_stats import RunTally
from espnet_multiblank.espnet.inference.inputs import Utterance
from espnet_multiblank.espnet.inference.outputs import result_problem, write_results
from espnet_multiblank.espnet.inference.stream_decoder import StreamingDecoder
from espnet_multiblank.espnet.inference.stream_encoder import frontend_framing

#: the chunk size when neither the command line nor the model gives one (640 ms at
#: 40 ms per encoder frame)
DEFAULT_CHUNK = 16


def chunk_size_of(model: Any, requested: int) -> int:
    """``--streaming_chunk_size``, else the model's decoding chunk, else 16."""
    if requested < 0:
        raise ValueError(f"--streaming_chunk_size must be >= 0, got {requested}")
    if requested:
        return requested
    return int(getattr(model.encoder, "decoding_chunk_size", 0)) or DEFAULT_CHUNK


class StreamingRun(RunTally):
    """Decodes utterances as streams and keeps what failed (the streaming
    counterpart of :class:`~espnet_multiblank.espnet.inference.loop.DecodingRun`;
    the counts: :class:`~espnet_multiblank.espnet.inference.decoding_stats.RunTally`).

    Args:
        speech2text: The built ``Speech2Text``.
        batch_size: Streams decoded at once.
        sim_chunk_length: Samples per piece (0: the whole utterance).
        chunk_size: ``--streaming_chunk_size`` (0: :func:`chunk_size_of`).
        left_chunks: ``--streaming_left_chunks``.
        partial: ``"provisional"`` or ``"decided"``.
    """

    def __init__(
        self,
        speech2text: Any,
        batch_size: int,
        sim_chunk_length: int = 0,
        chunk_size: int = 0,
        left_chunks: Optional[int] = None,
        partial: str = "provisional",
    ):
        if sim_chunk_length < 0:
            raise ValueError(
                f"--sim_chunk_length must be >= 0 samples, got {sim_chunk_length}"
            )
        super().__init__()
        self.speech2text = speech2text
        self.sim_chunk_length = sim_chunk_length
        chunk = chunk_size_of(speech2text.asr_model, chunk_size)
        self.decoder = StreamingDecoder(
            speech2text,
            chunk,
            left_chunks,
            max_streams=max(1, batch_size),
            provisional=partial == "provisional",
        )
        self._speech: Dict[str, Tuple[Any, int]] = {}  # key -> (speech, next sample)
        self._rates: Dict[str, int] = {}

    def decode(self, utterances: Iterator[Utterance]) -> Iterator[Tuple[str, Any]]:
        """``(key, StreamResult)`` of every utterance that decoded, in input
        order."""
        order: List[str] = []
        done: Dict[str, Any] = {}
        pending = iter(utterances)
        exhausted = False
        while True:
            while (
                not exhausted and len(self.decoder.streams) < self.decoder.max_streams
            ):
                utt = next(pending, None)
                if utt is None:
                    exhausted = True
                    break
                self.num_utterances += 1
                order.append(utt.key)
                self._open(utt)
            if not self.decoder.streams:
                break
            for key, result in self.decoder.feed(self._round()).items():
                if not result.is_final:
                    continue
                speech = self._speech.pop(key)[0]
                problem = result.error or result_problem(result.results)
                if problem is not None:
                    self.fail(key, problem)
                else:
                    self.audio_seconds += speech.shape[0] / float(self._rate(key))
                    done[key] = result
            while order and (order[0] in done or order[0] in self.failed):
                key = order.pop(0)
                if key in done:
                    yield key, done.pop(key)
        for key in order:
            if key in done:
                yield key, done.pop(key)

    def _rate(self, key: str) -> int:
        return self._rates.get(key) or self.decoder.checks.fs or 16000

    def _open(self, utt: Utterance) -> None:
        if utt.error is not None:
            self.fail(utt.key, utt.error)
            return
        if utt.rate is None:
            self.fail(utt.key, "streaming decodes waveforms (type sound) only")
            return
        self._rates[utt.key] = utt.rate
        self.decoder.open(utt.key, utt.rate)
        self._speech[utt.key] = (utt.speech, 0)

    def _round(self) -> Dict[str, Tuple[Any, bool]]:
        """The next piece of every open stream."""
        pieces = {}
        for key in self.decoder.streams:
            speech, first = self._speech[key]
            size = self.sim_chunk_length or speech.shape[0]
            stop = first + size
            pieces[key] = (speech[first:stop], stop >= speech.shape[0])
            self._speech[key] = (speech, stop)
        return pieces

    def stats(self, decode_seconds: float, device: str, entry_point) -> Dict[str, Any]:
        """``decoding_stats.json``."""
        decoder = self.decoder
        encoder = decoder.model.encoder
        frame_seconds = self._frame_seconds()
        stats = {
            **self.totals(decode_seconds),
            **decoder.stats,
            "frames_skipped_by_big_blanks": decoder.stats["frames_skipped"],
            "search": type(decoder.search).__name__,
            "batch_size": decoder.max_streams,
            "dtype": self.speech2text.dtype,
            "device": device,
            "torch_num_threads": torch.get_num_threads(),
            "streaming": True,
            "sim_chunk_length": self.sim_chunk_length,
            "chunk_frames": decoder.chunk_size,
            "num_left_chunks": encoder.num_left_chunks,
            "lookahead_frames": decoder.lookahead,
            "frame_seconds": frame_seconds,
            "chunk_seconds": (
                None if frame_seconds is None else decoder.chunk_size * frame_seconds
            ),
            "encoder_lookahead_seconds": self._encoder_lookahead(),
        }
        if entry_point is not None:
            stats["entry_point"] = entry_point
        return stats

    def _frame_seconds(self) -> Optional[float]:
        """Seconds per encoder frame (frame shift x subsampling)."""
        fs = self.decoder.checks.fs
        if not fs:
            return None
        framing = frontend_framing(self.decoder.model)
        return framing.shift * self.decoder.model.encoder.subsampling / fs

    def _encoder_lookahead(self) -> Optional[float]:
        """Seconds of audio past a chunk's end that its last frame reads: the
        subsampling's look-ahead and the part of a feature frame after its start
        time (half an STFT window)."""
        fs = self.decoder.checks.fs
        if not fs:
            return None
        framing = frontend_framing(self.decoder.model)
        encoder = self.decoder.model.encoder
        frames = encoder.receptive_field - encoder.subsampling
        return (frames * framing.shift + framing.length - framing.offset) / fs


def write_stream_result(writer: Any, key: str, result: Any, nbest: int) -> None:
    """The offline loop's n-best lines, and the emission times of the 1-best."""
    write_results(writer, key, result.results, nbest)
    best = writer["1best_recog"]
    best["emission"][key] = " ".join(f"{t:.3f}" for t in result.emitted)
    best["decided"][key] = " ".join(f"{t:.3f}" for t in result.committed)
