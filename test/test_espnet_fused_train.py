"""``model_conf.transducer_fused_joint: true`` through ESPnet's trainer (the plug-in's
``asr_train`` entry point, CPU): the same seed and data give the dense model's
training, epoch by epoch, and a checkpoint trained fused decodes with the dense
model's inference to the same hypotheses."""

import numpy as np
import pytest
import torch
import yaml
from test_espnet_train import N_EPOCHS, TEXTS, _common, _data  # noqa: I100
from test_espnet_train import _train_config as _mb_train_config
from test_tdt_train import _train_config as _tdt_train_config

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.bin import asr_train

#: per kind: the config (besides the key), and what it exercises beyond the losses:
#: ctc_weight mixing, validation CER/WER, accum_grad (1 / accum_grad reaches the
#: loss as its incoming gradient), FastEmit, clamp, TDT omega (drawn in training)
KINDS = {
    "multiblank": lambda: _mb_train_config(
        ctc_weight=0.3,
        report_cer=True,
        report_wer=True,
        transducer_fastemit_lambda=0.1,
        transducer_clamp=0.2,
    ),
    "tdt": lambda: _tdt_train_config(
        ctc_weight=0.3, report_cer=True, report_wer=True, transducer_tdt_omega=0.3
    ),
}

#: the stats compared epoch by epoch (train and valid)
STATS = ("loss", "loss_transducer", "loss_ctc", "transducer_no_path_fraction")


def _stats_dir(root):
    """ESPnet's --collect_stats once for both trainings (it builds the dense model)."""
    asr_train.main(
        _common(root)
        + ["--collect_stats", "true", "--output_dir", f"{root}/stats"]
        + ["--train_shape_file", f"{root}/wav.scp"]
        + ["--valid_shape_file", f"{root}/wav.scp"]
    )


def _train(root, name, config):
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    asr_train.main(
        _common(root)
        + ["--output_dir", f"{root}/{name}"]
        + ["--train_shape_file", f"{root}/stats/train/speech_shape"]
        + ["--valid_shape_file", f"{root}/stats/valid/speech_shape"]
    )
    return root / name


@pytest.fixture(scope="module", params=list(KINDS))
def trained(request, tmp_path_factory):
    """(kind, dense experiment, fused experiment): 4 batches of 2 utterances, 2
    accumulated per optimizer step (2 steps per epoch)."""
    root = tmp_path_factory.mktemp(f"fused_{request.param}")
    _data(root)
    config = KINDS[request.param]()
    # Some gradients are zero analytically and rounding noise in practice (the key
    # bias of self-attention, the depthwise convolution's bias before batch norm):
    # Adam with its default eps 1e-8 makes lr-sized steps of the noise's sign out of
    # them, in any two runs whose float rounding differs (the dense path with other
    # BLAS threads too). A larger eps keeps those steps small and leaves the others.
    config.update(batch_size=2, accum_grad=2, optim_conf=dict(lr=0.005, eps=1e-4))
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    _stats_dir(root)
    dense = _train(root, "dense", config)
    config["model_conf"]["transducer_fused_joint"] = True
    fused = _train(root, "fused", config)
    return request.param, dense, fused


def _reporter_stats(exp):
    ckpt = torch.load(exp / "checkpoint.pth", map_location="cpu", weights_only=False)
    return ckpt["reporter"]["stats"]


@pytest.mark.slow
def test_same_losses_epoch_by_epoch(trained):
    """ESPnet's logged train and valid stats of every epoch agree to float32
    rounding, and so do the final parameters (but for the directions the loss does
    not see, see ``trained``)."""
    kind, dense, fused = trained
    want, got = _reporter_stats(dense), _reporter_stats(fused)
    assert list(got) == list(want) == list(range(1, N_EPOCHS + 1))
    for epoch in want:
        for phase in ("train", "valid"):
            for name in STATS + (("cer_transducer",) if phase == "valid" else ()):
                w, g = want[epoch][phase][name], got[epoch][phase][name]
                assert np.isfinite(w), (epoch, phase, name)
                assert g == pytest.approx(w, rel=1e-5, abs=1e-7), (epoch, phase, name)
    # the case trains, so that the comparison means something (validation: a TDT's
    # training losses mix in omega's RNN-T steps)
    valid = [want[e]["valid"]["loss_transducer"] for e in want]
    assert valid[-1] < 0.95 * valid[0], valid
    saved = yaml.safe_load((fused / "config.yaml").read_text())
    assert saved["model_conf"]["transducer_fused_joint"] is True
    a = torch.load(dense / f"{N_EPOCHS}epoch.pth", map_location="cpu")
    b = torch.load(fused / f"{N_EPOCHS}epoch.pth", map_location="cpu")
    assert list(a) == list(b)
    for name, value in a.items():
        if value.is_floating_point():
            torch.testing.assert_close(b[name], value, rtol=1e-4, atol=2e-4, msg=name)


def _decode(config, model_file, wavs):
    """N-best hypotheses (text, score) of every wav with the plug-in's inference
    (beam search over the joint network)."""
    import soundfile

    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    s2t = MultiblankSpeech2Text(
        asr_train_config=config,
        asr_model_file=model_file,
        transducer_conf={"search_type": "default", "beam_size": 3},
        nbest=3,
    )
    out = []
    for wav in wavs:
        speech, _ = soundfile.read(wav)
        results = s2t(torch.tensor(speech, dtype=torch.float32))
        out.append([(text, float(hyp.score)) for text, _, _, hyp in results])
    return out


@pytest.mark.slow
def test_fused_checkpoint_decodes_as_dense(trained, tmp_path):
    """The fused experiment's checkpoint loaded with its own config and with the
    dense config (the key off: the same state dict, strict): identical n-best
    lists; and the dense experiment's checkpoint gives the same texts."""
    kind, dense, fused = trained
    wavs = sorted(fused.parent.glob("utt*.wav"))
    assert len(wavs) == len(TEXTS)
    model_file = fused / f"{N_EPOCHS}epoch.pth"
    config = yaml.safe_load((fused / "config.yaml").read_text())
    config["model_conf"]["transducer_fused_joint"] = False
    (tmp_path / "dense.yaml").write_text(yaml.safe_dump(config))
    as_fused = _decode(fused / "config.yaml", model_file, wavs)
    as_dense = _decode(tmp_path / "dense.yaml", model_file, wavs)
    assert as_dense == as_fused
    assert any(text for nbest in as_fused for text, _ in nbest)  # not all empty
    trained_dense = _decode(dense / "config.yaml", dense / f"{N_EPOCHS}epoch.pth", wavs)
    for got, want in zip(as_fused, trained_dense):
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-3)
