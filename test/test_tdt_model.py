"""``model: multiblank_espnet`` as a token-and-duration transducer (TDT), built through
ESPnet's own ASRTask from YAML (``model_conf.transducer_tdt_durations``)."""

import warnings

import pytest
import torch
import yaml
from espnet_cases import DURS, TOKENS, batch, build, tdt_config, tiny_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.decoding import TDTGreedySearch
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

espnet_multiblank.register()

from espnet2.asr_transducer.utils import get_transducer_task_io  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.inference.search import (  # noqa: E402
    build_transducer_search,
)
from espnet_multiblank.espnet.training.task import MultiblankASRTask  # noqa: E402

V = len(TOKENS)


def test_build_from_yaml_contract(tmp_path):
    model = build(tmp_path, tdt_config(transducer_tdt_omega=0.25))
    assert isinstance(model, MultiblankESPnetASRModel)
    assert model.token_list == TOKENS  # a TDT adds no tokens
    assert model.blank_id == 0 and model.vocab_size == V
    assert model.tdt_durations == tuple(DURS)
    assert model.lattice == TDTLattice(0, tuple(DURS))
    assert (model.big_blank_durations, model.big_blank_ids) == ((), ())
    assert model.transducer_multi_blank_durations == []
    # the joint network has V token + D duration outputs; the rest has V
    assert model.joint_network.lin_out.out_features == V + len(DURS)
    assert model.decoder.odim == V and model.ctc.ctc_lo.out_features == V
    assert model.decoder.blank_id == 0 and model.ctc.ctc_loss.blank == 0
    crit = model.criterion_transducer
    assert isinstance(crit, espnet_multiblank.TDTLoss)
    o = crit.opts
    assert (o.blank, tuple(o.durations), o.sigma, o.omega) == (
        0,
        tuple(DURS),
        0.05,
        0.25,
    )
    assert model.criterion_transducer_eval.opts.omega == 0.0


def test_standard_and_multiblank_configs_unchanged(tmp_path):
    for durations, lattice in (((2, 4), MultiblankLattice(2, (2, 4))), ((), None)):
        model = build(tmp_path, tiny_config(durations=durations))
        assert model.tdt_durations == ()
        assert isinstance(
            model.criterion_transducer, espnet_multiblank.MultiblankRNNTLoss
        )
        assert model.joint_network.lin_out.out_features == len(model.token_list)
        assert model.criterion_transducer_eval is None
        if lattice:
            assert model.lattice == lattice


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


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(
            transducer_fastemit_lambda=0.5,
            transducer_clamp=0.3,
            transducer_reduction="mean_volume",
            transducer_tdt_sigma=0.0,
        ),
        dict(transducer_tdt_durations=[3, 0, 1], transducer_reduction="sum"),
    ],
)
def test_model_loss_equals_tdt_loss(tmp_path, options):
    """The transducer branch is exactly tdt_loss on the joint network's (B, T, U, V + D)
    logits, in value and gradient."""
    torch.manual_seed(0)
    model = build(tmp_path, tdt_config(**options))
    durations = options.get("transducer_tdt_durations", DURS)
    g = torch.Generator().manual_seed(1)
    enc = torch.randn(3, 9, 16, generator=g, requires_grad=True)
    enc_lens = torch.tensor([9, 7, 4])
    _, _, text, _ = batch(model.token_list)
    loss, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
    (grad,) = torch.autograd.grad(loss, enc)

    enc2 = enc.detach().clone().requires_grad_(True)
    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text, enc_lens, ignore_id=-1, blank_id=0
    )
    model.decoder.set_device(enc.device)
    logits = model.joint_network(
        enc2.unsqueeze(2), model.decoder(decoder_in).unsqueeze(1)
    )
    assert logits.shape[-1] == V + len(durations)
    expected = espnet_multiblank.tdt_loss(
        logits,
        target,
        t_len,
        u_len,
        blank=0,
        durations=durations,
        sigma=options.get("transducer_tdt_sigma", 0.05),
        reduction=options.get("transducer_reduction", "mean"),
        fastemit_lambda=options.get("transducer_fastemit_lambda", 0.0),
        clamp=options.get("transducer_clamp", 0.0),
        backend="torch",  # the float64 reference, not the model's kernel
    )
    (grad2,) = torch.autograd.grad(expected, enc2)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, grad2, rtol=1e-4, atol=1e-6)


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


def test_validation_decodes_with_tdt_greedy(tmp_path):
    """Validation CER/WER come from the batched TDT greedy search over the joint
    network's V + D outputs: the same hypotheses as the inference's tdt_greedy."""
    model = build(tmp_path, tdt_config(report_cer=True, report_wer=True))
    calc = model.error_calculator_trans
    assert isinstance(calc.beam_search, TDTGreedySearch)
    assert calc.beam_search.stepper.vocab_size == V + len(DURS)
    assert calc.blank_ids == frozenset({0})
    model.eval()
    with torch.no_grad():
        _, stats, _ = model(*batch(model.token_list))
        assert stats["cer_transducer"] is not None
        assert stats["wer_transducer"] is not None
        g = torch.Generator().manual_seed(4)
        enc = torch.randn(3, 9, 16, generator=g)
        lens = torch.tensor([9, 5, 7])
        search = build_transducer_search(
            model, search_type="tdt_greedy", max_sym_per_frame=5  # the calculator's
        )
        want = [search.search_one(enc[b, :T]).yseq for b, T in enumerate([9, 5, 7])]
        got = [h.yseq for h in calc.beam_search.search_batch(enc, lens)]
    assert got == want


@pytest.mark.parametrize(
    "conf, match",
    [
        (
            dict(transducer_tdt_durations=[0, 1], transducer_multi_blank_durations=[2]),
            r"model_conf\.transducer_multi_blank_durations and "
            r"model_conf\.transducer_tdt_durations cannot both be set",
        ),
        (
            dict(transducer_tdt_durations=[0]),
            r"model_conf\.transducer_tdt_durations must contain a value >= 1",
        ),
        (
            dict(transducer_tdt_durations=[1, 1]),
            r"model_conf\.transducer_tdt_durations must be distinct",
        ),
        (
            dict(transducer_tdt_durations=[-1, 1]),
            r"model_conf\.transducer_tdt_durations must contain ints >= 0",
        ),
        (
            dict(transducer_tdt_durations=[0, 1.5]),
            r"model_conf\.transducer_tdt_durations\[1\] must be an int",
        ),
        (
            dict(transducer_tdt_durations=4),
            r"model_conf\.transducer_tdt_durations must be a list of distinct",
        ),
        (
            dict(transducer_tdt_omega=-0.1),
            r"model_conf\.transducer_tdt_omega must be a probability in \[0, 1\]",
        ),
        (dict(transducer_tdt_omega=1.5), r"model_conf\.transducer_tdt_omega must"),
        (dict(transducer_tdt_omega="x"), r"model_conf\.transducer_tdt_omega must"),
        (dict(transducer_tdt_omega=True), r"model_conf\.transducer_tdt_omega must"),
        (
            dict(transducer_tdt_durations=[0, 2, 4]),
            r"model_conf\.transducer_tdt_durations=\[0, 2, 4\]: no path of this TDT "
            r"covers exactly T encoder frames for every T that is not a multiple of "
            r"2 \(T = 1, 3, 5, \.\.\.\).*model_conf\.transducer_allow_unreachable_"
            r"lengths: true",
        ),
        (
            dict(transducer_tdt_durations=[4, 2]),
            r"transducer_tdt_durations=\[4, 2\]: .* not a multiple of 2",
        ),
        (
            dict(transducer_tdt_durations=[0, 3, 5]),
            r"transducer_tdt_durations=\[0, 3, 5\]: .* for T = 1, 2, 4, 7, .*Add "
            r"duration 1 \(e\.g\. \[0, 1, 3, 5\]\)",
        ),
        (
            dict(
                transducer_tdt_durations=[2, 4], transducer_allow_unreachable_lengths=1
            ),
            r"model_conf\.transducer_allow_unreachable_lengths must be true or false",
        ),
        (
            dict(transducer_tdt_sigma=0.1, transducer_multi_blank_sigma=0.2),
            r"model_conf\.transducer_tdt_sigma=0\.1 and model_conf\.transducer_multi_"
            r"blank_sigma=0\.2 disagree",
        ),
        (
            dict(transducer_tdt_sigma=-1.0),
            r"model_conf\.transducer_tdt_sigma must be a finite float >= 0",
        ),
        (dict(batch_exact_encoding="no"), r"model_conf\.batch_exact_encoding must be"),
    ],
)
def test_bad_tdt_conf_names_the_key(tmp_path, conf, match):
    """At start-up through the plug-in's task (before ESPnet edits the token list)
    and through ESPnet's own ASRTask (the model's constructor)."""
    from espnet_multiblank.espnet.training.task import check_args

    config = tdt_config()
    config["model_conf"].update(conf)
    with pytest.raises(ConfigError, match=match):
        build(tmp_path, config, task=MultiblankASRTask)
    with pytest.raises(ConfigError, match=match):
        build(tmp_path, config)
    # the task's check alone (what the entry point runs before any model is built)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "bad.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
    )
    with pytest.raises(ConfigError, match=match):
        check_args(args)


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


def test_rebuild_from_saved_config_and_state(tmp_path):
    """ESPnet's build_model_from_file rebuilds the V + D output layer, and the saved
    state dict loads into it (shapes match): same outputs."""
    (tmp_path / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tdt_config()))
    args = ASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "config.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
    )
    model = ASRTask.build_model(args)
    # what ESPnet's trainer saves: the parsed arguments and the state dict
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(vars(args)))
    torch.save(model.state_dict(), tmp_path / "model.pth")
    again, _ = ASRTask.build_model_from_file(
        tmp_path / "saved.yaml", tmp_path / "model.pth", "cpu"
    )
    assert again.joint_network.lin_out.weight.shape == (V + len(DURS), 16)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v, rtol=0, atol=0)


def test_default_config_lists_the_tdt_keys():
    from espnet2.utils.get_default_kwargs import get_default_kwargs

    kwargs = get_default_kwargs(MultiblankESPnetASRModel)
    assert kwargs["transducer_tdt_durations"] == []
    assert kwargs["transducer_tdt_omega"] == 0.0
    assert kwargs["transducer_tdt_sigma"] is None
    assert kwargs["transducer_allow_unreachable_lengths"] is False


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


def test_tdt_sigma_refused_without_tdt(tmp_path):
    config = tiny_config(transducer_tdt_sigma=0.1)
    for task in (ASRTask, MultiblankASRTask):
        with pytest.raises(ConfigError, match=r"model_conf\.transducer_tdt_sigma is"):
            build(tmp_path, config, task=task)


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
