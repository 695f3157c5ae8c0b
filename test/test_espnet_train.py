"""End to end through ESPnet, for the multi-blank and TDT lattices: --collect_stats
and training on CPU with ``python -m espnet_multiblank.bin.asr_train``'s ``main``,
then a reload with ``ASRTask.build_model_from_file`` in a fresh interpreter
(registered by the ``.pth`` start-up hook only); then a standard transducer with an
utterance that has no path, and ESPnet's own entry point stopped by a NaN criterion.

One training per lattice (``trained``, shared by the tests of that lattice); the TDT's
own trainings (unreachable lengths) are in test_tdt_train.py.
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import yaml
from espnet_cases import LAYOUTS, loss_backend
from espnet_experiments import (  # noqa: F401  (TEXTS: test_espnet_fused_train)
    N_EPOCHS,
    TEXTS,
    collect_stats_and_train,
    train_config,
    training_args,
    write_training_data,
)

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet import autoregister
from espnet_multiblank.espnet._hook import ENV_DISABLE

# the names test_espnet_fused_train.py imports from here
_data = write_training_data
_common = training_args
_train_config = functools.partial(train_config, "multiblank")

#: the model_conf each lattice is trained with; a TDT's omega draws the training
#: loss between the RNN-T and the TDT loss (validation is the TDT loss)
TRAINED = {
    "multiblank": dict(report_cer=True, report_wer=True, ctc_weight=0.3),
    "tdt": dict(
        report_cer=True, report_wer=True, ctc_weight=0.3, transducer_tdt_omega=0.2
    ),
}


@pytest.fixture(scope="module", params=list(TRAINED))
def trained(request, tmp_path_factory):
    """(lattice, experiment root): one training per lattice for the whole module."""
    lattice = request.param
    root = tmp_path_factory.mktemp(f"{lattice}_train")
    write_training_data(root)
    config = train_config(lattice, **TRAINED[lattice])
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    collect_stats_and_train(root)
    return lattice, root


def _stats(root):
    ckpt = torch.load(
        root / "exp/checkpoint.pth", map_location="cpu", weights_only=False
    )
    return ckpt["reporter"]["stats"]


@pytest.mark.slow
def test_collect_stats(trained):
    _, root = trained
    shapes = (root / "stats/train/speech_shape").read_text().split("\n")
    assert len([s for s in shapes if s]) == len(TEXTS)
    assert (root / "stats/train/feats_stats.npz").exists()


@pytest.mark.slow
def test_training_loss_finite_and_decreasing(trained):
    lattice, root = trained
    stats = _stats(root)
    epochs = range(1, N_EPOCHS + 1)
    train = [float(stats[e]["train"]["loss_transducer"]) for e in epochs]
    valid = [float(stats[e]["valid"]["loss_transducer"]) for e in epochs]
    valid_total = [float(stats[e]["valid"]["loss"]) for e in epochs]
    assert all(np.isfinite(train + valid + valid_total)), (train, valid, valid_total)
    # one step per epoch on the same 8 utterances: a repeated batch
    assert all(b < a for a, b in zip(valid, valid[1:])), valid
    assert valid[-1] < 0.95 * valid[0], valid
    assert valid_total[-1] < valid_total[0], valid_total
    if not TRAINED[lattice].get("transducer_tdt_omega"):  # the same loss each step
        assert all(b < a for a, b in zip(train, train[1:])), train
        assert train[-1] < 0.95 * train[0], train
    assert stats[N_EPOCHS]["valid"]["cer_transducer"] is not None
    assert stats[N_EPOCHS]["valid"]["wer_transducer"] is not None
    want = LAYOUTS[lattice]
    saved = yaml.safe_load((root / "exp/config.yaml").read_text())
    assert saved["model"] == "multiblank_espnet"
    assert saved["token_list"] == list(want.token_list)
    conf = saved["model_conf"]
    assert conf.get("transducer_tdt_durations", []) == list(want.tdt_durations)
    assert conf.get("transducer_multi_blank_durations", []) == list(
        want.big_blank_durations
    )


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
        cls=type(model).__name__, token_list=list(model.token_list),
        blank_id=model.blank_id, decoder_blank_id=model.decoder.blank_id,
        ctc_blank=model.ctc.ctc_loss.blank,
        durations=list(model.big_blank_durations), big=list(model.big_blank_ids),
        tdt_durations=list(model.tdt_durations),
        lin_out=list(model.joint_network.lin_out.weight.shape),
        crit=type(model.criterion_transducer).__name__, loss=float(loss),
    )))
    """)


@pytest.mark.slow
def test_reload_in_fresh_process(trained, tmp_path):
    """The trained model rebuilt by ESPnet's own ASRTask in an interpreter where only
    the start-up hook registers the plug-in: the lattice's layout (written out by
    hand) and the loss of the model rebuilt here."""
    from espnet2.tasks.asr import ASRTask

    lattice, root = trained
    exp = root / "exp"
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
        want_loss, _, _ = model(**{k: v.clone() for k, v in batch.items()})

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
    want = LAYOUTS[lattice]
    assert got["cls"] == "MultiblankESPnetASRModel" and got["crit"] == want.criterion
    assert got["token_list"] == list(want.token_list)
    assert (got["blank_id"], got["decoder_blank_id"], got["ctc_blank"]) == (
        want.blank,
    ) * 3
    assert got["durations"] == list(want.big_blank_durations)
    assert got["big"] == list(want.big_blank_ids)
    assert got["tdt_durations"] == list(want.tdt_durations)
    assert got["lin_out"] == [want.joint_outputs, 16]
    assert got["loss"] == pytest.approx(float(want_loss), rel=1e-5)


def test_backend_is_known():
    assert loss_backend() in ("auto", "torch")


@pytest.mark.slow
def test_standard_model_with_an_impossible_utterance_trains(tmp_path):
    """A standard transducer (labels cover no frame: only an utterance without
    encoder frames is impossible) with one such utterance among 9: finite losses,
    its share reported, a best model with a finite loss."""
    write_training_data(tmp_path, short=["ab"])
    config = train_config("standard")
    config["batch_size"] = 9
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    collect_stats_and_train(tmp_path)
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

    write_training_data(tmp_path, short=["ab"])
    config = train_config("standard")
    config["batch_size"] = 9
    config["ctc_conf"] = {"zero_infinity": False}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(
        NaNCriterionError,
        match=r"valid\.loss \(min\) is NaN in every epoch so far \(1\)",
    ):
        collect_stats_and_train(tmp_path, main=lambda cmd: ASRTask.main(cmd=cmd))
    stats = _stats(tmp_path)
    assert list(stats) == [1] and np.isnan(stats[1]["valid"]["loss"])
    assert stats[1]["valid"]["transducer_no_path_fraction"] == pytest.approx(1 / 9)
    assert (tmp_path / "exp/1epoch.pth").exists()
    assert not (tmp_path / "exp/valid.loss.best.pth").exists()
