"""A tiny TDT trained by ESPnet's trainer on CPU through the plug-in's entry point,
then rebuilt with ``ASRTask.build_model_from_file`` in a fresh interpreter (registered
by the ``.pth`` start-up hook only)."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import yaml
from espnet_cases import DURS, tdt_config
from test_espnet_train import N_EPOCHS, _common, _data  # noqa: I100

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.bin import asr_train
from espnet_multiblank.espnet import autoregister
from espnet_multiblank.espnet._hook import ENV_DISABLE
from espnet_multiblank.espnet.errors import ConfigError


def _train_config(**model_conf):
    config = tdt_config(**model_conf)
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


def _collect_stats_and_train(root):
    asr_train.main(
        _common(root)
        + ["--collect_stats", "true", "--output_dir", f"{root}/stats"]
        + ["--train_shape_file", f"{root}/wav.scp"]
        + ["--valid_shape_file", f"{root}/wav.scp"]
    )
    asr_train.main(
        _common(root)
        + ["--output_dir", f"{root}/exp"]
        + ["--train_shape_file", f"{root}/stats/train/speech_shape"]
        + ["--valid_shape_file", f"{root}/stats/valid/speech_shape"]
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tdt_train")
    _data(root)
    config = _train_config(
        report_cer=True, report_wer=True, ctc_weight=0.3, transducer_tdt_omega=0.2
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    _collect_stats_and_train(root)
    return root


@pytest.mark.slow
def test_training_loss_finite_and_decreasing(trained):
    ckpt = torch.load(
        trained / "exp/checkpoint.pth", map_location="cpu", weights_only=False
    )
    stats = ckpt["reporter"]["stats"]
    train = [
        float(stats[e]["train"]["loss_transducer"]) for e in range(1, N_EPOCHS + 1)
    ]
    valid = [
        float(stats[e]["valid"]["loss_transducer"]) for e in range(1, N_EPOCHS + 1)
    ]
    assert all(np.isfinite(train)) and all(np.isfinite(valid)), (train, valid)
    # one step per epoch on the same 8 utterances; validation (no omega) decreases
    assert valid[-1] < 0.95 * valid[0], valid
    assert all(b < a for a, b in zip(valid, valid[1:])), valid
    assert stats[N_EPOCHS]["valid"]["wer_transducer"] is not None
    saved = yaml.safe_load((trained / "exp/config.yaml").read_text())
    assert saved["model"] == "multiblank_espnet"
    assert saved["model_conf"]["transducer_tdt_durations"] == DURS
    assert saved["token_list"][0] == "<blank>" and "<blank2>" not in saved["token_list"]


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
        durations=list(model.tdt_durations),
        lin_out=list(model.joint_network.lin_out.weight.shape),
        loss=float(loss), crit=type(model.criterion_transducer).__name__,
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
    env.pop(ENV_DISABLE, None)
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
    assert got["cls"] == "MultiblankESPnetASRModel" and got["crit"] == "TDTLoss"
    assert got["blank_id"] == 0 and got["durations"] == DURS
    assert got["lin_out"] == [len(model.token_list) + len(DURS), 16]
    assert got["loss"] == pytest.approx(float(want), rel=1e-5)


def test_unreachable_durations_refused_at_start_up(tmp_path):
    """[0, 2, 4]: every odd encoder length has no path; the entry point stops before
    anything runs (collect_stats builds the model too), naming the key."""
    _data(tmp_path)
    config = _train_config(durations=[0, 2, 4])
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError,
        match=r"model_conf\.transducer_tdt_durations=\[0, 2, 4\]: .*every T that is "
        r"not a multiple of 2",
    ):
        asr_train.main(
            _common(tmp_path)
            + ["--collect_stats", "true", "--output_dir", f"{tmp_path}/stats"]
            + ["--train_shape_file", f"{tmp_path}/wav.scp"]
            + ["--valid_shape_file", f"{tmp_path}/wav.scp"]
        )
    assert not (tmp_path / "stats").exists()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def trained_unreachable(tmp_path_factory):
    """[0, 2, 4] with the opt-in. The 8 utterances get 12, 13 or 15 encoder frames
    (3200, 3600, 4000 samples): 5 have an odd length, no path."""
    root = tmp_path_factory.mktemp("tdt_unreachable")
    _data(root)
    config = _train_config(
        durations=[0, 2, 4], transducer_allow_unreachable_lengths=True, ctc_weight=0.3
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    records = _Records()
    logger = logging.getLogger("espnet_multiblank.espnet.model.no_path")
    logger.addHandler(records)
    try:
        _collect_stats_and_train(root)
    finally:
        logger.removeHandler(records)
    return root, records.messages


@pytest.mark.slow
def test_unreachable_lengths_opt_in_trains_finite(trained_unreachable):
    """Finite train and valid losses in every epoch (ESPnet's reporter would have
    averaged nothing but infinite batches: NaN), the share of utterances left out
    reported, a warning with the count, and a best model with a finite loss."""
    root, warnings = trained_unreachable
    ckpt = torch.load(
        root / "exp/checkpoint.pth", map_location="cpu", weights_only=False
    )
    stats = ckpt["reporter"]["stats"]
    for e in range(1, N_EPOCHS + 1):
        for phase in ("train", "valid"):
            assert np.isfinite(stats[e][phase]["loss"]), (e, phase, stats[e][phase])
            assert np.isfinite(stats[e][phase]["loss_transducer"]), (e, phase)
            assert stats[e][phase]["transducer_no_path_fraction"] == pytest.approx(
                5 / 8
            )
    valid = [stats[e]["valid"]["loss"] for e in range(1, N_EPOCHS + 1)]
    assert valid[-1] < valid[0], valid  # the utterances with a path still train
    best = (root / "exp/valid.loss.best.pth").resolve().name
    assert best == f"{int(np.argmin(valid)) + 1}epoch.pth"
    assert warnings, "no warning about the utterances without a path"
    assert warnings[0].startswith("transducer loss: 5 of 8 utterances in this batch")
    assert "(no path covers exactly 13 frames)" in warnings[0]
