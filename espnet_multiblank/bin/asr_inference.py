#!/usr/bin/env python3
"""ASR decoding with the multi-blank transducer searches (ESPnet's CLI, same outputs).

Usage (every argument of ``espnet2.bin.asr_inference``)::

    python -m espnet_multiblank.bin.asr_inference \\
        --config conf/decode/mb_greedy.yaml \\
        --asr_train_config exp/asr/config.yaml \\
        --asr_model_file exp/asr/valid.loss.ave.pth \\
        --data_path_and_name_and_type dump/raw/test/wav.scp,speech,sound \\
        --output_dir exp/asr/decode_test

It calls :func:`espnet_multiblank.register` first (so models trained with
``model: multiblank_espnet`` rebuild), decodes with
:class:`~espnet_multiblank.espnet.speech2text.MultiblankSpeech2Text`, writes ESPnet's
layout (``<output_dir>/1best_recog/{text,token,token_int,score}``, ``Nbest_recog`` for
``--nbest N``) and ``<output_dir>/decoding_stats.json``::

    {"num_utterances", "audio_seconds", "decode_seconds", "rtf", "total_frames",
     "frames_skipped", "frames_skipped_by_big_blanks", "big_blank_emissions", ...}

``decode_seconds`` is the wall time of the decoding loop (data loading, encoder,
search, writing; model loading excluded); ``rtf = decode_seconds / audio_seconds``;
``search_seconds`` is the part spent in the transducer search alone (what big blanks
shorten: the encoder runs on every frame either way).
With ``--batch_size N > 1`` and ``search_type: mb_greedy`` utterances are decoded N at
a time (``decode_batch``: batched greedy search, and batched encoder when the model's
encoder is batch-exact, see :mod:`espnet_multiblank.espnet.exact_encoding`), grouped by
length (32 N utterances are read and sorted at a time) and written in input order;
the hypotheses are those of ``--batch_size 1``. Other searches decode one utterance at
a time.
"""

import inspect
import logging
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import espnet_multiblank.espnet.quiet  # noqa: F401  (before espnet2)

logger = logging.getLogger("espnet_multiblank.asr_inference")

#: batched decoding sorts this many batches' worth of utterances by length at a time
_SORT_WINDOW = 32


def _audio_seconds(speech_lengths, speech_dim: int, train_args: Any) -> float:
    """Seconds of audio in a batch: samples / fs, or feature frames * frame shift.

    Args:
        speech_lengths: (B,) lengths of the ``speech`` input.
        speech_dim: ``speech.dim()`` (2: waveform (B, L); 3: features (B, L, F)).
    """
    conf = dict(getattr(train_args, "frontend_conf", None) or {})
    fs = conf.get("fs", 16000)
    if isinstance(fs, str):
        import humanfriendly

        fs = humanfriendly.parse_size(fs)
    total = float(speech_lengths.sum())
    if speech_dim <= 2:
        return total / float(fs)
    hop = conf.get("hop_length", None)
    return total * (float(hop) / float(fs) if hop else 0.01)


def _windows(loader, size: int):
    """Utterances of a batch-size-1 loader, ``size`` at a time, in input order.

    Yields:
        lists of ``(key, speech)``, speech (L,) or (L, F) without padding.
    """
    window = []
    for keys, batch in loader:
        speech = batch["speech"]
        lengths = batch.get("speech_lengths")
        length = speech.size(1) if lengths is None else int(lengths[0])
        window.append((keys[0], speech[0, :length]))
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def _length_sorted_batches(utterances, batch_size: int):
    """Batches of utterances of similar length (longest first: least padding).

    Args:
        utterances: list of ``(key, speech)``, speech (L,) or (L, F).

    Yields:
        ``(rows, speech, lengths)``: indices into ``utterances``, the zero-padded
        (B, L_max) or (B, L_max, F) input and the (B,) int64 lengths.
    """
    import torch

    order = sorted(
        range(len(utterances)), key=lambda i: -utterances[i][1].size(0)
    )  # stable: equal lengths keep the input order
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        seqs = [utterances[i][1] for i in rows]
        lengths = torch.tensor([x.size(0) for x in seqs], dtype=torch.long)
        yield rows, torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True), lengths


def _write(writer, key: str, results, nbest: int) -> None:
    for n, (text, token, token_int, hyp) in zip(range(1, nbest + 1), results):
        ibest = writer[f"{n}best_recog"]
        ibest["token"][key] = " ".join(token)
        ibest["token_int"][key] = " ".join(map(str, token_int))
        ibest["score"][key] = str(float(hyp.score))
        if text is not None:
            ibest["text"][key] = text


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
    **speech2text_kwargs: Any,
) -> Dict[str, Any]:
    """Decode a data set; same arguments as ``espnet2.bin.asr_inference.inference``.

    Returns:
        The statistics written to ``<output_dir>/decoding_stats.json``.
    """
    import torch
    from espnet2.fileio.datadir_writer import DatadirWriter
    from espnet2.tasks.asr import ASRTask
    from espnet2.torch_utils.set_all_random_seed import set_all_random_seed
    from espnet.nets.pytorch_backend.transformer.subsampling import TooShortUttError

    from espnet_multiblank.espnet.speech2text import (
        MultiblankSpeech2Text,
        write_decoding_stats,
    )

    if word_lm_train_config is not None:
        raise NotImplementedError("Word LM is not implemented")
    if ngpu > 1:
        raise NotImplementedError("only single GPU decoding is supported")
    if speech2text_kwargs.get("enh_s2t_task") or speech2text_kwargs.get("multi_asr"):
        raise NotImplementedError(
            "enh_s2t_task / multi_asr: use espnet2.bin.asr_inference"
        )
    logging.basicConfig(
        level=log_level,
        format="%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s",
    )
    device = "cuda" if ngpu >= 1 else "cpu"
    set_all_random_seed(seed)

    accepted = inspect.signature(MultiblankSpeech2Text.__init__).parameters
    espnet_accepted = inspect.signature(
        MultiblankSpeech2Text.espnet_speech2text.__init__
    ).parameters
    s2t_kwargs = {
        k: v
        for k, v in speech2text_kwargs.items()
        if k in accepted or k in espnet_accepted
    }
    ignored = sorted(set(speech2text_kwargs) - set(s2t_kwargs))
    if ignored:
        logger.warning("arguments not used by Speech2Text: %s", ignored)
    s2t_kwargs["device"] = device
    if model_tag is not None:
        from espnet_model_zoo.downloader import ModelDownloader

        s2t_kwargs.update(ModelDownloader().download_and_unpack(model_tag))
    speech2text = MultiblankSpeech2Text(**s2t_kwargs)
    nbest = speech2text.nbest
    dtype = s2t_kwargs.get("dtype", "float32")

    batched = batch_size > 1 and speech2text.supports_batch
    if batch_size > 1 and not batched:
        logger.warning(
            "batch_size=%d: the chosen search decodes one utterance at a time "
            "(batched decoding: search_type mb_greedy)",
            batch_size,
        )
    loader = ASRTask.build_streaming_iterator(
        data_path_and_name_and_type,
        dtype=dtype,
        batch_size=1,  # batches are made below, from length-sorted utterances
        key_file=key_file,
        num_workers=num_workers,
        preprocess_fn=ASRTask.build_preprocess_fn(speech2text.asr_train_args, False),
        collate_fn=ASRTask.build_collate_fn(speech2text.asr_train_args, False),
        allow_variable_data_keys=allow_variable_data_keys,
        inference=True,
    )

    def too_short(key, err):
        from espnet.nets.beam_search import Hypothesis

        logger.warning(f"Utterance {key} {err}")
        hyp = Hypothesis(score=0.0, scores={}, states={}, yseq=[])
        return [(" ", ["<space>"], [2], hyp)] * nbest

    def decode_one(key, speech):
        try:
            results = speech2text(speech)
        except TooShortUttError as e:
            results = too_short(key, e)
        if isinstance(results, tuple):  # (results, intermediate CTC)
            results = results[0]
        return results

    audio_seconds, num_utterances = 0.0, 0
    start = time.perf_counter()
    with DatadirWriter(output_dir) as writer:
        for utterances in _windows(loader, batch_size * _SORT_WINDOW if batched else 1):
            num_utterances += len(utterances)
            results = [None] * len(utterances)
            for rows, speech, lengths in _length_sorted_batches(
                utterances, batch_size if batched else 1
            ):
                audio_seconds += _audio_seconds(
                    lengths, speech.dim(), speech2text.asr_train_args
                )
                per_utt = None
                if batched:
                    try:
                        per_utt = speech2text.decode_batch(speech, lengths)
                    except TooShortUttError:  # one by one, to isolate the culprit
                        pass
                if per_utt is None:
                    per_utt = [decode_one(*utterances[i]) for i in rows]
                for i, result in zip(rows, per_utt):
                    results[i] = result
            for (key, _), result in zip(utterances, results):  # input order
                _write(writer, key, result, nbest)
    decode_seconds = time.perf_counter() - start

    st = speech2text.stats
    stats = {
        "num_utterances": num_utterances,
        "audio_seconds": audio_seconds,
        "decode_seconds": decode_seconds,
        "rtf": decode_seconds / audio_seconds if audio_seconds > 0 else None,
        **st.as_dict(),
        "search": type(speech2text.beam_search_transducer).__name__,
        "batch_size": batch_size if batched else 1,
        "device": device,
        "torch_num_threads": torch.get_num_threads(),
    }
    write_decoding_stats(output_dir, stats)
    skipped = 100.0 * st.frames_skipped / st.total_frames if st.total_frames else 0.0
    logger.info(
        "decoding_stats: %d utts, %.2f s audio, %.2f s wall, RTF %.4f, %d frames, "
        "%d big blanks, %d frames skipped (%.1f%%)",
        num_utterances,
        audio_seconds,
        decode_seconds,
        stats["rtf"] or 0.0,
        st.total_frames,
        st.big_blank_emissions,
        st.frames_skipped,
        skipped,
    )
    return stats


def dict_arg(value: str) -> Dict[str, Any]:
    """``--transducer_conf`` from the command line: a YAML mapping
    (``"{search_type: mb_beam, beam_size: 4}"``) or ``key=value[,key=value...]``."""
    import yaml

    loaded = yaml.safe_load(value)
    if isinstance(loaded, dict):
        return loaded
    out = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value or a YAML mapping, got {value!r}")
        out[key.strip()] = yaml.safe_load(val)
    return out


def get_parser():
    """ESPnet's ``asr_inference`` parser (same arguments, same defaults).

    One difference: ESPnet's ``--transducer_conf`` only works from a YAML config (on
    the command line it stays a string); here it also accepts
    ``--transducer_conf search_type=mb_beam,max_sym_per_frame=5`` or a YAML mapping.
    """
    from espnet2.bin.asr_inference import get_parser as espnet_get_parser

    parser = espnet_get_parser()
    parser.description = (
        "ASR decoding with espnet-multiblank's transducer searches "
        "(transducer_conf.search_type: mb_greedy, mb_beam, greedy, default, ...)"
    )
    for action in parser._actions:
        if action.dest == "transducer_conf":
            action.type = dict_arg
    return parser


def main(cmd=None):
    from espnet.utils.cli_utils import get_commandline_args

    import espnet_multiblank

    espnet_multiblank.register()
    print(get_commandline_args(), file=sys.stderr)
    parser = get_parser()
    args = parser.parse_args(cmd)
    kwargs = vars(args)
    kwargs.pop("config", None)
    inference(**kwargs)


if __name__ == "__main__":
    main()
