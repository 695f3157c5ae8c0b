"""A tiny TDT trained by ESPnet's trainer on CPU through the plug-in's entry point,
with durations that leave some encoder lengths without a path: refused at start-up,
or trained with the opt-in.

The training, collect_stats and fresh-process reload that every lattice goes
through run on a TDT too in test_espnet_train.py.
"""

import functools
import logging

import numpy as np
import pytest
import torch
import yaml
from espnet_experiments import (
    N_EPOCHS,
    collect_stats_and_train,
    train_config,
    training_args,
    write_training_data,
)

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.bin import asr_train
from espnet_multiblank.espnet.errors import ConfigError

#: the TDT training config (also used by test_espnet_fused_train.py)
_train_config = functools.partial(train_config, "tdt")


def test_unreachable_durations_refused_at_start_up(tmp_path):
    """[0, 2, 4]: every odd encoder length has no path; the entry point stops before
    anything runs (collect_stats builds the model too), naming the key."""
    write_training_data(tmp_path)
    config = _train_config(durations=[0, 2, 4])
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError,
        match=r"model_conf\.transducer_tdt_durations=\[0, 2, 4\]: .*every T that is "
        r"not a multiple of 2",
    ):
        asr_train.main(
            training_args(tmp_path)
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
    write_training_data(root)
    config = _train_config(
        durations=[0, 2, 4], transducer_allow_unreachable_lengths=True, ctc_weight=0.3
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    records = _Records()
    logger = logging.getLogger("espnet_multiblank.espnet.model.no_path")
    logger.addHandler(records)
    try:
        collect_stats_and_train(root)
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
