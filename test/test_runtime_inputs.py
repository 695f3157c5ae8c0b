"""The runtime's readers and checks on their own: wav files of every PCM width, the
metadata's refusals, wav.scp lines. Oracles: soundfile's reading of the same files
(ESPnet's loader), and the messages' contents."""

import dataclasses
import json

import numpy as np
import pytest
import soundfile

from espnet_multiblank.lattice import MultiblankLattice, TDTLattice
from espnet_multiblank.runtime.audio import check_samples, read_wav
from espnet_multiblank.runtime.decode import read_scp
from espnet_multiblank.runtime.metadata import FORMAT_VERSION, ModelInfo, lattice_keys


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT"])
@pytest.mark.parametrize("channels", [1, 2])
def test_read_wav_equals_soundfile(tmp_path, subtype, channels):
    rng = np.random.default_rng(0)
    x = (0.5 * rng.uniform(-1, 1, (1000, channels))).astype(np.float32)
    path = tmp_path / "x.wav"
    soundfile.write(str(path), x if channels > 1 else x[:, 0], 16000, subtype=subtype)
    got, rate = read_wav(path)
    want, want_rate = soundfile.read(str(path), dtype="float32")
    assert rate == want_rate == 16000
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-7)


def test_check_samples_accepts_one_channel_of_two_dimensions():
    x = np.linspace(-0.5, 0.5, 500, dtype=np.float64)
    for shaped in (x[:, None], x[None, :], list(x)):
        out = check_samples(shaped, None, 8000, 10)
        assert out.dtype == np.float32 and out.shape == (500,)
    with pytest.raises(TypeError, match="sample_rate must be an int"):
        check_samples(x, 8000.0, 8000, 10)


def _props(**change):
    info = ModelInfo(
        lattice="tdt",
        blank_id=0,
        big_blank_durations=[],
        tdt_durations=[0, 2, 4],
        vocab_size=5,
        joint_size=8,
        token_type="word",
        sample_rate=8000,
        feature_dim=23,
        framing={"kind": "stft", "length": 256, "shift": 80, "center": True},
        subsampling=4,
        receptive_field=7,
        min_samples=480,
        encoder_type="conformer",
        encoder_size=96,
        joint_space=160,
        streaming=False,
        decoder_rnn_type="lstm",
        decoder_layers=1,
        decoder_hidden=160,
        version="0.1.0",
    )
    props = info.to_props()
    props.update(change)
    return props


def test_metadata_round_trip_and_refusals():
    info = ModelInfo.from_props(_props())
    assert info.tdt_durations == [0, 2, 4] and info.framing_object().center
    assert info.lattice_object().durations == (0, 2, 4)
    with pytest.raises(ValueError, match="not an espnet-multiblank export"):
        ModelInfo.from_props(_props(format="nemo"), "m.onnx")
    with pytest.raises(ValueError, match="upgrade espnet-multiblank"):
        ModelInfo.from_props(_props(format_version=str(FORMAT_VERSION + 1)))
    props = _props()
    del props["blank_id"]
    with pytest.raises(ValueError, match="'blank_id' is missing"):
        ModelInfo.from_props(props)
    with pytest.raises(ValueError, match="framing kind"):
        ModelInfo.from_props(
            _props(framing=json.dumps({"kind": "mfcc", "length": 1, "shift": 1}))
        )
    # a joint size that does not fit the durations
    with pytest.raises(ValueError, match="joint_size"):
        ModelInfo.from_props(_props(joint_size=json.dumps(3)))


@pytest.mark.parametrize(
    "lattice, kind",
    [
        (MultiblankLattice(0), "standard"),
        (MultiblankLattice(4, (2, 4, 8)), "multiblank"),
        (TDTLattice(0, (0, 2, 4)), "tdt"),
    ],
)
def test_lattice_keys_give_the_lattice_back(lattice, kind):
    keys = lattice_keys(lattice)
    assert keys["lattice"] == kind
    info = dataclasses.replace(ModelInfo.from_props(_props()), **keys)
    assert ModelInfo.from_props(info.to_props()).lattice_object() == lattice


def test_read_scp_refuses_pipes_and_bad_lines(tmp_path):
    scp = tmp_path / "wav.scp"
    scp.write_text("a /x/a.wav\n\nb /x/b.wav\n")
    assert read_scp(scp) == [("a", "/x/a.wav"), ("b", "/x/b.wav")]
    scp.write_text("a sox x.wav -t wav - |\n")
    with pytest.raises(ValueError, match="no pipes"):
        read_scp(scp)
    scp.write_text("lonely\n")
    with pytest.raises(ValueError, match="expected '<key> <wav file>'"):
        read_scp(scp)
