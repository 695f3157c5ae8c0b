"""Streaming decoding of the plug-in's transducers (``encoder: chunk_conformer``).

* :class:`StreamingDecoder`: many streams decoded together. Each stream is opened
  with a key, fed waveform pieces of any length (``feed({key: (piece, is_final)})``)
  and answers with its partial hypothesis after every piece and its n-best list when
  it ends. Per stream: the features and the chunk conformer's output, chunk by chunk
  (:mod:`~espnet_multiblank.espnet.inference.stream_encoder`); the search state
  carried from chunk to chunk (:mod:`espnet_multiblank.decoding.streaming`): the
  greedy searches (every lattice) run the one-utterance loop per stream (on a CPU,
  and for one stream) or the streams as the rows of one label-looping batch (several
  streams on a GPU), the beam searches one stream at a time. A piece with NaN or
  inf samples, several channels, or a stream at another sample rate than the
  model's ends that stream with the reason; the others go on.
* :class:`MultiblankSpeech2TextStreaming`: ESPnet's ``Speech2TextStreaming``
  interface for one stream: built from a trained model, a decode config and a chunk
  size; ``speech2text(piece, is_final=False)`` returns the partial hypothesis,
  ``is_final=True`` the n-best list (then it resets itself for the next utterance, as
  ESPnet's does; ``reset()`` starts over at any time).

The final hypothesis of a stream is the offline search's on the encoder output the
stream computed (the chunk-masked encoder output, chunk by chunk), whatever the
piece lengths (``docs/streaming.md``). Partial hypotheses are *provisional*: the
labels the offline search would give if the stream ended at the last encoder frame
received (``provisional=False``: only the labels already decided, which never
change).
"""

# before ESPnet's modules: their import prints nothing (quiet's docstring)
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  isort: skip
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
from espnet2.asr.transducer.beam_search_transducer import BeamSearchTransducer

from espnet_multiblank.decoding import (
    BeamSearch,
    Hypothesis,
    JointStepper,
    single_thread_on_cpu,
)
from espnet_multiblank.decoding.greedy import GreedySearch as FrameLooping
from espnet_multiblank.decoding.label_looping import (
    LabelLoopingGreedySearch,
    greedy_search_class,
)
from espnet_multiblank.decoding.streaming import (
    StreamingBeamSearch,
    StreamingGreedySearch,
    StreamingRowGreedySearch,
    decision_lookahead,
)
from espnet_multiblank.espnet.inference.inputs import (
    as_waveform,
    input_checks,
    rate_argument,
    too_short_reason,
)
from espnet_multiblank.espnet.inference.search import joint_size_of, lattice_from_model
from espnet_multiblank.espnet.inference.stream_encoder import (
    StreamEncoder,
    streaming_support,
)

logger = logging.getLogger(__name__)


def streaming_search(search: Any, model: Any, one_loop: bool = False):
    """The search a stream runs for the offline ``search`` of a ``Speech2Text``.

    A greedy search (the plug-in's, frame- or label-looping, or ESPnet's greedy
    search as the rule it follows: one label per frame, the arg-max symbol) streams
    as the label-looping search (the same hypotheses; with a window of one frame,
    which decides each frame as soon as it may: a window of W frames waits for W - 1
    more), or with ``one_loop`` as the frame-looping search, whose one-utterance loop
    is the faster one for a single stream; a beam search as it is.

    Raises:
        ValueError: ESPnet's own beam searches (use ``mb_beam``).
    """
    if isinstance(search, BeamSearch):
        return search
    greedy = (FrameLooping, LabelLoopingGreedySearch)
    espnet_greedy = isinstance(search, BeamSearchTransducer) and search.beam_size == 1
    if not (espnet_greedy or isinstance(search, greedy)):
        raise ValueError(
            f"streaming: {type(search).__name__} with beam "
            f"{getattr(search, 'beam_size', '?')} cannot "
            "stream; use transducer_conf search_type: mb_beam (standard and "
            "multi-blank models) or tdt_beam, or a greedy search"
        )
    if espnet_greedy:
        lattice = lattice_from_model(model)
        stepper = JointStepper(
            model.decoder, model.joint_network, joint_size_of(model, lattice)
        )
        kind = greedy_search_class(lattice, loop_labels=not one_loop)
        extra = {} if one_loop else dict(window=1)
        return kind(
            stepper, lattice, max_sym_per_frame=1, blank_decision="symbol", **extra
        )
    if isinstance(search, LabelLoopingGreedySearch if one_loop else FrameLooping):
        cls = greedy_search_class(search.lattice, loop_labels=not one_loop)
        extra = {} if one_loop else dict(window=1)
        return cls(
            search.stepper,
            search.lattice,
            max_sym_per_frame=search.max_sym_per_frame,
            blank_decision=search.blank_decision,
            fusion=search.fusion,
            end_rule=search.end_rule,
            **extra,
        )
    return search


class StreamResult(NamedTuple):
    """What :meth:`StreamingDecoder.feed` answers for one stream.

    Attributes:
        key: The stream.
        results: ESPnet's ``[(text, token, token_int, hyp)]``: the partial
            hypothesis (one entry) or, once the stream ended, the n-best list.
        is_final: The stream has ended (with ``results`` or an ``error``).
        error: Why the stream could not be decoded (it has ended), or None.
        emitted: For a final result: per label of the best hypothesis, the audio
            (seconds) received when it first appeared for good in the partial
            hypotheses; ``committed``: when it was decided.
        committed: See ``emitted``.
    """

    key: str
    results: List[Tuple]
    is_final: bool
    error: Optional[str] = None
    emitted: Optional[List[float]] = None
    committed: Optional[List[float]] = None


@dataclass
class _Stream:
    key: str
    slot: int
    encoder: StreamEncoder
    rate: Optional[int]
    beam: Optional[StreamingBeamSearch] = None
    samples: int = 0
    # (audio seconds received, partial labels, decided label count) when they changed
    history: List[Tuple[float, List[int], int]] = field(default_factory=list)
    # encoder frames arrived since the last partial hypothesis, and that hypothesis
    fresh: bool = False
    partial: Optional[Tuple[List[int], int, List[Tuple]]] = None


def _emission_times(history, final: List[int]) -> Tuple[List[float], List[float]]:
    """Per label of ``final``: the audio received (seconds) from which on every
    partial hypothesis held it (with the labels before it), and when it was decided.

    Args:
        history: ``(seconds, partial labels, decided labels)`` after each piece, the
            final hypothesis last.
        final: The final hypothesis's labels.
    """
    emitted = [math.inf] * len(final)
    committed = [math.inf] * len(final)
    stable = len(final)  # labels held by every partial from here to the end
    for seconds, labels, decided in reversed(history):
        same = 0
        while same < min(len(labels), len(final)) and labels[same] == final[same]:
            same += 1
        stable = min(stable, same)
        for i in range(stable):
            emitted[i] = seconds
        for i in range(min(decided, len(final))):
            committed[i] = seconds
    return emitted, committed


class StreamingDecoder:
    """Decode many streams together (module docstring).

    Args:
        speech2text: A plug-in ``Speech2Text`` (model, decode config, LMs).
        chunk_size: Encoder frames per chunk (the chunk conformer's chunk).
        num_left_chunks: Chunks to the left a chunk attends to (None: the
            model's; -1: all).
        max_streams: Streams decoded at once. A greedy search runs them with the
            one-utterance loop, each on its own (:class:`~espnet_multiblank.
            decoding.streaming.StreamingRowGreedySearch`), or as the rows of one
            label-looping batch (:class:`~espnet_multiblank.decoding.streaming.
            StreamingGreedySearch`), see ``one_loop``; both give the offline
            search's hypotheses.
        provisional: Partial hypotheses run the undecided frames to the end (True)
            or hold only the decided labels (False; cheaper).
        one_loop: A greedy search runs the one-utterance loop (True) or the
            label-looping batch (False); None: the one-utterance loop on a CPU and
            for one stream (faster there: bench/RESULTS.md), the batch for several
            streams on a GPU.
        record_frames: Keep each stream's projected encoder frames in
            :attr:`recorded` (to check a stream against the offline search).

    Attributes:
        search: The streaming search's underlying search.
        lookahead: Encoder frames past a frame the search waits for before it
            decides there (:func:`~espnet_multiblank.decoding.streaming.
            decision_lookahead`).
        stats: Counters: ``encoder_seconds`` (features, encoder, projection),
            ``search_seconds`` (the search's steps and its provisional runs; wall
            time), ``total_frames``, ``frames_skipped``, ``big_blank_emissions``.
    """

    def __init__(
        self,
        speech2text: Any,
        chunk_size: int,
        num_left_chunks: Optional[int] = None,
        max_streams: int = 1,
        provisional: bool = True,
        record_frames: bool = False,
        one_loop: Optional[bool] = None,
    ):
        model = speech2text.asr_model
        reason = streaming_support(model)
        if reason is not None:
            raise ValueError(reason)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
            raise TypeError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        if chunk_size < 1:
            raise ValueError(
                f"chunk_size must be >= 1 encoder frames, got {chunk_size}"
            )
        if isinstance(max_streams, bool) or not isinstance(max_streams, int):
            raise TypeError(f"max_streams must be an int >= 1, got {max_streams!r}")
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        model.eval()
        model.encoder.set_decoding_chunk(chunk_size, num_left_chunks)
        self.speech2text = speech2text
        self.model = model
        self.chunk_size = chunk_size
        self.device = torch.device(speech2text.device)
        if one_loop is None:  # rows of one label-looping batch pay off on a GPU
            one_loop = max_streams == 1 or self.device.type == "cpu"
        self.search = streaming_search(
            speech2text.beam_search_transducer, model, one_loop=bool(one_loop)
        )
        self.lookahead = decision_lookahead(self.search)
        self.beam = isinstance(self.search, BeamSearch)
        self.provisional = provisional
        checks = getattr(speech2text, "input_checks", None)
        self.checks = checks() if callable(checks) else input_checks(speech2text)
        self.input_dtype = getattr(speech2text, "input_dtype", torch.float32)
        self.greedy = None
        if not self.beam:
            kind = (
                StreamingRowGreedySearch
                if isinstance(self.search, FrameLooping)
                else StreamingGreedySearch
            )
            self.greedy = kind(self.search, max_streams, self.device)
        self.max_streams = max_streams
        self._free = list(range(max_streams))
        self.streams: Dict[str, _Stream] = {}
        #: key -> the (N, J) projected encoder frames of its last stream
        self.recorded: Optional[Dict[str, torch.Tensor]] = {} if record_frames else None
        self.stats = dict(
            encoder_seconds=0.0,
            search_seconds=0.0,
            total_frames=0,
            frames_skipped=0,
            big_blank_emissions=0,
        )

    # ------------------------------------------------------------- streams

    def open(self, key: str, sample_rate: Any = None, fs: Any = None) -> None:
        """Start a stream.

        Args:
            key: The stream's name.
            sample_rate, fs: Its waveform's sample rate (either name; None: not
                known), checked against the model's with its first piece.
        """
        sample_rate = rate_argument(sample_rate, fs)
        if key in self.streams:
            raise ValueError(f"stream {key!r} is already open")
        if not self._free:
            raise RuntimeError(
                f"all {self.max_streams} streams are open (max_streams); close or "
                "end one first"
            )
        slot = self._free.pop(0)
        encoder = StreamEncoder(
            self.model, self.chunk_size, self.input_dtype, self.device
        )
        stream = _Stream(key, slot, encoder, sample_rate)
        if self.recorded is not None:
            self.recorded.pop(key, None)
        if self.beam:
            stream.beam = StreamingBeamSearch(self.search, self.device)
        else:
            self.greedy.reset([slot])
        self.streams[key] = stream

    def close(self, key: str) -> None:
        """Drop a stream without a result."""
        stream = self.streams.pop(key)
        self._free.append(stream.slot)
        self._free.sort()

    @property
    def seconds_per_sample(self) -> Optional[float]:
        fs = self.checks.fs
        return 1.0 / fs if fs else None

    # ----------------------------------------------------------------- feed

    def feed(self, pieces: Mapping[str, Tuple[Any, bool]]) -> Dict[str, StreamResult]:
        """The next piece of some streams.

        Args:
            pieces: ``{key: (samples, is_final)}``; samples: (n,) or (n, 1) float
                waveform (numpy or torch, n >= 0) of an open stream.

        Returns:
            ``{key: StreamResult}`` for every stream fed; a stream whose result is
            final (n-best list or error) is closed.
        """
        out: Dict[str, StreamResult] = {}
        fed: Dict[str, bool] = {}
        for key, (piece, is_final) in pieces.items():
            if key not in self.streams:
                raise KeyError(f"no open stream {key!r} (open() it first)")
            stream = self.streams[key]
            error = self._feed_encoder(stream, piece, bool(is_final))
            if error is not None:
                self.close(key)
                out[key] = StreamResult(key, [], True, error)
            else:
                fed[key] = bool(is_final)
        with single_thread_on_cpu(self.device):
            start = time.perf_counter()
            # the search moves only for streams with new encoder frames or an end
            moved = {k: f for k, f in fed.items() if f or self.streams[k].fresh}
            if moved:
                self._advance(moved)
            provisional = None
            changed = [k for k, f in moved.items() if not f]
            if self.provisional and not self.beam and changed:
                rows = [self.streams[k].slot for k in changed]
                provisional = self.greedy.provisional(rows)
            self.stats["search_seconds"] += time.perf_counter() - start
            for key, final in fed.items():
                out[key] = self._result(self.streams[key], final, provisional)
        for key, final in fed.items():
            if final:
                self.close(key)
        return out

    def _check(
        self, stream: _Stream, piece: Any
    ) -> Tuple[Optional[torch.Tensor], Optional[str]]:
        try:
            piece, _ = as_waveform(piece, None, "piece")
        except (TypeError, ValueError) as e:
            return None, str(e)
        return self.checks.check_piece(piece, stream.rate)

    def _feed_encoder(self, stream: _Stream, piece: Any, final: bool) -> Optional[str]:
        """Features and encoder chunks of a piece, given to the search; the reason
        the stream cannot go on, or None."""
        piece, error = self._check(stream, piece)
        if error is not None:
            return error
        stream.samples += piece.numel()
        if final:
            need = self.checks.min_samples
            if stream.samples == 0:
                return "empty (no samples)"
            if need and stream.samples < need:
                return too_short_reason(stream.samples, need, self.checks.fs)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                chunks = stream.encoder.feed(piece, final)
                enc = [self.search.stepper.project_enc(c[0]) for c in chunks]
        except Exception as e:  # reported with the stream's key; the others go on
            logger.warning("stream %s: the encoder failed", stream.key, exc_info=True)
            return f"decoding failed: {type(e).__name__}: {e}"
        finally:
            self.stats["encoder_seconds"] += time.perf_counter() - start
        frames = torch.cat(enc) if enc else None
        stream.fresh = stream.fresh or frames is not None
        if self.recorded is not None and frames is not None:
            old = self.recorded.get(stream.key)
            self.recorded[stream.key] = (
                frames if old is None else torch.cat([old, frames])
            )
        if self.beam:
            if frames is not None:
                stream.beam.append(frames)
            if final:
                stream.beam.end()
        else:
            if frames is not None:
                self.greedy.append(stream.slot, frames)
            if final:
                self.greedy.end(stream.slot)
        return None

    def _advance(self, fed: Mapping[str, bool]) -> None:
        if self.beam:
            for key in fed:
                self.streams[key].beam.advance()
        else:
            self.greedy.advance()

    # -------------------------------------------------------------- results

    def _result(
        self, stream: _Stream, final: bool, provisional: Optional[List[List[int]]]
    ) -> StreamResult:
        s2t = self.speech2text
        seconds = stream.samples * (self.seconds_per_sample or 0.0)
        if final:
            nbest = self._final_hypotheses(stream)
            best = nbest[0]
            stream.history.append((seconds, best.labels, len(best.labels)))
            emitted, committed = _emission_times(stream.history, best.labels)
            self._count(stream, best)
            return StreamResult(
                stream.key, s2t.hyps_to_results(nbest), True, None, emitted, committed
            )
        if stream.fresh or stream.partial is None:  # else: nothing has changed
            labels, decided = self._partial(stream, provisional)
            hyp = Hypothesis(score=math.nan, yseq=[self.search.blank_id] + labels)
            stream.partial = labels, decided, s2t.hyps_to_results([hyp])
            stream.fresh = False
        labels, decided, results = stream.partial
        if not stream.history or stream.history[-1][1:] != (labels, decided):
            stream.history.append((seconds, labels, decided))
        return StreamResult(stream.key, results, False)

    def _final_hypotheses(self, stream: _Stream) -> List[Hypothesis]:
        if self.beam:
            return stream.beam.hypotheses()
        return [self.greedy.hypothesis(stream.slot)]

    def _partial(
        self, stream: _Stream, provisional: Optional[List[List[int]]]
    ) -> Tuple[List[int], int]:
        """(partial labels, how many of them are decided)."""
        if self.beam:
            start = time.perf_counter()
            labels = stream.beam.provisional() if self.provisional else []
            self.stats["search_seconds"] += time.perf_counter() - start
            return labels, 0
        decided = list(self.greedy.tokens[stream.slot])
        if provisional is None:
            return decided, len(decided)
        return list(provisional[stream.slot]), len(decided)

    def _count(self, stream: _Stream, hyp: Hypothesis) -> None:
        self.stats["total_frames"] += stream.encoder.frames
        self.stats["frames_skipped"] += int(hyp.frames_skipped)
        self.stats["big_blank_emissions"] += int(hyp.big_blank_emissions)


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
