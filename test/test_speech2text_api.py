"""The plug-in's ``Speech2Text`` as a Python user calls it, in ESPnet 202511 and
202611: one utterance, a list of utterances (202611's ``__call__`` takes one),
``batch_decode`` on a list or a padded array, and the ``batch_size`` argument that
ESPnet 202611's ``Speech2Text`` takes (and refuses for transducers at > 1)."""

import numpy as np
import pytest
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
    with pytest.raises(ValueError, match="speech: .*samples"):
        s2t.batch_decode(waves)
