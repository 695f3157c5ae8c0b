"""The torch-free runtime (espnet_multiblank.runtime) against the plug-in.

Oracles: the plug-in's own searches on the same PyTorch model (``Speech2Text`` with
the shipped greedy settings, the label-synchronous beam search) for the
hypotheses, their scores and label frames; the runtime's offline search for its
streams (the final result of a stream must equal it, whatever the pieces); the
input checks' messages for bad input.
"""

import json

import numpy as np
import pytest
import torch
from export_cases import waveform

from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text
from espnet_multiblank.runtime import Recognizer
from espnet_multiblank.runtime import decode as decode_cli
from espnet_multiblank.runtime import read_wav

pytestmark = pytest.mark.timeout(900)

#: the plug-in's shipped greedy settings (conf/decode/mb_greedy.yaml, tdt_greedy.yaml)
GREEDY = {
    "multiblank": {"search_type": "mb_greedy", "max_sym_per_frame": 1},
    "tdt": {"search_type": "tdt_greedy", "max_sym_per_frame": 10},
}
LENGTHS = [900, 2000, 3700, 5200, 7100, 9900, 13000, 16100]

#: (lattice, encoder, blank bias): random models that emit many labels (negative
#: bias) or mostly blanks
MODELS = [
    ("standard", "chunk_conformer", -1.0),
    ("multiblank", "chunk_conformer", -1.0),
    ("tdt", "chunk_conformer", -1.0),
    ("tdt_gaps", "chunk_conformer", -1.0),
    ("tdt_no1", "chunk_conformer", -1.0),
    ("multiblank", "conformer", -1.0),
    ("tdt_gaps", "transformer", -1.0),
]
#: the same with the kaldi_fbank front end (sherpa-onnx's features)
KALDI = {"frontend": "kaldi_fbank"}


def _kind(lattice):
    return "tdt" if lattice.startswith("tdt") else "multiblank"


def _plugin(exp, lattice):
    """The plug-in's greedy search with its shipped settings."""
    return MultiblankSpeech2Text(
        asr_train_config=str(exp / "config.yaml"),
        asr_model_file=str(exp / "model.pth"),
        device="cpu",
        transducer_conf=dict(GREEDY[_kind(lattice)], blank_decision="total"),
    )


def _waves():
    return [waveform(n, 3 + i) for i, n in enumerate(LENGTHS)]


@pytest.mark.parametrize(
    "lattice,encoder,bias,extra",
    [m + ({},) for m in MODELS] + [("tdt", "chunk_conformer", -1.0, KALDI)],
)
def test_greedy_equals_the_plugin_one_by_one_and_batched(
    onnx_export, lattice, encoder, bias, extra
):
    exp, out = onnx_export(lattice, encoder, blank_bias=bias, **extra)
    s2t = _plugin(exp, lattice)
    rec = Recognizer(out, batch_size=3)
    waves = _waves()
    batched = rec.recognize_batch(waves)
    emitted = 0
    for w, b in zip(waves, batched):
        text, _, ids, hyp = s2t(torch.from_numpy(w))[0]
        one = rec.recognize(w)
        assert one.token_ids == ids and b.token_ids == ids
        assert one.text == text
        assert one.frames == [t[0] for t in hyp.timing]
        assert one.durations == [t[1] for t in hyp.timing]
        assert one.score == pytest.approx(float(hyp.score), abs=1e-3)
        assert one.frames_skipped == hyp.frames_skipped
        assert one.timestamps == pytest.approx(
            [f * rec.model.frame_shift for f in one.frames]
        )
        emitted += len(ids)
    assert emitted > len(
        waves
    )  # the models emit labels: the comparison means something


@pytest.mark.parametrize("lattice", ["standard", "multiblank", "tdt_gaps", "tdt_no1"])
def test_beam_search_equals_the_plugins_label_rule(onnx_export, lattice):
    exp, out = onnx_export(lattice, "chunk_conformer", blank_bias=-1.0)
    search = "tdt_beam" if lattice.startswith("tdt") else "mb_beam"
    s2t = MultiblankSpeech2Text(
        asr_train_config=str(exp / "config.yaml"),
        asr_model_file=str(exp / "model.pth"),
        device="cpu",
        beam_size=4,
        transducer_conf=dict(
            search_type=search,
            beam_sync="label",
            max_sym_per_frame=10,
            score_norm=False,
        ),
    )
    rec = Recognizer(out, search="beam", beam_size=4, batch_size=4)
    near_ties = 0
    for w, got in zip(_waves()[:6], rec.recognize_batch(_waves()[:6])):
        _, _, ids, hyp = s2t(torch.from_numpy(w))[0]
        if got.token_ids != ids:
            # allowed only where the float scores of the two are within 1e-3
            assert abs(got.score - float(hyp.score)) < 1e-3
            near_ties += 1
            continue
        assert got.score == pytest.approx(float(hyp.score), abs=1e-3)
        assert got.frames == [t[0] for t in hyp.timing]
    assert near_ties <= 1


@pytest.mark.parametrize("lattice", ["multiblank", "tdt_gaps"])
def test_offline_chunk_size_equals_the_plugin_at_that_chunk(onnx_export, lattice):
    exp, out = onnx_export(lattice, "chunk_conformer", blank_bias=-1.0)
    s2t = _plugin(exp, lattice)
    s2t.asr_model.encoder.set_decoding_chunk(3)
    rec = Recognizer(out, chunk_size=3)
    for w in _waves()[:5]:
        assert rec.recognize(w).token_ids == s2t(torch.from_numpy(w))[0][2]


@pytest.mark.parametrize(
    "lattice", ["standard", "multiblank", "tdt", "tdt_gaps", "tdt_no1"]
)
@pytest.mark.parametrize("chunk,piece", [(2, 333), (4, 80), (7, 1601)])
def test_streams_end_with_the_offline_result(onnx_export, lattice, chunk, piece):
    """Several streams decoded together, fed in pieces that do not align with
    chunks; each partial result is a prefix of the final one (greedy never takes
    back a step)."""
    _, out = onnx_export(lattice, "chunk_conformer", blank_bias=-1.0)
    rec = Recognizer(out, chunk_size=chunk)
    waves = _waves()
    streams = [rec.create_stream(key=str(i)) for i in range(len(waves))]
    partials = [[] for _ in waves]
    for start in range(0, max(len(w) for w in waves), piece):
        for s, w in zip(streams, waves):
            if start < len(w):
                s.accept_waveform(w[start : start + piece], decode=False)
                if start + piece >= len(w):
                    s.input_finished(decode=False)
        rec.decode_streams(streams)
        for p, s in zip(partials, streams):
            p.append(list(s.result.token_ids))
    offline = rec.recognize_batch(waves)
    for s, o, p in zip(streams, offline, partials):
        assert s.is_final
        assert s.result.token_ids == o.token_ids
        assert s.result.frames == o.frames
        assert s.result.score == pytest.approx(o.score, abs=1e-4)
        assert s.result.frames_skipped == o.frames_skipped
        for earlier in p:
            assert earlier == o.token_ids[: len(earlier)]


def test_beam_streams_end_with_the_offline_beam(onnx_export):
    _, out = onnx_export("tdt_gaps", "chunk_conformer", blank_bias=-1.0)
    rec = Recognizer(out, search="beam", chunk_size=4)
    w = _waves()[5]
    s = rec.create_stream()
    for start in range(0, len(w), 700):
        s.accept_waveform(w[start : start + 700])
    s.input_finished()
    assert s.result.token_ids == rec.recognize(w).token_ids


def test_bad_input_names_the_problem(onnx_export):
    _, out = onnx_export("multiblank", "chunk_conformer", blank_bias=-1.0)
    rec = Recognizer(out)
    w = waveform(4000, 1)
    nan = w.copy()
    nan[[5, 9]] = np.nan
    cases = [
        (np.stack([w, w], 1), "2 channels"),
        (nan, "2 NaN"),
        (np.zeros(0, np.float32), "no samples"),
        (w[: rec.model.info.min_samples - 1], "too short"),
        ((w * 32767).astype(np.int16), "integer dtype"),
        ("x.wav", "read_wav"),
    ]
    for samples, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            rec.recognize(samples)
    with pytest.raises(ValueError, match="16000 Hz, the model takes 8000 Hz"):
        rec.recognize(w, 16000)
    # a batch: the bad ones are named, the others decoded as alone
    results = rec.recognize_batch([w, nan, w[:10]], keys=["good", "nan", "short"])
    assert (
        results[0].error is None and results[0].token_ids == rec.recognize(w).token_ids
    )
    assert "utterance nan" in results[1].error and "NaN" in results[1].error
    assert "utterance short" in results[2].error and "too short" in results[2].error
    # streams: a bad piece stops its stream only
    good, bad = rec.create_stream(key="good"), rec.create_stream(key="bad")
    good.accept_waveform(w[:2000])
    with pytest.raises(ValueError, match="stream bad: non-finite"):
        bad.accept_waveform(nan[:2000])
    good.accept_waveform(w[2000:])
    good.input_finished()
    assert good.result.token_ids == rec.recognize(w).token_ids
    assert "non-finite" in bad.result.error
    with pytest.raises(ValueError, match="stopped"):
        bad.accept_waveform(w)
    short = rec.create_stream(key="short")
    short.accept_waveform(w[:10])
    short.input_finished()
    assert "too short" in short.result.error
    with pytest.raises(ValueError, match="16000 Hz"):
        rec.create_stream(sample_rate=16000)


def test_espnets_own_multiblank_model_exports_and_decodes_as_the_plugin(
    onnx_export,
):
    """``model: espnet`` (ESPnet's own class, its multi-blank keys): the lattice
    comes from its ``transducer_multi_blank_durations``."""
    exp, out = onnx_export("multiblank", "conformer", blank_bias=-1.0, model="espnet")
    assert "model: espnet\n" in (exp / "config.yaml").read_text()
    rec = Recognizer(out)
    assert rec.model.info.big_blank_durations == [2, 4]
    s2t = _plugin(exp, "multiblank")
    emitted = 0
    for w in _waves()[:5]:
        ids = s2t(torch.from_numpy(w))[0][2]
        assert rec.recognize(w).token_ids == ids
        emitted += len(ids)
    assert emitted


def test_an_offline_model_refuses_streams(onnx_export):
    _, out = onnx_export("multiblank", "conformer", blank_bias=-1.0)
    rec = Recognizer(out)
    with pytest.raises(ValueError, match="chunk_conformer"):
        rec.create_stream()
    with pytest.raises(ValueError, match="chunk_conformer"):
        Recognizer(out, chunk_size=4)


def _write_wav(path, samples, rate=8000):
    import soundfile

    soundfile.write(str(path), samples, rate, subtype="PCM_16")
    return path


def test_decode_command_writes_text_stats_and_failures(onnx_export, tmp_path):
    exp, out = onnx_export("tdt", "chunk_conformer", blank_bias=-1.0)
    waves = _waves()[:4]
    lines = []
    for i, w in enumerate(waves):
        lines.append(f"u{i} {_write_wav(tmp_path / f'u{i}.wav', w)}")
    lines.append(f"loud {_write_wav(tmp_path / 'st.wav', np.stack([waves[0]] * 2, 1))}")
    lines.append(f"fast {_write_wav(tmp_path / 'f.wav', waves[1], rate=16000)}")
    lines.append(f"gone {tmp_path / 'missing.wav'}")
    scp = tmp_path / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    rec = Recognizer(out)
    want = {}
    for i in range(4):
        samples, rate = read_wav(tmp_path / f"u{i}.wav")
        want[f"u{i}"] = rec.recognize(samples, rate).text
    shift_ms = rec.model.frame_shift * 1000
    chunk_ms = f"{4 * shift_ms:g}"
    for extra in ([], ["--streaming", "--chunk_ms", chunk_ms], ["--search", "beam"]):
        o = tmp_path / ("o" + "_".join(extra))
        args = ["--model_dir", str(out), "--wav_scp", str(scp), "--output_dir", str(o)]
        assert decode_cli.main(args + extra) == 1  # some failed
        text = dict(
            (line.split(" ", 1) + [""])[:2]
            for line in (o / "text").read_text().splitlines()
        )
        assert sorted(text) == ["u0", "u1", "u2", "u3"]
        if not extra:
            assert text == want
        stats = json.loads((o / "decoding_stats.json").read_text())
        assert sorted(stats["failed_utterances"]) == ["fast", "gone", "loud"]
        assert "2 channels" in stats["failed_utterances"]["loud"]
        assert "16000 Hz" in stats["failed_utterances"]["fast"]
        assert stats["utterances"] == 4 and stats["real_time_factor"] > 0
        assert len((o / "token_times.jsonl").read_text().splitlines()) == 4
    args = ["--model_dir", str(out), "--wav_scp", str(scp), "--output_dir", str(o)]
    assert decode_cli.main(args + ["--allow_failed_utterances", "true"]) == 0
    # streaming at 4 encoder frames per chunk gives the chunk-4 offline text
    rec4 = Recognizer(out, chunk_size=4)
    o = tmp_path / f"o--streaming_--chunk_ms_{chunk_ms}"
    text = dict(
        (line.split(" ", 1) + [""])[:2]
        for line in (o / "text").read_text().splitlines()
    )
    for i in range(4):
        samples, _ = read_wav(tmp_path / f"u{i}.wav")
        assert text[f"u{i}"] == rec4.recognize(samples).text
    bad_chunk = f"{1.5 * shift_ms:g}"
    assert decode_cli.main(args + ["--streaming", "--chunk_ms", bad_chunk]) == 2
