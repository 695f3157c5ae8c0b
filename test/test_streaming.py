"""Streaming decoding of ``encoder: chunk_conformer`` models (espnet/inference).

Oracles: the model's own features and chunk-masked encoder output on the whole
waveform (frontend frames across piece boundaries, encoder chunks); the offline
search on the projected encoder frames the stream computed (final hypotheses
identical, every lattice, greedy and beam, several chunk sizes and piece lengths);
the same stream cut into other pieces (identical results); each stream decoded
alone (several streams batched).
"""

import math

import numpy as np
import pytest
import torch
from one_loop import one_loop_projected
from streaming_cases import FS, KINDS, make_experiment, pieces, speech2text, waveform

from espnet_multiblank.decoding.streaming import (
    StreamingBeamSearch,
    StreamingGreedySearch,
    StreamingRowGreedySearch,
)
from espnet_multiblank.espnet.inference.stream_encoder import (
    FeatureStream,
    StreamEncoder,
)
from espnet_multiblank.espnet.inference.streaming import (
    MultiblankSpeech2TextStreaming,
    StreamingDecoder,
)

pytestmark = pytest.mark.timeout(900)

GREEDY = {"standard": "mb_greedy", "multiblank": "mb_greedy", "tdt": "tdt_greedy"}
BEAM = {"standard": "mb_beam", "multiblank": "mb_beam", "tdt": "tdt_beam"}


@pytest.fixture(scope="module")
def experiments(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming")
    out = {kind: make_experiment(root / kind, kind, blank_bias=1.5) for kind in KINDS}
    # Kaldi's framing (frontend: kaldi_fbank), a TDT
    out["tdt_kaldi"] = make_experiment(
        root / "tdt_kaldi", "tdt", blank_bias=1.5, frontend="kaldi_fbank"
    )
    return out


@pytest.fixture(scope="module")
def s2t(experiments):
    cache = {}

    def get(kind, search="greedy", **kwargs):
        key = (kind, search, tuple(sorted(kwargs.items())))
        if key not in cache:
            table = GREEDY if search == "greedy" else BEAM
            conf = {"search_type": table[kind.split("_")[0]], **kwargs}
            beam = 1 if search == "greedy" else 3
            cache[key] = speech2text(
                experiments[kind], transducer_conf=conf, beam_size=beam, nbest=beam
            )
        return cache[key]

    return get


@pytest.mark.parametrize("kind", ["multiblank", "tdt_kaldi"])
def test_frontend_frames_across_pieces_are_the_whole_waveforms(s2t, kind):
    model = s2t(kind).asr_model
    speech = waveform(5003, 0)
    with torch.no_grad():
        feats, lens = model._extract_feats(
            torch.from_numpy(speech)[None], torch.tensor([len(speech)])
        )
        feats, _ = model.normalize(feats, lens)
    F = feats.size(1)
    for size in (1, 41, 333, 5003):
        stream = FeatureStream(model, torch.float32, torch.device("cpu"))
        got, done = [], 0
        for first in range(0, len(speech), size):
            piece = torch.from_numpy(speech[first : first + size])
            stream.add(piece, final=first + size >= len(speech))
            ready = stream.available()
            if ready > done:
                got.append(stream.compute(done, ready))
                done = ready
        got = torch.cat(got, 1)
        assert got.shape == feats.shape and stream.total_frames() == F
        torch.testing.assert_close(got, feats, atol=1e-4, rtol=1e-5)


def test_a_long_stream_keeps_a_few_frames_of_samples(s2t):
    """The features of a long stream equal the whole waveform's, and the samples
    no frame to come reads are dropped."""
    model = s2t("multiblank").asr_model
    speech = waveform(60013, 5)
    with torch.no_grad():
        feats, lens = model._extract_feats(
            torch.from_numpy(speech)[None], torch.tensor([len(speech)])
        )
        feats, _ = model.normalize(feats, lens)
    stream = FeatureStream(model, torch.float32, torch.device("cpu"))
    got, done, largest = [], 0, 0
    for first in range(0, len(speech), 1500):
        stream.add(torch.from_numpy(speech[first : first + 1500]), first + 1500 > 60013)
        ready = stream.available()
        got.append(stream.compute(done, ready))
        done = ready
        largest = max(largest, stream._samples.numel())
    torch.testing.assert_close(torch.cat(got, 1), feats, atol=1e-4, rtol=1e-5)
    assert largest <= 16384


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_encoder_chunks_equal_the_chunk_masked_forward_and_ignore_pieces(s2t, chunk):
    model = s2t("tdt").asr_model
    model.encoder.set_decoding_chunk(chunk)
    speech = waveform(6100, 1)
    with torch.no_grad():
        enc, _ = model.encode(torch.from_numpy(speech)[None], torch.tensor([6100]))
    outs = []
    for size in (0, 50, 777):
        stream = StreamEncoder(model, chunk, torch.float32, torch.device("cpu"))
        chunks = []
        for piece, final in pieces(speech, size):
            chunks += stream.feed(torch.from_numpy(piece), final)
        assert all(c.size(1) == chunk for c in chunks[:-1])
        outs.append(torch.cat(chunks, 1))
    torch.testing.assert_close(outs[0], enc, atol=2e-5, rtol=0)
    for other in outs[1:]:
        assert torch.equal(other, outs[0])  # the pieces change nothing at all


def offline(decoder, frames):
    """The offline search's hypotheses on a stream's projected frames."""
    if isinstance(decoder.rows, StreamingBeamSearch):
        return decoder.search.nbest_projected(frames)
    lens = torch.tensor([frames.size(0)])
    if isinstance(decoder.rows, StreamingRowGreedySearch):
        return one_loop_projected(decoder.search, frames[None], lens)
    return decoder.search.search_projected(frames[None], lens)


def run_stream(decoder, key, speech, size):
    decoder.open(key, FS)
    partial = []
    for piece, final in pieces(speech, size):
        result = decoder.feed({key: (piece, final)})[key]
        if not final:
            partial.append(result.results[0][2])
    return result, partial


def check_final_hypotheses(speech2text, chunks, sizes):
    """Streaming at each chunk size and piece length: the final n-best is the
    offline search's on the stream's own encoder frames, and the same for every
    piece length."""
    speech = waveform(9000, 2)
    for chunk in chunks:
        finals = []
        for size in sizes:
            decoder = StreamingDecoder(speech2text, chunk, record_frames=True)
            result, partial = run_stream(decoder, "u", speech, size)
            assert result.is_final and result.error is None
            want = offline(decoder, decoder.recorded["u"])
            got = [(r[2], r[3].score) for r in result.results]
            assert got == [(h.labels, h.score) for h in want]
            finals.append(got)
            assert len(partial) == (math.ceil(len(speech) / size) if size else 0)
        assert all(f == finals[0] for f in finals)  # the pieces change nothing


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("kind", list(KINDS) + ["tdt_kaldi"])
def test_final_hypothesis_is_the_offline_search_on_the_same_frames(s2t, kind, search):
    check_final_hypotheses(s2t(kind, search), chunks=[3], sizes=[0, 1000])


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_final_hypothesis_at_more_chunk_sizes_and_pieces(s2t, kind, search):
    check_final_hypotheses(s2t(kind, search), chunks=[1, 4, 16], sizes=[97, 333])


def test_streams_batched_equal_each_alone_and_report_emission_times(s2t):
    speech2text = s2t("multiblank")
    speeches = {f"u{i}": waveform(4000 + 1700 * i, 10 + i) for i in range(4)}
    alone = {}
    for key, speech in speeches.items():
        decoder = StreamingDecoder(speech2text, 4)
        alone[key] = run_stream(decoder, key, speech, 400)[0]
    # the label-looping batch (on a CPU the default runs each stream on its own)
    decoder = StreamingDecoder(speech2text, 4, max_streams=3, one_loop=False)
    assert type(decoder.rows) is StreamingGreedySearch
    results, sent = {}, {key: 0 for key in speeches}
    waiting = list(speeches)
    while waiting or decoder.streams:
        while waiting and len(decoder.streams) < 3:
            decoder.open(waiting.pop(0), FS)
        batch = {}
        for key in decoder.streams:
            speech, first = speeches[key], sent[key]
            size = 300 + 100 * int(key[1])  # each stream its own piece length
            sent[key] = first + size
            batch[key] = (speech[first : first + size], first + size >= len(speech))
        for key, result in decoder.feed(batch).items():
            if result.is_final:
                results[key] = result
    for key, result in results.items():
        assert result.results[0][2] == alone[key].results[0][2]
        assert math.isclose(
            result.results[0][3].score, alone[key].results[0][3].score, abs_tol=1e-4
        )
        seconds = len(speeches[key]) / FS
        assert len(result.emitted) == len(result.results[0][2])
        assert all(
            0 < e <= c <= seconds for e, c in zip(result.emitted, result.committed)
        )
        assert result.emitted == sorted(result.emitted)


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_stream_loops_give_the_same_partials_and_hypotheses(s2t, kind):
    """One stream runs the one-utterance loop by default; the label-looping batch
    (``one_loop=False``) gives the same partial and final labels."""
    speech2text = s2t(kind)
    speech = waveform(9000, 4)
    got = {}
    for one_loop in (None, False):
        decoder = StreamingDecoder(speech2text, 3, one_loop=one_loop)
        want = StreamingRowGreedySearch if one_loop is None else StreamingGreedySearch
        assert type(decoder.rows) is want
        result, partial = run_stream(decoder, "u", speech, 700)
        got[one_loop] = (result.results[0][2], partial)
    assert got[None] == got[False]
    assert got[None][0] and len(set(map(tuple, got[None][1]))) > 1


def test_bad_pieces_end_only_their_stream(s2t):
    decoder = StreamingDecoder(s2t("tdt"), 4, max_streams=4)
    good = waveform(5000, 3)
    nan = good.copy()
    nan[2500] = np.nan
    decoder.open("good", FS)
    decoder.open("nan", FS)
    decoder.open("stereo", FS)
    decoder.open("rate", 16000)
    out = decoder.feed(
        {
            "good": (good[:2400], False),
            "nan": (nan[:2400], False),
            "stereo": (np.stack([good[:2400]] * 2, 1), False),
            "rate": (good[:2400], False),
        }
    )
    assert out["good"].error is None and not out["good"].is_final
    assert out["nan"].error is None
    assert out["stereo"].is_final and "2 channels" in out["stereo"].error
    assert out["rate"].is_final and "sample rate 16000 Hz" in out["rate"].error
    out = decoder.feed({"good": (good[2400:], True), "nan": (nan[2400:], False)})
    assert out["nan"].is_final and "non-finite samples: 1 NaN" in out["nan"].error
    assert out["good"].is_final and out["good"].error is None
    assert decoder.streams == {}
    decoder.open("short", FS)
    out = decoder.feed({"short": (good[:100], True)})
    assert "too short" in out["short"].error
    decoder.open("empty", FS)
    assert decoder.feed({"empty": (good[:0], True)})["empty"].error.startswith("empty")
    with pytest.raises(KeyError, match="no open stream"):
        decoder.feed({"unknown": (good, True)})


def test_speech2text_streaming_interface(experiments, s2t):
    exp = experiments["standard"]
    streaming = MultiblankSpeech2TextStreaming(
        chunk_size=4,
        asr_train_config=str(exp / "config.yaml"),
        asr_model_file=str(exp / "model.pth"),
        device="cpu",
    )
    speech = waveform(7000, 4)
    partial = streaming(speech[:3000], is_final=False)
    assert len(partial) == 1 and len(partial[0]) == 4
    final = streaming(speech[3000:], is_final=True)
    again = streaming(speech, is_final=True)  # it reset itself after the final piece
    assert [r[2] for r in final] == [r[2] for r in again]
    streaming(speech[:2000], is_final=False)
    streaming.reset()
    assert [r[2] for r in streaming(speech)] == [r[2] for r in final]
    bad = speech.copy()
    bad[10] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        streaming(bad, is_final=False)
    assert [r[2] for r in streaming(speech)] == [r[2] for r in final]


def test_speech2text_streaming_checks_every_piece(experiments, s2t):
    """The one-stream class raises a ValueError naming the problem (and starts
    over) for a stereo, NaN, empty, too short piece, and for a sample rate other
    than the model's given to the constructor, with a piece, or as a pair."""
    speech = waveform(6000, 5)
    streaming = MultiblankSpeech2TextStreaming(chunk_size=4, speech2text=s2t("tdt"))
    want = [r[2] for r in streaming(speech)]
    assert want[0]  # labels: the comparisons below can fail
    nan = speech.copy()
    nan[[1, 2, 3]] = np.nan
    for piece, kwargs, final, reason in (
        (np.stack([speech] * 2, 1), {}, False, "speech: 2 channels"),
        (nan, {}, False, "speech: non-finite samples: 3 NaN, 0 inf"),
        (speech[:0], {}, True, "speech: empty (no samples)"),
        (speech[:50], {}, True, "speech: too short: 50 samples"),
        (speech, {"sample_rate": 16000}, False, "speech: sample rate 16000 Hz"),
        (speech, {"fs": 16000}, False, "speech: sample rate 16000 Hz"),
        ((speech, 16000), {}, False, "speech: sample rate 16000 Hz"),
        (speech.reshape(2, -1, 1), {}, False, "speech: an array of shape"),
    ):
        with pytest.raises(ValueError) as info:
            streaming(piece, is_final=final, **kwargs)
        assert str(info.value).startswith(reason), info.value
        # it started over: a good stream decodes as before
        assert [r[2] for r in streaming(speech)] == want
    # the rate of the model, said in every way, changes nothing
    for piece, kwargs in (
        (speech, {"sample_rate": FS}),
        (speech, {"fs": FS}),
        ((speech, FS), {}),
    ):
        assert [r[2] for r in streaming(piece, **kwargs)] == want
    at_16k = MultiblankSpeech2TextStreaming(
        chunk_size=4, speech2text=s2t("tdt"), fs=16000
    )
    with pytest.raises(ValueError, match="^speech: sample rate 16000 Hz"):
        at_16k(speech[:1000], is_final=False)
    with pytest.raises(ValueError, match="a piece at 8000 Hz in a stream at 16000"):
        at_16k((speech, FS))
    decoder = StreamingDecoder(s2t("tdt"), 4, max_streams=2)
    decoder.open("a", fs=16000)
    decoder.open("b", sample_rate=FS)
    out = decoder.feed({"a": (speech, True), "b": (speech, True)})
    assert out["a"].error.startswith("sample rate 16000 Hz, the model's is 8000 Hz")
    assert out["b"].error is None and [r[2] for r in out["b"].results] == want
    with pytest.raises(ValueError, match="sample_rate=8000 and fs=16000 disagree"):
        decoder.open("c", sample_rate=FS, fs=16000)


def test_models_that_cannot_stream_are_refused(s2t, tmp_path):
    speech2text = s2t("multiblank")
    with pytest.raises(ValueError, match="chunk_size"):
        StreamingDecoder(speech2text, 0)
    encoder = speech2text.asr_model.encoder
    speech2text.asr_model.encoder = torch.nn.Identity()
    try:
        with pytest.raises(ValueError, match="encoder: chunk_conformer"):
            StreamingDecoder(speech2text, 4)
    finally:
        speech2text.asr_model.encoder = encoder
