"""ONNX export (espnet_multiblank.export): every lattice and encoder, the metadata, the
verification, the refusals and the command line.

Oracles: the PyTorch model itself (``model.encode`` of each utterance alone, at full
context and at chunk sizes; ESPnet's prediction network and joint network), run on
inputs the graphs were not traced with; ``onnx.checker``; the training config for
the metadata (durations, blank ids, token list).
"""

import json

import numpy as np
import onnx
import pytest
import torch
from espnet_experiments import RNN_ENCODER, asr_model_args, dry_run_experiment
from export_cases import make_experiment, waveform

from espnet_multiblank.bin import export_onnx
from espnet_multiblank.export import ExportError, export_model
from espnet_multiblank.export.exporter import load_model
from espnet_multiblank.export.verify import verify_export
from espnet_multiblank.runtime.metadata import GRAPHS, ModelInfo
from espnet_multiblank.runtime.model import ExportedModel

pytestmark = pytest.mark.timeout(900)

#: (lattice, encoder) pairs exported by the tests: every lattice with the streaming
#: encoder, the two offline encoders with big blanks and with TDT durations that
#: are not 0, 1, 2, ...
CASES = [
    ("standard", "chunk_conformer"),
    ("multiblank", "chunk_conformer"),
    ("tdt", "chunk_conformer"),
    ("tdt_gaps", "chunk_conformer"),
    ("multiblank", "conformer"),
    ("tdt_gaps", "conformer"),
    ("multiblank", "transformer"),
    ("tdt_gaps", "transformer"),
]


def _props(path):
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


@pytest.mark.parametrize("lattice,encoder", CASES)
def test_export_writes_checked_graphs_with_the_model_in_the_metadata(
    onnx_export, lattice, encoder
):
    exp, out = onnx_export(lattice, encoder)
    model, _ = load_model(exp / "config.yaml", exp / "model.pth")
    streaming = encoder == "chunk_conformer"
    names = ["encoder", "decoder", "joint"] + (
        ["frontend", "encoder_chunk"] if streaming else []
    )
    assert sorted(p.name for p in out.glob("*.onnx")) == sorted(
        GRAPHS[n] for n in names
    )
    for name in names:
        graph = onnx.load(str(out / GRAPHS[name]))
        onnx.checker.check_model(graph, full_check=True)
    info = ModelInfo.from_props(_props(out / GRAPHS["encoder"]))
    # every graph carries the same metadata
    for name in names:
        assert _props(out / GRAPHS[name]) == _props(out / GRAPHS["encoder"])
    # the metadata says what the training config says, values not counts
    model_conf = __import__("yaml").safe_load((exp / "config.yaml").read_text())[
        "model_conf"
    ]
    assert info.tdt_durations == model_conf.get("transducer_tdt_durations", [])
    assert info.big_blank_durations == model_conf.get(
        "transducer_multi_blank_durations", []
    )
    assert info.lattice == {"tdt_gaps": "tdt"}.get(lattice, lattice)
    assert info.blank_id == model.blank_id
    assert model.token_list[info.blank_id] == "<blank>"
    for i, d in enumerate(info.big_blank_durations):
        assert model.token_list[info.blank_id - 1 - i] == f"<blank{d}>"
    assert (out / "tokens.txt").read_text().split("\n")[:-1] == list(model.token_list)
    assert info.joint_size == model.joint_network.lin_out.out_features
    assert info.encoder_type == encoder and info.streaming == streaming
    assert info.sample_rate == 8000


@pytest.mark.parametrize("lattice,encoder", CASES[1:2] + CASES[5:6] + CASES[6:7])
def test_exported_encoder_equals_the_model_on_new_batches(
    onnx_export, lattice, encoder
):
    """Independent of the exporter's own check: other lengths, a batch with much
    padding, against model.encode of each utterance alone."""
    exp, out = onnx_export(lattice, encoder)
    model, _ = load_model(exp / "config.yaml", exp / "model.pth")
    rt = ExportedModel(out)
    waves = [waveform(n, 10 + i) for i, n in enumerate([1234, 5001, 333, 9999])]
    waves = [w for w in waves if w.size >= rt.info.min_samples]
    L = max(w.size for w in waves) + 500
    speech = np.zeros((len(waves), L), np.float32)
    for b, w in enumerate(waves):
        speech[b, : w.size] = w
    lengths = np.array([w.size for w in waves])
    for chunk in [0, 3] if encoder == "chunk_conformer" else [0]:
        proj, lens = rt.encode(speech, lengths, chunk)
        if chunk:
            model.encoder.set_decoding_chunk(chunk)
        for b, w in enumerate(waves):
            with torch.no_grad():
                enc, elens = model.encode(
                    torch.from_numpy(w)[None], torch.tensor([w.size])
                )
                want = model.joint_network.lin_enc(enc)[0].numpy()
            assert int(lens[b]) == int(elens[0])
            np.testing.assert_allclose(proj[b, : lens[b]], want, atol=1e-4, rtol=0)
        if chunk:
            model.encoder.set_decoding_chunk(0)


def test_min_samples_is_the_shortest_input_with_a_frame(onnx_export):
    exp, out = onnx_export("multiblank", "chunk_conformer")
    rt = ExportedModel(out)
    n = rt.info.min_samples
    _, lens = rt.encode(np.zeros((1, n), np.float32), np.array([n]))
    assert int(lens[0]) == 1
    _, lens = rt.encode(np.zeros((1, n), np.float32), np.array([n - 1]))
    assert int(lens[0]) == 0


def test_verification_refuses_a_wrong_graph(onnx_export, tmp_path):
    """A joint network whose output bias is changed by 1e-3 is caught."""
    exp, out = onnx_export("tdt", "chunk_conformer")
    model, _ = load_model(exp / "config.yaml", exp / "model.pth")
    info = ExportedModel(out).info
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in out.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    verify_export(model, info, bad)  # the copy passes
    graph = onnx.load(str(bad / GRAPHS["joint"]))
    bias = max(
        (i for i in graph.graph.initializer if len(i.dims) == 1),
        key=lambda i: i.dims[0],
    )
    values = onnx.numpy_helper.to_array(bias).copy()
    values[3] += 1e-3
    bias.CopyFrom(onnx.numpy_helper.from_array(values, bias.name))
    onnx.save(graph, str(bad / GRAPHS["joint"]))
    with pytest.raises(ExportError, match="joint.onnx"):
        verify_export(model, info, bad)


def test_an_rnn_encoder_is_refused_with_its_name(tmp_path):
    exp = dry_run_experiment(
        tmp_path / "rnn",
        asr_model_args(
            "multiblank_espnet",
            "{transducer_multi_blank_durations: [2]}",
            encoder=RNN_ENCODER,
        ),
    )
    with pytest.raises(ExportError, match="encoder RNNEncoder cannot be exported"):
        export_model(exp / "config.yaml", exp / "model.pth", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_without_a_transducer_is_refused(tmp_path):
    exp = dry_run_experiment(
        tmp_path / "ctc",
        [
            "--model",
            "espnet",
            "--model_conf",
            "{ctc_weight: 1.0}",
            "--token_type",
            "char",
            "--frontend_conf",
            "{n_fft: 256, hop_length: 128, n_mels: 8}",
            "--encoder",
            "transformer",
            "--encoder_conf",
            "{output_size: 16, attention_heads: 2, linear_units: 16, num_blocks: 1}",
            "--decoder",
            "transformer",
            "--decoder_conf",
            "{attention_heads: 2, linear_units: 16, num_blocks: 1}",
        ],
    )
    with pytest.raises(ExportError, match="only transducer models"):
        export_model(exp / "config.yaml", exp / "model.pth", tmp_path / "out")


def test_missing_weights_and_an_existing_output_are_refused(onnx_export, tmp_path):
    exp, out = onnx_export("multiblank", "chunk_conformer")
    with pytest.raises(ExportError, match="asr_model_file is required"):
        export_model(exp / "config.yaml", None, tmp_path / "x")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_model(exp / "config.yaml", exp / "model.pth", out)


def test_command_line_exports_and_reports_refusals(onnx_export, tmp_path, capsys):
    exp, _ = onnx_export("standard", "chunk_conformer")
    out = tmp_path / "cli"
    args = ["--asr_train_config", str(exp / "config.yaml")]
    args += ["--asr_model_file", str(exp / "model.pth"), "--output_dir", str(out)]
    assert export_onnx.main(args) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(line.split(": ", 1)[1])["lattice"] == "standard"
    assert export_onnx.main(args) == 2  # exists
    assert "overwrite" in capsys.readouterr().err
    assert export_onnx.main(args + ["--overwrite"]) == 0


def test_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        export_onnx.main(["--help"])
    text = capsys.readouterr().out
    for option in ("--asr_train_config", "--asr_model_file", "--output_dir"):
        assert option in text
    assert "(default: true)" in text


def test_gru_two_layers_and_utterance_mvn_export(tmp_path):
    exp = make_experiment(
        tmp_path / "gru",
        "standard",
        "conformer",
        normalize="utterance_mvn",
        rnn_type="gru",
        num_layers=2,
    )
    info = export_model(exp / "config.yaml", exp / "model.pth", tmp_path / "out")
    assert info.decoder_rnn_type == "gru" and info.decoder_layers == 2
