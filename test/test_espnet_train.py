"""End to end through ESPnet: --collect_stats and training on CPU with
``python -m espnet_multiblank.bin.asr_train``'s ``main``, then a reload with
``ASRTask.build_model_from_file`` in a fresh interpreter (registered by the ``.pth``
start-up hook only)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import soundfile
import torch
import yaml
from espnet_cases import TOKENS, loss_backend, tiny_config

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.bin import asr_train
from espnet_multiblank.espnet import autoregister

N_EPOCHS = 4
TEXTS = ["ab c", "ba", "cab", "c a", "abc", "b", "ca b", "aa"]


def _data(root, short=()):
    """TEXTS as utterances of 3200, 3600 or 4000 samples; ``short`` adds utterances
    of 300 samples (3 STFT frames: too short for conv2d subsampling, 0 encoder
    frames) with those texts."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "wav.scp", "w") as scp, open(root / "text", "w") as txt:
        for i, text in enumerate(list(TEXTS) + list(short)):
            key = f"utt{i}"
            path = root / f"{key}.wav"
            n = 3200 + 400 * (i % 3) if i < len(TEXTS) else 300
            soundfile.write(path, 0.1 * rng.standard_normal(n), 16000, subtype="PCM_16")
            scp.write(f"{key} {path}\n")
            txt.write(f"{key} {text}\n")
    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")


def _common(root):
    data = [
        "--train_data_path_and_name_and_type",
        f"{root}/wav.scp,speech,sound",
        "--train_data_path_and_name_and_type",
        f"{root}/text,text,text",
        "--valid_data_path_and_name_and_type",
        f"{root}/wav.scp,speech,sound",
        "--valid_data_path_and_name_and_type",
        f"{root}/text,text,text",
    ]
    return data + [
        "--config",
        f"{root}/train.yaml",
        "--token_list",
        f"{root}/tokens.txt",
        "--token_type",
        "char",
        "--use_preprocessor",
        "true",
        "--ngpu",
        "0",
        "--num_workers",
        "0",
        "--seed",
        "0",
    ]


def _train_config(**model_conf):
    config = tiny_config(**model_conf)
    config.update(
        optim="adam",
        optim_conf=dict(lr=0.005),
        batch_type="unsorted",
        batch_size=8,
        max_epoch=N_EPOCHS,
        num_att_plot=0,
        keep_nbest_models=1,
        use_tensorboard=False,
        best_model_criterion=[["valid", "loss", "min"]],
    )
    return config


def _collect_stats_and_train(root, main=asr_train.main):
    main(
        _common(root)
        + ["--collect_stats", "true", "--output_dir", f"{root}/stats"]
        + ["--train_shape_file", f"{root}/wav.scp"]
        + ["--valid_shape_file", f"{root}/wav.scp"]
    )
    main(
        _common(root)
        + ["--output_dir", f"{root}/exp"]
        + ["--train_shape_file", f"{root}/stats/train/speech_shape"]
        + ["--valid_shape_file", f"{root}/stats/valid/speech_shape"]
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("mb_train")
    _data(root)
    config = _train_config(report_cer=True, report_wer=True, ctc_weight=0.3)
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    _collect_stats_and_train(root)
    return root


@pytest.mark.slow
def test_collect_stats(trained):
    shapes = (trained / "stats/train/speech_shape").read_text().split("\n")
    assert len([s for s in shapes if s]) == len(TEXTS)
    assert (trained / "stats/train/feats_stats.npz").exists()


@pytest.mark.slow
def test_training_loss_finite_and_decreasing(trained):
    ckpt = torch.load(
        trained / "exp/checkpoint.pth", map_location="cpu", weights_only=False
    )
    stats = ckpt["reporter"]["stats"]
    train = [
        float(stats[e]["train"]["loss_transducer"]) for e in range(1, N_EPOCHS + 1)
    ]
    valid = [float(stats[e]["valid"]["loss"]) for e in range(1, N_EPOCHS + 1)]
    assert all(np.isfinite(train)) and all(np.isfinite(valid)), (train, valid)
    # one step per epoch on the same 8 utterances: a repeated batch
    assert all(b < a for a, b in zip(train, train[1:])), train
    assert train[-1] < 0.95 * train[0], train
    assert valid[-1] < valid[0], valid
    assert stats[N_EPOCHS]["valid"]["cer_transducer"] is not None
    saved = yaml.safe_load((trained / "exp/config.yaml").read_text())
    assert saved["model"] == "multiblank_espnet"
    assert saved["token_list"][:4] == ["<blank8>", "<blank4>", "<blank2>", "<blank>"]


RELOAD = textwrap.dedent("""
    import json, site, sys
    site.addsitedir(sys.argv[1])        # processes the .pth file: the start-up hook
    import torch
    from espnet2.tasks.asr import ASRTask   # stock ESPnet import: the hook registers
    model, args = ASRTask.build_model_from_file(sys.argv[2], sys.argv[3], "cpu")
    model.eval()
    batch = torch.load(sys.argv[4])
    with torch.no_grad():
        loss, stats, _ = model(**batch)
    print(json.dumps(dict(
        cls=type(model).__name__, blank_id=model.blank_id,
        decoder_blank_id=model.decoder.blank_id,
        durations=list(model.big_blank_durations), big=list(model.big_blank_ids),
        loss=float(loss), ctc_blank=model.ctc.ctc_loss.blank,
    )))
    """)


@pytest.mark.slow
def test_reload_in_fresh_process(trained, tmp_path):
    from espnet2.tasks.asr import ASRTask

    exp = trained / "exp"
    model_file = exp / f"{N_EPOCHS}epoch.pth"
    model, _ = ASRTask.build_model_from_file(exp / "config.yaml", model_file, "cpu")
    model.eval()
    ids = {t: i for i, t in enumerate(model.token_list)}
    batch = dict(
        speech=torch.randn(2, 3600, generator=torch.Generator().manual_seed(5)),
        speech_lengths=torch.tensor([3600, 3000]),
        text=torch.tensor([[ids["a"], ids["b"]], [ids["c"], -1]]),
        text_lengths=torch.tensor([2, 1]),
    )
    torch.save(batch, tmp_path / "batch.pt")
    with torch.no_grad():
        want, _, _ = model(**{k: v.clone() for k, v in batch.items()})

    site_dir = tmp_path / "site"
    autoregister.write(str(site_dir))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop(autoregister_env(), None)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            RELOAD,
            str(site_dir),
            str(exp / "config.yaml"),
            str(model_file),
            str(tmp_path / "batch.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cls"] == "MultiblankESPnetASRModel"
    assert (got["blank_id"], got["decoder_blank_id"], got["ctc_blank"]) == (3, 3, 3)
    assert got["durations"] == [2, 4, 8] and got["big"] == [2, 1, 0]
    assert got["loss"] == pytest.approx(float(want), rel=1e-5)


def autoregister_env() -> str:
    from espnet_multiblank.espnet._hook import ENV_DISABLE

    return ENV_DISABLE


def test_backend_is_known():
    assert loss_backend() in ("auto", "torch")


def _stats(root):
    ckpt = torch.load(
        root / "exp/checkpoint.pth", map_location="cpu", weights_only=False
    )
    return ckpt["reporter"]["stats"]


@pytest.mark.slow
def test_standard_model_with_an_impossible_utterance_trains(tmp_path):
    """A standard transducer (labels cover no frame: only an utterance without
    encoder frames is impossible) with one such utterance among 9: finite losses,
    its share reported, a best model with a finite loss."""
    _data(tmp_path, short=["ab"])
    config = _train_config(durations=(), transducer_multi_blank_sigma=0.0)
    config["batch_size"] = 9
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    _collect_stats_and_train(tmp_path)
    stats = _stats(tmp_path)
    valid = []
    for e in range(1, N_EPOCHS + 1):
        for phase in ("train", "valid"):
            assert np.isfinite(stats[e][phase]["loss"]), (e, phase, stats[e][phase])
            assert stats[e][phase]["transducer_no_path_fraction"] == pytest.approx(
                1 / 9
            )
        valid.append(stats[e]["valid"]["loss"])
    best = (tmp_path / "exp/valid.loss.best.pth").resolve().name
    assert best == f"{int(np.argmin(valid)) + 1}epoch.pth"


def test_nan_criterion_stops_stock_training(tmp_path):
    """A valid loss that is NaN in every epoch (CTC without zero_infinity: the
    utterance without frames makes each batch's loss infinite, and ESPnet averages
    finite batches only) through ESPnet's own ASRTask.main (the stock
    espnet2.bin.asr_train; the plug-in registered as the start-up hook does): the
    guard stops the run at epoch 1 instead of linking the NaN epoch as the best."""
    from espnet2.tasks.asr import ASRTask

    from espnet_multiblank.espnet.registration.best_model_guard import NaNCriterionError

    _data(tmp_path, short=["ab"])
    config = _train_config(durations=(), transducer_multi_blank_sigma=0.0)
    config["batch_size"] = 9
    config["ctc_conf"] = {"zero_infinity": False}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(
        NaNCriterionError,
        match=r"valid\.loss \(min\) is NaN in every epoch so far \(1\)",
    ):
        _collect_stats_and_train(tmp_path, main=lambda cmd: ASRTask.main(cmd=cmd))
    stats = _stats(tmp_path)
    assert list(stats) == [1] and np.isnan(stats[1]["valid"]["loss"])
    assert stats[1]["valid"]["transducer_no_path_fraction"] == pytest.approx(1 / 9)
    assert (tmp_path / "exp/1epoch.pth").exists()
    assert not (tmp_path / "exp/valid.loss.best.pth").exists()
