"""Batched decoding through ``espnet_multiblank.bin.asr_inference`` gives the
hypotheses of ``--batch_size 1``, in input order, with the encoder run on the padded
batch when it is batch-exact and one utterance at a time (said once) when not."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from espnet_experiments import RNN_ENCODER as RNN
from espnet_experiments import asr_model_args, dry_run_experiment, inference_args

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

espnet_multiblank.register()

from espnet2.asr.espnet_model import ESPnetASRModel  # noqa: E402

import espnet_multiblank.espnet.inference.speech2text as plugin_s2t  # noqa: E402
from espnet_multiblank.espnet.batch_exact.exact_encoding import (  # noqa: E402
    BatchExactness,
)
from espnet_multiblank.espnet.model import asr_model as plugin_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKENS = ["<blank>", "<unk>", "a", "b", "c", "<space>", "<sos/eos>"]
FS = 16000
# samples: random lengths, and one utterance (u04) too short for conv2d subsampling
# (3 STFT frames), which is reported in failed_utterances and not written (ESPnet
# writes a placeholder hypothesis for it)
LENGTHS = [9100, 4300, 12800, 6100, 300, 15000, 7700, 5200, 10400, 8000, 3300]
CONFORMER = [
    "--encoder",
    "conformer",
    "--encoder_conf",
    "{output_size: 16, attention_heads: 2, linear_units: 24, num_blocks: 2, "
    "input_layer: conv2d, rel_pos_type: latest, pos_enc_layer_type: rel_pos, "
    "selfattention_layer_type: rel_selfattn, macaron_style: true, "
    "use_cnn_module: true, cnn_module_kernel: 7}",
]


def make_experiment(root: Path, encoder_args) -> Path:
    """``model: multiblank_espnet`` (big blanks 2, 4), random weights; the joint
    network's label logits are raised so that hypotheses are long and depend on the
    encoder output."""

    def edit(model):
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.5)
                m.running_var.uniform_(0.5, 2.0)
        out = model.joint_network.lin_out
        out.weight.mul_(4.0)  # sharper, encoder-dependent decisions

    args = asr_model_args(
        "multiblank_espnet",
        "{transducer_multi_blank_durations: [2, 4], report_cer: false, "
        "report_wer: false}",
        encoder_args,
        "{n_fft: 512, win_length: 400, hop_length: 160, n_mels: 20}",
    ) + ["--normalize", "utterance_mvn"]
    return dry_run_experiment(root / "exp", args, edit, tokens=TOKENS)


def make_data(root: Path) -> Path:
    import soundfile

    rng = np.random.default_rng(0)
    lines = []
    for i, n in enumerate(LENGTHS):
        t = np.arange(n) / FS
        wav = 0.1 * np.sin(2 * np.pi * (150 + 90 * i) * t * (1 + t))
        wav += 0.05 * rng.standard_normal(n)
        path = root / f"u{i:02d}.wav"
        soundfile.write(path, wav.astype(np.float32), FS)
        lines.append(f"u{i:02d} {path}")
    scp = root / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    return scp


def decode(exp: Path, scp: Path, out: Path, batch_size: int) -> dict:
    """Run the CLI in-process; returns {file: [lines]} of 1best_recog plus stats."""

    from espnet_multiblank.bin.asr_inference import get_parser, inference

    args = get_parser().parse_args(
        [
            "--config",
            str(REPO / "conf" / "decode" / "mb_greedy.yaml"),
            # several labels per frame (the config allows one): the untrained model
            # emits many, the harder case for batched decoding
            "--transducer_conf",
            "search_type=mb_greedy,max_sym_per_frame=10,blank_decision=total",
            *inference_args(exp, scp, out, "--batch_size", str(batch_size)),
        ]
    )
    kwargs = vars(args)
    kwargs.pop("config", None)
    torch.set_num_threads(1)
    stats = inference(**kwargs)
    best = out / "1best_recog"
    lines = {n: (best / n).read_text().splitlines() for n in ("text", "token_int")}
    lines["score"] = [
        line.split() for line in (best / "score").read_text().splitlines()
    ]
    failed_file = out / "failed_utterances"
    failed = failed_file.read_text().splitlines() if failed_file.exists() else []
    return {**lines, "stats": stats, "failed": failed}


def assert_same_hypotheses(a: dict, b: dict) -> None:
    assert a["token_int"] == b["token_int"]
    assert a["text"] == b["text"]
    assert a["failed"] == b["failed"]
    assert [k for k, _ in a["score"]] == [k for k, _ in b["score"]]
    for (_, x), (_, y) in zip(a["score"], b["score"]):
        assert float(x) == pytest.approx(float(y), rel=1e-5, abs=1e-4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact_decode")
    return root, make_data(root)


@pytest.fixture(scope="module")
def conformer_exp(data):
    root = data[0] / "conformer"
    root.mkdir()
    return make_experiment(root, CONFORMER)


@pytest.fixture(scope="module")
def batch1(data, conformer_exp):
    return decode(conformer_exp, data[1], data[0] / "conformer_b1", 1)


def test_batch_8_equals_batch_1_in_input_order(
    data, conformer_exp, batch1, caplog, monkeypatch
):
    keys = [f"u{i:02d}" for i in range(len(LENGTHS)) if i != 4]
    assert [line.split()[0] for line in batch1["token_int"]] == keys
    assert batch1["failed"] == [
        "u04 too short: 300 samples (0.019 s), the encoder needs at least 960 "
        "samples"
    ]
    assert batch1["stats"]["num_failed"] == 1
    labels = sum(len(line.split()) - 1 for line in batch1["token_int"])
    assert labels > 5 * len(LENGTHS)  # real hypotheses, not all blank
    sizes = []
    encode = ESPnetASRModel.encode

    def spy(self, speech, speech_lengths):
        sizes.append(speech.size(0))
        return encode(self, speech, speech_lengths)

    monkeypatch.setattr(ESPnetASRModel, "encode", spy)
    with caplog.at_level(logging.WARNING):
        batch8 = decode(conformer_exp, data[1], data[0] / "conformer_b8", 8)
    assert batch8["stats"]["batch_size"] == 8
    assert max(sizes) == 8  # the encoder ran on padded batches
    assert "one utterance at a time" not in caplog.text
    assert_same_hypotheses(batch8, batch1)
    assert batch8["stats"]["total_frames"] == batch1["stats"]["total_frames"]


def test_batched_espnet_encoder_would_change_the_hypotheses(
    data, conformer_exp, batch1, monkeypatch
):
    """Control: the same batched decoding with ESPnet's encoder as it is."""

    def claim_exact(model):
        setattr(model, "batch_exact_encoding", BatchExactness(True))
        return model.batch_exact_encoding

    monkeypatch.setattr(plugin_model, "make_batch_exact", claim_exact)
    monkeypatch.setattr(plugin_s2t, "make_batch_exact", claim_exact)
    batch8 = decode(conformer_exp, data[1], data[0] / "espnet_b8", 8)
    assert batch8["token_int"] != batch1["token_int"]


def test_encoder_that_cannot_be_exact_falls_back_and_says_so_once(data, caplog):
    root = data[0] / "rnn"
    root.mkdir()
    exp = make_experiment(root, RNN)
    b1 = decode(exp, data[1], root / "b1", 1)
    with caplog.at_level(logging.WARNING):
        b8 = decode(exp, data[1], root / "b8", 8)
    assert caplog.text.count("batched decoding encodes one utterance at a time") == 1
    assert "RNNEncoder" in caplog.text
    assert_same_hypotheses(b8, b1)
