"""``export_onnx --format sherpa_onnx`` decoded by the real sherpa-onnx wheel.

Oracles: the plug-in's own greedy search on the PyTorch model (standard RNN-T:
sherpa-onnx's rule is the arg-max with at most 10 labels per frame, the plug-in's
``mb_greedy`` with ``blank_decision: symbol, max_sym_per_frame: 10``), and for a TDT
the runtime's ``nemo`` rule on the native export of the same model (sherpa-onnx's
TDT rule: the token's and the duration's arg-max on their own); the tokens and
their times must be equal. The refusals: what sherpa-onnx would decode wrongly.
"""

import json

import numpy as np
import onnx
import pytest
import torch
from export_cases import make_experiment, waveform

from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text
from espnet_multiblank.export import ExportError, export_model
from espnet_multiblank.runtime import Recognizer

sherpa_onnx = pytest.importorskip("sherpa_onnx")
pytestmark = pytest.mark.timeout(900)

N_MELS = 10  # export_cases' feature dimension


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{lattice: (experiment, sherpa export, native export)}."""
    root = tmp_path_factory.mktemp("sherpa")
    out = {}
    for lattice, bias in (("standard", 0.5), ("tdt", 0.9)):
        exp = make_experiment(
            root / lattice,
            lattice,
            "chunk_conformer",
            blank_bias=bias,
            frontend="sherpa",
        )
        sherpa = root / f"{lattice}_sherpa"
        native = root / f"{lattice}_native"
        export_model(
            exp / "config.yaml", exp / "model.pth", sherpa, format="sherpa_onnx"
        )
        export_model(exp / "config.yaml", exp / "model.pth", native)
        out[lattice] = (exp, sherpa, native)
    return out


def _recognizer(d):
    return sherpa_onnx.OfflineRecognizer.from_transducer(
        encoder=str(d / "encoder.onnx"),
        decoder=str(d / "decoder.onnx"),
        joiner=str(d / "joiner.onnx"),
        tokens=str(d / "tokens.txt"),
        num_threads=1,
        sample_rate=8000,
        feature_dim=N_MELS,
        decoding_method="greedy_search",
        model_type="nemo_transducer",
    )


def _sherpa_ids(d, tokens):
    """The model's token ids of sherpa-onnx's result tokens (tokens.txt maps them
    back; sherpa-onnx shows a leading ``▁`` as a space)."""
    table = {}
    for line in (d / "tokens.txt").read_text(encoding="utf-8").splitlines():
        tok, i = line.rsplit(" ", 1)
        table[tok.replace("\u2581", " ")] = int(i)
    return [table[t] for t in tokens]


def _decode(rec, w):
    stream = rec.create_stream()
    stream.accept_waveform(8000, w)
    rec.decode_stream(stream)
    return stream.result


def _waves():
    return [waveform(n, 30 + i) for i, n in enumerate(range(2500, 16000, 1500))]


def test_layout_tokens_and_metadata(models):
    for lattice, (exp, d, _) in models.items():
        lines = (d / "tokens.txt").read_text(encoding="utf-8").splitlines()
        assert lines[-1] == f"<blk> {len(lines) - 1}"
        props = {
            p.key: p.value for p in onnx.load(str(d / "encoder.onnx")).metadata_props
        }
        assert int(props["vocab_size"]) == len(lines) - 1  # NeMo: without the blank
        assert ("tdt" in props["url"]) == (lattice == "tdt")
        assert props["normalize_type"] == "" and props["feat_dim"] == str(N_MELS)
        assert props["subsampling_factor"] == "4"
        assert int(props["pred_rnn_layers"]) == 1 and int(props["pred_hidden"]) == 16


def test_standard_model_decodes_as_the_plugins_greedy_search(models):
    exp, d, native = models["standard"]
    rec = _recognizer(d)
    s2t = MultiblankSpeech2Text(
        asr_train_config=str(exp / "config.yaml"),
        asr_model_file=str(exp / "model.pth"),
        device="cpu",
        transducer_conf=dict(
            search_type="mb_greedy", blank_decision="symbol", max_sym_per_frame=10
        ),
    )
    runtime = Recognizer(native, blank_decision="nemo")
    order = _order(d, exp)
    emitted = 0
    for w in _waves():
        got = _decode(rec, w)
        ids = [order[i] for i in _sherpa_ids(d, got.tokens)]
        _, _, want, hyp = s2t(torch.from_numpy(w))[0]
        assert ids == want
        assert runtime.recognize(w).token_ids == want
        # sherpa-onnx's times: 10 ms x subsampling per encoder frame
        assert list(got.timestamps) == pytest.approx([0.04 * t[0] for t in hyp.timing])
        emitted += len(ids)
    assert emitted > 5


def test_tdt_model_decodes_as_the_runtimes_nemo_rule(models):
    exp, d, native = models["tdt"]
    rec = _recognizer(d)
    runtime = Recognizer(native, blank_decision="nemo")
    order = _order(d, exp)
    emitted = blanks = 0
    for w in _waves():
        got = _decode(rec, w)
        ids = [order[i] for i in _sherpa_ids(d, got.tokens)]
        want = runtime.recognize(w)
        assert ids == want.token_ids
        assert list(got.timestamps) == pytest.approx(want.timestamps)
        emitted += len(ids)
        blanks += want.num_frames > len(ids)
    assert emitted > 5 and blanks


def _order(d, exp):
    """sherpa-onnx id -> the model's id (tokens.txt's order)."""
    model_tokens = (exp / "tokens.txt").read_text().split()
    config_tokens = __import__("yaml").safe_load((exp / "config.yaml").read_text())[
        "token_list"
    ]
    assert model_tokens == config_tokens  # no big blanks were inserted
    blank = config_tokens.index("<blank>")
    return [k for k in range(len(config_tokens)) if k != blank] + [blank]


@pytest.mark.parametrize(
    "lattice,frontend,message",
    [
        ("multiblank", "sherpa", "no big blanks"),
        ("tdt_gaps", "sherpa", "index as the frames"),
        ("standard", "default", "frontend: kaldi_fbank"),
        ("standard", "kaldi_fbank", "frame_length"),
    ],
)
def test_what_sherpa_onnx_would_decode_wrongly_is_refused(
    tmp_path, lattice, frontend, message
):
    exp = make_experiment(tmp_path / "m", lattice, "conformer", frontend=frontend)
    with pytest.raises(ExportError, match=message) as e:
        export_model(
            exp / "config.yaml", exp / "model.pth", tmp_path / "o", format="sherpa_onnx"
        )
    assert "espnet_multiblank.runtime" in str(e.value)
    assert not (tmp_path / "o").exists()


def test_the_cli_writes_sherpa_onnx_format(models, tmp_path, capsys):
    from espnet_multiblank.bin import export_onnx

    exp = models["tdt"][0]
    out = tmp_path / "cli"
    args = ["--asr_train_config", str(exp / "config.yaml")]
    args += ["--asr_model_file", str(exp / "model.pth"), "--output_dir", str(out)]
    assert export_onnx.main(args + ["--format", "sherpa_onnx"]) == 0
    assert json.loads(capsys.readouterr().out.split(": ", 1)[1])["lattice"] == "tdt"
    assert sorted(p.name for p in out.iterdir()) == [
        "decoder.onnx",
        "encoder.onnx",
        "joiner.onnx",
        "tokens.txt",
    ]
    np.testing.assert_array_equal(
        _decode(_recognizer(out), _waves()[0]).tokens,
        _decode(_recognizer(models["tdt"][1]), _waves()[0]).tokens,
    )
