"""``model: multiblank_espnet`` as a token-and-duration transducer (TDT)
(``model_conf.transducer_tdt_durations``): the TDT's own checks, through ESPnet's own
ASRTask from YAML.

The checks that hold for every lattice (the built model's layout, its loss against
the package's and the float64 reference, the rebuild from a saved config, CTC,
validation decoding, bad model_conf keys) run on a TDT too in test_espnet_model.py.
"""

import warnings

import pytest
import torch
import yaml
from espnet_cases import DURS, TOKENS, batch, build, tdt_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.lattice import TDTLattice

espnet_multiblank.register()

from espnet2.asr_transducer.utils import get_transducer_task_io  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.inference.search import (  # noqa: E402
    build_transducer_search,
)
from espnet_multiblank.espnet.training.task import MultiblankASRTask  # noqa: E402

V = len(TOKENS)


def test_blank_not_first(tmp_path):
    """The blank is the index of sym_blank among the V tokens, wherever it is."""
    config = tdt_config()
    config["token_list"] = ["<unk>", "a", "<blank>", "b", "c", "<space>", "<sos/eos>"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    args = ASRTask.get_parser().parse_args(["--config", str(tmp_path / "c.yaml")])
    model = ASRTask.build_model(args)
    assert model.blank_id == 2 and model.lattice == TDTLattice(2, tuple(DURS))
    assert model.criterion_transducer.opts.blank == 2
    assert model.decoder.blank_id == 2 and model.ctc.ctc_loss.blank == 2
    search = build_transducer_search(model, search_type="tdt_greedy")
    assert search.blank_id == 2 and search.stepper.vocab_size == V + len(DURS)


def test_omega_in_training_only(tmp_path):
    """omega = 1: every training batch is the plain RNN-T loss on the token logits;
    validation (eval mode) is the TDT loss."""
    model = build(tmp_path, tdt_config(transducer_tdt_omega=1.0))
    g = torch.Generator().manual_seed(3)
    enc = torch.randn(3, 9, 16, generator=g)
    enc_lens = torch.tensor([9, 7, 4])
    _, _, text, _ = batch(model.token_list)
    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text, enc_lens, ignore_id=-1, blank_id=0
    )
    with torch.no_grad():
        model.decoder.set_device(enc.device)
        logits = model.joint_network(
            enc.unsqueeze(2), model.decoder(decoder_in).unsqueeze(1)
        )
        rnnt = espnet_multiblank.rnnt_loss(
            logits[..., :V], target, t_len, u_len, blank=0
        )
        tdt = espnet_multiblank.tdt_loss(
            logits, target, t_len, u_len, blank=0, durations=DURS, sigma=0.05
        )
        assert abs(float(rnnt) - float(tdt)) > 0.1  # the case tells them apart
        model.train()
        got_train, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
        model.eval()
        got_eval, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
    torch.testing.assert_close(got_train, rnnt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_eval, tdt, rtol=1e-5, atol=1e-5)


def test_joint_without_lin_out_is_refused(tmp_path):
    from espnet_multiblank.espnet.model.asr_model import _add_duration_outputs

    with pytest.raises(ConfigError, match="transducer_tdt_durations: a TDT needs"):
        _add_duration_outputs(torch.nn.Identity(), V, 5)
    joint = torch.nn.Module()
    joint.lin_out = torch.nn.Linear(4, V + 1)
    with pytest.raises(ConfigError, match=f"has {V + 1} outputs; expected"):
        _add_duration_outputs(joint, V, 5)
    joint.lin_out = torch.nn.Linear(4, V + 5)
    layer = joint.lin_out
    _add_duration_outputs(joint, V, 5)  # already V + D: kept
    assert joint.lin_out is layer


def _weight_norm(layer):
    with warnings.catch_warnings():  # deprecated in torch, still used
        warnings.simplefilter("ignore", FutureWarning)
        return torch.nn.utils.weight_norm(layer)


def _parametrized_weight_norm(layer):
    return torch.nn.utils.parametrizations.weight_norm(layer)


class _ScaledLinear(torch.nn.Linear):
    pass


def _spectral_norm(layer):
    return torch.nn.utils.spectral_norm(layer)


@pytest.mark.parametrize(
    "customise, what",
    [
        (_weight_norm, "forward hooks"),
        (_spectral_norm, "forward hooks"),
        (_parametrized_weight_norm, "not a plain torch.nn.Linear"),
        (lambda layer: _ScaledLinear(4, V), "_ScaledLinear"),
    ],
)
def test_customised_lin_out_is_refused(customise, what):
    """Rebuilding lin_out as a plain Linear would drop the customisation silently."""
    from espnet_multiblank.espnet.model.asr_model import _add_duration_outputs

    joint = torch.nn.Module()
    joint.lin_out = customise(torch.nn.Linear(4, V))
    layer = joint.lin_out
    with pytest.raises(ConfigError, match=f"transducer_tdt_durations: .*{what}"):
        _add_duration_outputs(joint, V, 5)
    assert joint.lin_out is layer  # left as it was
    plain = torch.nn.Module()
    plain.lin_out = torch.nn.Linear(4, V)
    _add_duration_outputs(plain, V, 5)
    assert plain.lin_out.out_features == V + 5


@pytest.mark.parametrize("durations", [[0, 2, 4], [2, 4], [0, 3, 5]])
def test_unreachable_lengths_accepted_when_asked(tmp_path, durations):
    """The opt-in builds the model (the loss then leaves the utterances without a
    path out: test_espnet_no_path.py)."""
    config = tdt_config(durations, transducer_allow_unreachable_lengths=True)
    for task in (ASRTask, MultiblankASRTask):
        model = build(tmp_path, config, task=task)
        assert model.tdt_durations == tuple(durations)
        assert model.transducer_conf.allow_unreachable_lengths


@pytest.mark.parametrize(
    "conf, sigma",
    [
        (dict(), 0.05),  # both absent: the old key's default
        (dict(transducer_tdt_sigma=0.2), 0.2),
        (dict(transducer_multi_blank_sigma=0.3), 0.3),  # the old key still works
        (dict(transducer_tdt_sigma=0.2, transducer_multi_blank_sigma=0.2), 0.2),
        (dict(transducer_tdt_sigma=0.0, transducer_multi_blank_sigma=0.05), 0.0),
    ],
)
def test_tdt_sigma_key(tmp_path, conf, sigma):
    """transducer_tdt_sigma is the TDT's sigma; transducer_multi_blank_sigma is used
    when it is absent (the old key left at its default 0.05 does not disagree)."""
    config = tdt_config()
    config["model_conf"].pop("transducer_multi_blank_sigma")
    config["model_conf"].update(conf)
    for task in (ASRTask, MultiblankASRTask):
        model = build(tmp_path, config, task=task)
        assert model.criterion_transducer.opts.sigma == sigma
        assert model.transducer_conf.sigma == sigma


def test_example_config_builds(tmp_path):
    """conf/train_tdt_conformer_transducer.yaml: a TDT through ESPnet's ASRTask, the
    multi-blank example's twin but for model_conf."""
    from pathlib import Path

    conf = Path(__file__).resolve().parents[1] / "conf"
    tdt = yaml.safe_load((conf / "train_tdt_conformer_transducer.yaml").read_text())
    mb = yaml.safe_load(
        (conf / "train_multiblank_conformer_transducer.yaml").read_text()
    )
    assert {k: v for k, v in tdt.items() if k != "model_conf"} == {
        k: v for k, v in mb.items() if k != "model_conf"
    }
    (tmp_path / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", str(conf / "train_tdt_conformer_transducer.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
        + ["--normalize", "none"]  # its global_mvn needs collect_stats' file
    )
    model = MultiblankASRTask.build_model(args)
    assert model.lattice == TDTLattice(0, (0, 1, 2, 3, 4))
    assert model.joint_network.lin_out.out_features == V + 5
    assert model.criterion_transducer.opts.omega == 0.1
    assert model.criterion_transducer.opts.sigma == 0.05  # transducer_tdt_sigma
