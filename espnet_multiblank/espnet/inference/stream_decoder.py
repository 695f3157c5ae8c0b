"""Many streams decoded together (``encoder: chunk_conformer``):
:class:`StreamingDecoder`, the driver from waveform pieces to results.

Each stream is opened with a key, fed waveform pieces of any length
(``feed({key: (piece, is_final)})``) and answers with its partial hypothesis after
every piece and its n-best list when it ends. Per stream (a
:class:`~espnet_multiblank.espnet.inference.stream_state.StreamState`): the features
and the chunk conformer's output, chunk by chunk
(:mod:`~espnet_multiblank.espnet.inference.stream_encoder`); the search state,
carried from chunk to chunk in one row of the streaming search
(:class:`~espnet_multiblank.decoding.streaming.StreamingSearch`, one interface for
every search): the greedy searches (every lattice) run the one-utterance loop per
stream (on a CPU, and for one stream) or the streams as the rows of one
label-looping batch (several streams on a GPU), the beam searches one stream per row.
A piece with NaN or inf samples, several channels, or a stream at another sample
rate than the model's ends that stream with the reason; the others go on.

:func:`streaming_search` chooses the search that streams for a ``Speech2Text``'s.
The final hypothesis of a stream is the offline search's on the encoder output the
stream computed (``docs/streaming.md``).
"""

# before ESPnet's modules: their import prints nothing (quiet's docstring)
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  isort: skip
import logging
import math
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from espnet2.asr.transducer.beam_search_transducer import BeamSearchTransducer

from espnet_multiblank.decoding import Hypothesis, JointStepper, single_thread_on_cpu
from espnet_multiblank.decoding.label_looping import greedy_search_class
from espnet_multiblank.decoding.streaming import (
    decision_lookahead,
    streamable,
    streaming_class,
    streaming_rows,
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
from espnet_multiblank.espnet.inference.stream_state import StreamResult, StreamState

logger = logging.getLogger(__name__)


def streaming_search(search: Any, model: Any, one_loop: bool = False):
    """The search a stream runs for the offline ``search`` of a ``Speech2Text``.

    ESPnet's greedy search streams as the plug-in's greedy search of its rule (one
    label per frame, the arg-max symbol); the plug-in's searches as
    :func:`~espnet_multiblank.decoding.streaming.streamable` gives them (a greedy
    search as the label-looping search, or with ``one_loop`` as the frame-looping
    one, whose one-utterance loop is the faster for a single stream; a beam search
    as it is).

    Raises:
        ValueError: a search that does not stream (ESPnet's own beam searches: use
            ``mb_beam``).
    """
    if isinstance(search, BeamSearchTransducer) and search.beam_size == 1:
        lattice = lattice_from_model(model)
        stepper = JointStepper(
            model.decoder, model.joint_network, joint_size_of(model, lattice)
        )
        kind = greedy_search_class(lattice, loop_labels=False)
        search = kind(stepper, lattice, max_sym_per_frame=1, blank_decision="symbol")
    streamed = streamable(search, one_loop)
    if streaming_class(streamed) is None:
        raise ValueError(
            f"streaming: {type(search).__name__} with beam "
            f"{getattr(search, 'beam_size', '?')} cannot "
            "stream; use transducer_conf search_type: mb_beam (standard and "
            "multi-blank models) or tdt_beam, or a greedy search"
        )
    return streamed


class StreamingDecoder:
    """Decode many streams together (module docstring).

    Args:
        speech2text: A plug-in ``Speech2Text`` (model, decode config, LMs).
        chunk_size: Encoder frames per chunk (the chunk conformer's chunk).
        num_left_chunks: Chunks to the left a chunk attends to (None: the
            model's; -1: all).
        max_streams: Streams decoded at once: the rows of the streaming search. A
            greedy search runs them with the one-utterance loop, each on its own
            (:class:`~espnet_multiblank.decoding.streaming.
            StreamingRowGreedySearch`), or as the rows of one label-looping batch
            (:class:`~espnet_multiblank.decoding.streaming.StreamingGreedySearch`),
            see ``one_loop``; both give the offline search's hypotheses.
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
        rows: The streaming search (:class:`~espnet_multiblank.decoding.
            streaming.StreamingSearch`), one row per open stream.
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
        self.provisional = provisional
        checks = getattr(speech2text, "input_checks", None)
        self.checks = checks() if callable(checks) else input_checks(speech2text)
        self.input_dtype = getattr(speech2text, "input_dtype", torch.float32)
        self.rows = streaming_rows(self.search, max_streams, self.device)
        self.max_streams = max_streams
        self._free = list(range(max_streams))
        self.streams: Dict[str, StreamState] = {}
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
        stream = StreamState(key, slot, encoder, sample_rate)
        if self.recorded is not None:
            self.recorded.pop(key, None)
        self.rows.reset([slot])
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
                self.rows.advance()
            provisional = None
            changed = [k for k, f in moved.items() if not f]
            if self.provisional and changed:
                rows = [self.streams[k].slot for k in changed]
                provisional = self.rows.provisional(rows)
            self.stats["search_seconds"] += time.perf_counter() - start
            for key, final in fed.items():
                out[key] = self._result(self.streams[key], final, provisional)
        for key, final in fed.items():
            if final:
                self.close(key)
        return out

    def _check(
        self, stream: StreamState, piece: Any
    ) -> Tuple[Optional[torch.Tensor], Optional[str]]:
        try:
            piece, _ = as_waveform(piece, None, "piece")
        except (TypeError, ValueError) as e:
            return None, str(e)
        return self.checks.check_piece(piece, stream.rate)

    def _feed_encoder(
        self, stream: StreamState, piece: Any, final: bool
    ) -> Optional[str]:
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
        if frames is not None:
            self.rows.append(stream.slot, frames)
        if final:
            self.rows.end(stream.slot)
        return None

    # -------------------------------------------------------------- results

    def _result(
        self,
        stream: StreamState,
        final: bool,
        provisional: Optional[List[List[int]]],
    ) -> StreamResult:
        """The stream's result after a piece (``provisional``: the search's
        provisional labels of every row, or None where not asked)."""
        s2t = self.speech2text
        seconds = stream.samples * (self.seconds_per_sample or 0.0)
        if final:
            nbest = self.rows.hypotheses(stream.slot)
            best = nbest[0]
            emitted, committed = stream.emission_times(seconds, best.labels)
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
        stream.record(seconds, labels, decided)
        return StreamResult(stream.key, results, False)

    def _partial(
        self, stream: StreamState, provisional: Optional[List[List[int]]]
    ) -> Tuple[List[int], int]:
        """(partial labels, how many of them are decided)."""
        decided = list(self.rows.tokens[stream.slot])
        if provisional is None:
            return decided, len(decided)
        return list(provisional[stream.slot]), len(decided)

    def _count(self, stream: StreamState, hyp: Hypothesis) -> None:
        self.stats["total_frames"] += stream.encoder.frames
        self.stats["frames_skipped"] += int(hyp.frames_skipped)
        self.stats["big_blank_emissions"] += int(hyp.big_blank_emissions)
