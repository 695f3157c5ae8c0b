"""The runtime's user-facing API: :class:`Recognizer` and its :class:`Result`.

::

    from espnet_multiblank.runtime import Recognizer, read_wav

    rec = Recognizer("exported_model_dir")           # greedy search
    samples, rate = read_wav("utt.wav")
    result = rec.recognize(samples, rate)
    print(result.text, result.timestamps, result.frames_skipped)

    results = rec.recognize_batch([s1, s2, s3], sample_rate=8000)   # batched
    stream = rec.create_stream()                     # streaming models
    stream.accept_waveform(piece); print(stream.result.text)
    stream.input_finished(); print(stream.result.text)

Nothing here imports torch or ESPnet.
"""

import time
from typing import List, Optional, Sequence

import numpy as np

from espnet_multiblank.runtime.audio import check_samples
from espnet_multiblank.runtime.model import ExportedModel
from espnet_multiblank.runtime.result import DecodingStats, Result, make_result
from espnet_multiblank.runtime.stream import Stream, decode_streams
from espnet_multiblank.search_defaults import SEARCH_DEFAULTS

#: ``search`` values of :class:`Recognizer`
SEARCHES = ("greedy", "beam")


class Recognizer:
    """Decode an exported model's audio with ONNX Runtime and NumPy.

    Args:
        model_dir: The exported directory (or an
            :class:`~espnet_multiblank.runtime.model.ExportedModel`).
        search: ``"greedy"`` or ``"beam"`` (label-synchronous beam search, the
            rule the plug-in's recipe recommends; :mod:`.beam`).
        beam_size: Hypotheses kept per step (beam search).
        blank_decision: Greedy search's ``"total"`` or ``"symbol"`` (default: the
            plug-in's for the model's lattice).
        max_sym_per_frame: Labels that may stay at one frame (greedy: default the
            plug-in's; beam: at most that many times T labels, default 10).
        num_threads: ONNX Runtime's threads per graph.
        chunk_size: Encoder frames per attention chunk for offline decoding of a
            ``chunk_conformer`` (0: full context; the hypotheses of a stream at
            that chunk size), and the default chunk of :meth:`create_stream`.
        batch_size: Utterances encoded and searched together by
            :meth:`recognize_batch`.
    """

    def __init__(
        self,
        model_dir,
        search: str = "greedy",
        beam_size: int = 4,
        blank_decision: Optional[str] = None,
        max_sym_per_frame: Optional[int] = None,
        num_threads: int = 1,
        chunk_size: int = 0,
        batch_size: int = 16,
    ):
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {list(SEARCHES)}, got {search!r}")
        for name, value, low in (
            ("beam_size", beam_size, 1),
            ("chunk_size", chunk_size, 0),
            ("batch_size", batch_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(model_dir, ExportedModel):
            self.model = model_dir
        else:
            self.model = ExportedModel(model_dir, num_threads)
        if chunk_size and self.model.info.encoder_type != "chunk_conformer":
            raise ValueError(
                f"chunk_size = {chunk_size} needs a chunk_conformer model (this "
                f"model's encoder is {self.model.info.encoder_type})"
            )
        self.search_name = search
        self.stats = DecodingStats()
        self.chunk_size = chunk_size
        self.batch_size = batch_size
        if search == "greedy":
            from espnet_multiblank.runtime.greedy import GreedySearch

            self.search = GreedySearch(self.model, blank_decision, max_sym_per_frame)
        else:
            from espnet_multiblank.runtime.beam import LabelSyncBeamSearch

            if blank_decision is not None:
                raise ValueError(
                    "blank_decision is an option of greedy search (the beam search "
                    "sums every alignment of a hypothesis)"
                )
            table = SEARCH_DEFAULTS["mb_beam"]  # the label rule's guard: the table's
            self.search = LabelSyncBeamSearch(
                self.model,
                beam_size,
                max_sym_per_frame=max_sym_per_frame or table["max_sym_per_frame"],
            )

    @property
    def sample_rate(self) -> int:
        return self.model.info.sample_rate

    def check(self, samples, sample_rate: Optional[int] = None, name="samples"):
        """(L,) float32 samples, or a ValueError / TypeError saying what is wrong
        (:func:`~espnet_multiblank.runtime.audio.check_samples`)."""
        info = self.model.info
        return check_samples(
            samples, sample_rate, info.sample_rate, info.min_samples, name
        )

    def recognize(self, samples, sample_rate: Optional[int] = None) -> Result:
        """Decode one utterance: (L,) float samples in [-1, 1] at ``sample_rate``
        (None: the model's). Raises ValueError / TypeError on bad input."""
        x = self.check(samples, sample_rate)
        return self._decode([x], [None])[0]

    def recognize_batch(
        self,
        batch: Sequence,
        sample_rate: Optional[int] = None,
        keys: Optional[Sequence[str]] = None,
    ) -> List[Result]:
        """Decode several utterances, ``batch_size`` at a time (similar lengths
        together); the hypotheses are those of :meth:`recognize`.

        An utterance that cannot be decoded gets a :class:`Result` whose ``error``
        says why (named by its key, or its index); the others are decoded.
        """
        keys = [str(i) for i in range(len(batch))] if keys is None else list(keys)
        if len(keys) != len(batch):
            raise ValueError(f"keys has {len(keys)} names for {len(batch)} utterances")
        results: List[Optional[Result]] = [None] * len(batch)
        good = []
        for i, (samples, key) in enumerate(zip(batch, keys)):
            try:
                good.append((i, self.check(samples, sample_rate, f"utterance {key}")))
            except (ValueError, TypeError) as e:
                results[i] = Result(key=key, error=str(e))
        good.sort(key=lambda item: item[1].size)
        for start in range(0, len(good), self.batch_size):
            part = good[start : start + self.batch_size]
            decoded = self._decode([x for _, x in part], [keys[i] for i, _ in part])
            for (i, _), result in zip(part, decoded):
                results[i] = result
        return results

    def encode(self, waves: List[np.ndarray]):
        """(B, T, J) projected encoder frames and (B,) lengths of checked waves."""
        lengths = np.array([w.size for w in waves], np.int64)
        speech = np.zeros((len(waves), int(lengths.max())), np.float32)
        for b, w in enumerate(waves):
            speech[b, : w.size] = w
        return self.model.encode(speech, lengths, self.chunk_size)

    def _decode(self, waves: List[np.ndarray], keys) -> List[Result]:
        start = time.perf_counter()
        enc, lens = self.encode(waves)
        middle = time.perf_counter()
        hyps = self.search.search(enc, lens)
        results = [
            make_result(self.model, hyp, int(n), key)
            for hyp, n, key in zip(hyps, lens, keys)
        ]
        stats = self.stats
        stats.encode_seconds += middle - start
        stats.search_seconds += time.perf_counter() - middle
        stats.utterances += len(waves)
        stats.audio_seconds += sum(w.size for w in waves) / self.sample_rate
        stats.frames += int(lens.sum())
        stats.frames_skipped += sum(r.frames_skipped for r in results)
        return results

    def create_stream(
        self,
        chunk_size: Optional[int] = None,
        sample_rate: Optional[int] = None,
        partial_results: bool = True,
        key: Optional[str] = None,
    ) -> Stream:
        """A :class:`~espnet_multiblank.runtime.stream.Stream` (streaming models:
        ``chunk_conformer``) decoding at ``chunk_size`` encoder frames per chunk
        (default: the recognizer's, else the model's ``decoding_chunk_size``, else
        16)."""
        if chunk_size is None:
            chunk_size = self.chunk_size or (
                self.model.info.chunk.get("decoding_chunk_size") or 16
            )
        return Stream(self, chunk_size, sample_rate, partial_results, key)

    def decode_streams(self, streams) -> None:
        """Decode what the new pieces of ``streams`` complete, all together (one
        chunk-encoder call and one search round per step for all of them)."""
        decode_streams(self, list(streams))
