"""The plug-in's decoding loop (``python -m espnet_multiblank.bin.asr_inference``, and
ESPnet's stock ``espnet2.bin.asr_inference`` on the plug-in's models once the
start-up hook has wrapped it).

:func:`inference` takes the arguments of ``espnet2.bin.asr_inference.inference`` and
writes ESPnet's output layout (``<output_dir>/1best_recog/{text,token,token_int,
score}``, ``Nbest_recog`` for ``--nbest N``) and ``<output_dir>/decoding_stats.json``.
Every utterance either decodes or is reported, by its key and the reason, in the log
and in ``<output_dir>/failed_utterances`` (``key reason`` lines; nothing is written
for it in ``*best_recog``), and the run goes on with the others (:mod:`.inputs`:
unreadable, empty, too short, non-finite, another sample rate, several channels; any
error of the search, and a non-finite score). The caller decides the exit status from
``decoding_stats.json``'s ``num_failed`` (:func:`exit_status`).

With ``--batch_size N > 1`` and a batched search (``mb_greedy``, ``tdt_greedy``,
``mb_beam``, ``tdt_beam``) utterances are decoded N at a time (``decode_batch``),
grouped by length (32 N utterances are read and sorted at a time) and written in
input order, with the hypotheses of ``--batch_size 1``; a batch that fails is
decoded again one utterance at a time, so that a bad utterance fails alone, as it
does at batch 1.
"""

import inspect
import logging
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from espnet_multiblank.espnet.inference.decoding_stats import RunTally
from espnet_multiblank.espnet.inference.inputs import (
    InputChecks,
    Utterance,
    input_checks,
    read_utterances,
)
from espnet_multiblank.espnet.inference.outputs import (
    CtmWriter,
    result_problem,
    write_outputs,
    write_results,
)

logger = logging.getLogger("espnet_multiblank.asr_inference")

#: batched decoding sorts this many batches' worth of utterances by length at a time
SORT_WINDOW = 32


def inference(
    output_dir: str,
    batch_size: int,
    ngpu: int,
    seed: int,
    num_workers: int,
    log_level: Any,
    data_path_and_name_and_type: Sequence[Tuple[str, str, str]],
    key_file: Optional[str],
    allow_variable_data_keys: bool,
    model_tag: Optional[str] = None,
    word_lm_train_config: Optional[str] = None,
    word_lm_file: Optional[str] = None,
    entry_point: Optional[str] = None,
    speech2text_class: Any = None,
    allow_failed_utterances: bool = False,
    write_ctm: bool = False,
    **speech2text_kwargs: Any,
) -> Dict[str, Any]:
    """Decode a data set; the arguments of ``espnet2.bin.asr_inference.inference``.

    Args:
        allow_failed_utterances: Read by the caller (:func:`exit_status`), here only
            so that a parsed command line can be passed as it is.
        write_ctm: Also write ``<output_dir>/1best_recog/ctm`` (the 1-best's words
            with their times and confidences, :mod:`.timestamps`).
        entry_point: Written to ``decoding_stats.json`` (ESPnet's stock module).
        speech2text_class: The ``Speech2Text`` class (default
            :class:`~espnet_multiblank.espnet.inference.speech2text.MultiblankSpeech2Text`).

    Returns:
        The statistics written to ``<output_dir>/decoding_stats.json``.
    """
    from espnet2.fileio.datadir_writer import DatadirWriter
    from espnet2.tasks.asr import ASRTask
    from espnet2.torch_utils.set_all_random_seed import set_all_random_seed

    _refuse_unsupported(word_lm_train_config, ngpu, speech2text_kwargs)
    streaming, offline_chunk = streaming_options(speech2text_kwargs)
    logging.basicConfig(
        level=log_level,
        format="%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s",
    )
    device = "cuda" if ngpu >= 1 else "cpu"
    set_all_random_seed(seed)
    speech2text = build_speech2text(
        speech2text_class, speech2text_kwargs, device, model_tag
    )
    if offline_chunk is not None:
        set_offline_chunk(speech2text.asr_model, *offline_chunk)
    batched = batch_size > 1 and speech2text.supports_batch
    if batch_size > 1 and not batched and streaming is None:
        logger.warning(
            "batch_size=%d: the chosen search decodes one utterance at a time "
            "(batched decoding: search_type mb_greedy, mb_beam, tdt_greedy or "
            "tdt_beam)",
            batch_size,
        )
    utterances = read_utterances(
        data_path_and_name_and_type,
        key_file,
        ASRTask.build_preprocess_fn(speech2text.asr_train_args, False),
    )
    if streaming is not None:
        from espnet_multiblank.espnet.inference.stream_loop import (
            StreamingRun,
            write_stream_result,
        )

        run = StreamingRun(speech2text, batch_size, **streaming)
        write = write_stream_result
    else:
        run = DecodingRun(speech2text, input_checks(speech2text), batch_size, batched)
        write = write_results
    ctm = CtmWriter(speech2text, output_dir) if write_ctm else None
    start = time.perf_counter()
    try:
        with DatadirWriter(output_dir) as writer:
            for key, results in run.decode(utterances):
                write(writer, key, results, speech2text.nbest)
                if ctm is not None:
                    best = results.results[0] if streaming is not None else results[0]
                    ctm.write(key, best)
    finally:
        if ctm is not None:
            ctm.close()
    stats = run.stats(time.perf_counter() - start, device, entry_point)
    write_outputs(output_dir, stats, run.failed)
    return stats


def streaming_options(
    kwargs: Dict[str, Any],
) -> Tuple[Optional[Dict[str, Any]], Optional[Tuple[int, Optional[int]]]]:
    """The streaming options, removed from ``kwargs`` (the ``Speech2Text``
    arguments).

    Returns:
        The options of the streaming run (None unless ``--streaming true`` asks to
        stream a transducer; other models keep ESPnet's ``--streaming``), and,
        without ``--streaming``, the ``(chunk, left chunks)`` of
        ``--streaming_chunk_size`` (None when 0): offline decoding at that chunk
        (the chunk-masked encoder output: the hypotheses the streams give).
    """
    from espnet_multiblank.espnet.inference.arguments import STREAMING_OPTIONS
    from espnet_multiblank.espnet.inference.search_choice import config_is_transducer

    options = {k: kwargs.pop(k) for k in STREAMING_OPTIONS if k in kwargs}
    chunk = options.get("streaming_chunk_size", 0)
    left = options.get("streaming_left_chunks")
    if not kwargs.get("streaming") or not config_is_transducer(
        kwargs.get("asr_train_config")
    ):
        return None, ((chunk, left) if chunk else None)
    kwargs["streaming"] = False  # handled here: ESPnet's Speech2Text must not see it
    return {
        "sim_chunk_length": options.get("sim_chunk_length", 0),
        "chunk_size": chunk,
        "left_chunks": left,
        "partial": options.get("streaming_partial", "provisional"),
    }, None


def set_offline_chunk(model: Any, chunk: int, left: Optional[int]) -> None:
    """Decode offline at ``chunk`` encoder frames per chunk (``encoder:
    chunk_conformer``)."""
    encoder = getattr(model, "encoder", None)
    if not hasattr(encoder, "set_decoding_chunk"):
        raise ValueError(
            f"--streaming_chunk_size {chunk}: the encoder "
            f"({type(encoder).__name__}) has no chunks (encoder: chunk_conformer)"
        )
    if chunk < 0:
        raise ValueError(f"--streaming_chunk_size must be >= 0, got {chunk}")
    encoder.set_decoding_chunk(chunk, left)
    logger.info("offline decoding at chunks of %d encoder frames", chunk)


def _refuse_unsupported(word_lm_train_config, ngpu: int, kwargs: Dict) -> None:
    if word_lm_train_config is not None:
        raise NotImplementedError("Word LM is not implemented")
    if ngpu > 1:
        raise NotImplementedError("only single GPU decoding is supported")
    if kwargs.get("enh_s2t_task") or kwargs.get("multi_asr"):
        raise NotImplementedError(
            "enh_s2t_task / multi_asr: use espnet2.bin.asr_inference"
        )


def build_speech2text(
    cls: Any, kwargs: Dict[str, Any], device: str, model_tag: Optional[str]
) -> Any:
    """The ``Speech2Text`` of the run, from the arguments it accepts (the others are
    logged as unused)."""
    if cls is None:
        from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

        cls = MultiblankSpeech2Text
    accepted = set(inspect.signature(cls.__init__).parameters)
    accepted |= set(inspect.signature(cls.espnet_speech2text.__init__).parameters)
    s2t_kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    ignored = sorted(set(kwargs) - set(s2t_kwargs))
    if ignored:
        logger.warning("arguments not used by Speech2Text: %s", ignored)
    s2t_kwargs["device"] = device
    if model_tag is not None:
        from espnet_model_zoo.downloader import ModelDownloader

        s2t_kwargs.update(ModelDownloader().download_and_unpack(model_tag))
    return cls(**s2t_kwargs)


class DecodingRun(RunTally):
    """Decodes utterances, one at a time or in batches, and keeps what failed (the
    counts: :class:`~espnet_multiblank.espnet.inference.decoding_stats.RunTally`).

    Args:
        speech2text: The built ``Speech2Text``.
        checks: What the model can decode.
        batch_size: ``--batch_size``.
        batched: Whether the search decodes batches.
    """

    def __init__(
        self, speech2text: Any, checks: InputChecks, batch_size: int, batched: bool
    ):
        super().__init__()
        self.speech2text = speech2text
        self.checks = checks
        self.batch_size = batch_size if batched else 1
        self.batched = batched

    def decode(self, utterances: Iterator[Utterance]) -> Iterator[Tuple[str, List]]:
        """``(key, n-best results)`` of every utterance that decoded, in input
        order."""
        size = self.batch_size * SORT_WINDOW if self.batched else 1
        window: List[Tuple[str, torch.Tensor, float]] = []
        for utt in utterances:
            self.num_utterances += 1
            speech = self._checked(utt)
            if speech is None:
                continue
            window.append((utt.key, speech, self._seconds(speech, utt.rate)))
            if len(window) == size:
                yield from self._decode_window(window)
                window = []
        if window:
            yield from self._decode_window(window)

    def _checked(self, utt: Utterance) -> Optional[torch.Tensor]:
        if utt.error is not None:
            self.fail(utt.key, utt.error)
            return None
        speech, reason = self.checks.check(utt.speech, utt.rate)
        if reason is not None:
            self.fail(utt.key, reason)
        return speech

    def _decode_window(self, window: List[Tuple[str, torch.Tensor, float]]):
        results: List[Optional[List]] = [None] * len(window)
        inputs = [(key, speech) for key, speech, _ in window]
        for rows, speech, lengths in length_sorted_batches(inputs, self.batch_size):
            per_utt = self._decode_batch(speech, lengths) if self.batched else None
            if per_utt is None:  # one by one (also what isolates a bad utterance)
                per_utt = [self._decode_one(*inputs[i]) for i in rows]
            for i, result in zip(rows, per_utt):
                results[i] = result
        for (key, _, seconds), result in zip(window, results):  # input order
            reason = result_problem(result) if result is not None else None
            if reason is not None:
                self.fail(key, reason)
            elif result is not None:
                self.audio_seconds += seconds
                yield key, result

    def _decode_batch(self, speech: torch.Tensor, lengths: torch.Tensor):
        try:
            return self.speech2text.decode_batch(speech, lengths)
        except Exception as e:  # decoded again one by one: the culprit fails alone
            logger.info("batch of %d decoded one by one: %r", speech.size(0), e)
            return None

    def _decode_one(self, key: str, speech: torch.Tensor) -> Optional[List]:
        from espnet_multiblank.espnet.compat import TooShortUttError

        try:
            results = self.speech2text(speech)
        except TooShortUttError as e:
            self.fail(key, f"too short for the encoder: {e}")
            return None
        except Exception as e:  # reported with its key; the run goes on
            logger.warning("utterance %s: the search failed", key, exc_info=True)
            self.fail(key, f"decoding failed: {type(e).__name__}: {e}")
            return None
        if isinstance(results, tuple):  # (results, intermediate CTC)
            results = results[0]
        return results

    def _seconds(self, speech: torch.Tensor, rate: Optional[int]) -> float:
        if rate:
            return speech.size(0) / float(rate)
        return feature_seconds(speech.size(0), self.speech2text.asr_train_args)

    def stats(
        self, decode_seconds: float, device: str, entry_point: Optional[str]
    ) -> Dict[str, Any]:
        """``decoding_stats.json``."""
        st = self.speech2text.stats
        stats = {
            **self.totals(decode_seconds),
            **st.as_dict(),
            "search": type(self.speech2text.beam_search_transducer).__name__,
            "batch_size": self.batch_size,
            "dtype": self.speech2text.dtype,
            "device": device,
            "torch_num_threads": torch.get_num_threads(),
        }
        if entry_point is not None:
            stats["entry_point"] = entry_point
        return stats


def length_sorted_batches(utterances: List[Tuple[str, torch.Tensor]], size: int):
    """Batches of utterances of similar length (longest first: least padding); only
    inputs of the same shape but for their length share a batch.

    Args:
        utterances: ``(key, speech)``, speech (L,) or (L, F).
        size: Utterances per batch.

    Yields:
        ``(rows, speech, lengths)``: indices into ``utterances``, the zero-padded
        (B, L_max) or (B, L_max, F) input and the (B,) int64 lengths.
    """
    groups: Dict[Tuple[int, ...], List[int]] = {}
    for i, (_, speech) in enumerate(utterances):
        groups.setdefault(tuple(speech.shape[1:]), []).append(i)
    for rows_of_shape in groups.values():
        order = sorted(
            rows_of_shape, key=lambda i: -utterances[i][1].size(0)
        )  # stable: equal lengths keep the input order
        for first in range(0, len(order), size):
            rows = order[first : first + size]
            seqs = [utterances[i][1] for i in rows]
            lengths = torch.tensor([x.size(0) for x in seqs], dtype=torch.long)
            speech = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
            yield rows, speech, lengths


def feature_seconds(frames: int, train_args: Any) -> float:
    """Seconds of a feature input (not a ``sound`` file): frames x ``hop_length /
    fs`` of the frontend config, else 10 ms per frame."""
    conf = dict(getattr(train_args, "frontend_conf", None) or {})
    fs = conf.get("fs", 16000)
    if isinstance(fs, str):
        import humanfriendly

        fs = humanfriendly.parse_size(fs)
    hop = conf.get("hop_length", None)
    return frames * (float(hop) / float(fs) if hop else 0.01)


def exit_status(stats: Dict[str, Any], allow_failed: bool) -> int:
    """1 when utterances failed (unless ``allow_failed``: ``--allow_failed_utterances
    true``), else 0."""
    if stats.get("num_failed") and not allow_failed:
        logger.error(
            "exit status 1: %d utterances failed (--allow_failed_utterances true "
            "exits 0 with the same outputs)",
            stats["num_failed"],
        )
        return 1
    return 0
