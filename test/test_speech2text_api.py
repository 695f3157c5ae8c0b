"""The plug-in's ``Speech2Text`` as a Python user calls it, in ESPnet 202511 and
202611: one utterance, a list of utterances (202611's ``__call__`` takes one),
``batch_decode`` on a list or a padded array, and the ``batch_size`` argument that
ESPnet 202611's ``Speech2Text`` takes (and refuses for transducers at > 1).

Bad inputs (several channels, NaN / inf, empty, too short, another sample rate given
by keyword, by a ``(samples, rate)`` pair or by a file) raise a ``ValueError`` that
names the argument and the problem, by every route: ``__call__``, a list,
``batch_decode`` (list and padded array), ``decode_batch``; the same audio given as
an array, a pair and a file decodes alike. No model without ``asr_model_file``
unless ``random_weights=True`` asks for one."""

import numpy as np
import pytest
import soundfile
import torch
from test_decoding_cli import LENGTHS  # noqa: I100
from test_decoding_stock import plugin_experiments

import espnet_multiblank


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    espnet_multiblank.register()
    root = tmp_path_factory.mktemp("s2t_api")
    # a joint network that makes this random model emit labels and big blanks
    return plugin_experiments(root, (("mb", (2, 4), 0.5, 10.0),))["mb"]


def _waves():
    rng = np.random.default_rng(3)
    return [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in LENGTHS]


def _speech2text(exp, search_type, **kwargs):
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    torch.set_num_threads(1)
    return MultiblankSpeech2Text(
        asr_train_config=exp / "config.yaml",
        asr_model_file=exp / "model.pth",
        transducer_conf={"search_type": search_type},
        beam_size=2,
        device="cpu",
        **kwargs,
    )


def _same(got, want):
    assert len(got) == len(want)
    for nbest_got, nbest_want in zip(got, want):
        assert [r[2] for r in nbest_got] == [r[2] for r in nbest_want]
        for a, b in zip(nbest_got, nbest_want):
            assert a[3].score == pytest.approx(b[3].score, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("search_type", ["mb_greedy", "mb_beam"])
def test_a_list_decodes_as_one_at_a_time(experiment, search_type):
    s2t = _speech2text(experiment, search_type, batch_size=4)
    waves = _waves()
    alone = [s2t(w) for w in waves]
    assert any(r[0][2] for r in alone)  # the random model emits some labels
    _same(s2t(waves), alone)
    _same(s2t.batch_decode(waves), alone)
    padded = np.zeros((len(waves), max(LENGTHS)), dtype=np.float32)
    for b, w in enumerate(waves):
        padded[b, : len(w)] = w
    _same(s2t.batch_decode(padded, LENGTHS), alone)
    with pytest.raises(ValueError, match="speech_lengths"):
        s2t.batch_decode(padded)


def test_batch_decode_reports_a_too_short_utterance(experiment):
    s2t = _speech2text(experiment, "mb_greedy")
    waves = _waves() + [np.zeros(10, dtype=np.float32)]
    with pytest.raises(ValueError, match=r"speech\[3\]: too short: 10 samples"):
        s2t.batch_decode(waves)


FS = 16000  # the rate of these models (ESPnet's default frontend)


def _bad_inputs():
    """name -> (input, keyword arguments, the start of the ValueError's reason)."""
    good = _waves()[0]
    nan, inf = good.copy(), good.copy()
    nan[[3, 500]] = np.nan
    inf[7] = -np.inf
    return {
        "stereo": (np.stack([good, good], 1), {}, "2 channels, the model takes one"),
        "nan": (nan, {}, "non-finite samples: 2 NaN, 0 inf"),
        "inf": (inf, {}, "non-finite samples: 0 NaN, 1 inf"),
        "empty": (good[:0], {}, "empty (no samples)"),
        "short": (good[:10], {}, "too short: 10 samples"),
        "rank3": (good.reshape(1, -1, 1), {}, "an array of shape (1, 8000, 1)"),
        "rate": (good, {"sample_rate": 8000}, "sample rate 8000 Hz, the model's"),
        "fs": (good, {"fs": 8000}, "sample rate 8000 Hz, the model's"),
        "pair": ((good, 8000), {}, "sample rate 8000 Hz, the model's"),
    }


@pytest.mark.parametrize("search_type", ["mb_greedy", "mb_beam"])
def test_bad_inputs_raise_by_every_route(experiment, search_type, tmp_path):
    s2t = _speech2text(experiment, search_type)
    good = _waves()
    for name, (bad, kwargs, reason) in _bad_inputs().items():
        with pytest.raises(ValueError) as info:
            s2t(bad, **kwargs)
        assert str(info.value).startswith(f"speech: {reason}"), (name, info.value)
        # in a list (ESPnet 202611's __call__) and batch_decode: named by index
        for call in (s2t, s2t.batch_decode):
            with pytest.raises(ValueError) as info:
                call([good[1], bad, good[2]], **kwargs)
            assert str(info.value).startswith(f"speech[1]: {reason}") or (
                name in ("rate", "fs")  # every utterance is at the wrong rate
                and str(info.value).startswith(f"speech[0]: {reason}")
            ), (name, info.value)
    # a file carries its rate
    path = tmp_path / "8k.wav"
    soundfile.write(path, good[0], 8000, subtype="FLOAT")
    with pytest.raises(ValueError, match="^speech: sample rate 8000 Hz"):
        s2t(str(path))
    with pytest.raises(ValueError, match=r"^speech\[0\]: sample rate 8000 Hz"):
        s2t.batch_decode([path])


def test_padded_batches_are_checked_row_by_row(experiment):
    s2t = _speech2text(experiment, "mb_greedy")
    waves = _waves()
    padded = np.zeros((len(waves), max(LENGTHS)), dtype=np.float32)
    for b, w in enumerate(waves):
        padded[b, : len(w)] = w
    lengths = np.array(LENGTHS)
    bad = padded.copy()
    bad[2, 100] = np.nan
    with pytest.raises(ValueError, match=r"^speech\[2\]: non-finite samples: 1 NaN"):
        s2t.batch_decode(bad, lengths)
    with pytest.raises(ValueError, match=r"^speech\[2\]: non-finite samples: 1 NaN"):
        s2t.decode_batch(torch.from_numpy(bad), torch.from_numpy(lengths))
    with pytest.raises(ValueError, match=r"^speech\[0\]: sample rate 8000 Hz"):
        s2t.decode_batch(torch.from_numpy(padded), torch.from_numpy(lengths), fs=8000)
    # NaN in the padding is not the utterance's: it decodes as the clean batch
    pad_nan = padded.copy()
    pad_nan[2, LENGTHS[2] :] = np.nan
    _same(s2t.batch_decode(pad_nan, lengths), s2t.batch_decode(padded, lengths))
    with pytest.raises(ValueError, match="speech_lengths: 2 lengths"):
        s2t.batch_decode(padded, lengths[:2])


def test_the_same_audio_as_array_pair_file_and_column(experiment, tmp_path):
    s2t = _speech2text(experiment, "mb_greedy")
    wave = _waves()[1]
    path = tmp_path / "16k.wav"
    soundfile.write(path, wave, FS, subtype="FLOAT")
    want = s2t(wave)
    assert want[0][2]  # it emits labels: the comparisons below can fail
    for got in (
        s2t(wave, sample_rate=FS),
        s2t(wave, fs=FS),
        s2t((wave, FS)),
        s2t(soundfile.read(path, dtype="float32")),
        s2t(str(path)),
        s2t(path),
        s2t(wave[:, None]),
        s2t(torch.from_numpy(wave)),
    ):
        _same([got], [want])
    _same(s2t.batch_decode([path, (wave, FS)]), [want, want])


def test_sample_rate_arguments_are_checked(experiment):
    s2t = _speech2text(experiment, "mb_greedy")
    wave = _waves()[0]
    with pytest.raises(ValueError, match="sample_rate must be > 0"):
        s2t(wave, sample_rate=0)
    with pytest.raises(TypeError, match="sample_rate must be an int"):
        s2t(wave, sample_rate="16k")
    with pytest.raises(TypeError, match="fs must be an int"):
        s2t(wave, fs=16000.0)
    with pytest.raises(ValueError, match="sample_rate=16000 and fs=8000 disagree"):
        s2t(wave, sample_rate=16000, fs=8000)
    with pytest.raises(ValueError, match="at 16000 Hz, but sample_rate / fs says 8000"):
        s2t((wave, FS), sample_rate=8000)
    with pytest.raises(TypeError, match="got \\(rate, samples\\)"):
        s2t((FS, wave))
    with pytest.raises(ValueError, match="cannot be read"):
        s2t("no/such/file.wav")
    with pytest.raises(TypeError, match="must be an array of samples"):
        s2t({"speech": wave})


def test_no_untrained_model_by_accident(experiment):
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    config = experiment / "config.yaml"
    with pytest.raises(ValueError, match="asr_model_file is required"):
        MultiblankSpeech2Text(asr_train_config=config, device="cpu")
    with pytest.raises(ValueError, match="give one of them"):
        MultiblankSpeech2Text(
            asr_train_config=config,
            asr_model_file=experiment / "model.pth",
            random_weights=True,
        )
    s2t = MultiblankSpeech2Text(
        asr_train_config=config, random_weights=True, device="cpu"
    )
    trained = torch.load(experiment / "model.pth")
    untrained = s2t.asr_model.state_dict()
    # asked for: the config's model with weights that are not the trained ones
    lin_out = "joint_network.lin_out.weight"
    assert not torch.equal(untrained[lin_out], trained[lin_out])
