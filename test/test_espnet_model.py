"""``model: multiblank_espnet`` built through ESPnet's own ASRTask from YAML."""

import pytest
import torch
import yaml
from espnet_cases import TOKENS, batch, build, tiny_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.decoding import MultiblankGreedySearch
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel
from espnet_multiblank.espnet.model.error_calculators import (
    MultiblankCTCErrorCalculator,
    MultiblankErrorCalculatorTransducer,
)

espnet_multiblank.register()

from espnet2.asr.decoder.transducer_decoder import TransducerDecoder  # noqa: E402
from espnet2.asr_transducer.joint_network import JointNetwork  # noqa: E402
from espnet2.asr_transducer.utils import get_transducer_task_io  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.training.task import MultiblankASRTask  # noqa: E402


def test_build_from_yaml_contract(tmp_path):
    model = build(tmp_path, tiny_config())
    assert isinstance(model, MultiblankESPnetASRModel)
    assert model.token_list[:4] == ["<blank8>", "<blank4>", "<blank2>", "<blank>"]
    assert model.blank_id == 3
    assert model.big_blank_durations == (2, 4, 8)
    assert model.big_blank_ids == (2, 1, 0)
    assert model.transducer_multi_blank_durations == [2, 4, 8]
    assert isinstance(model.decoder, TransducerDecoder)
    assert isinstance(model.joint_network, JointNetwork)
    assert model.decoder.odim == len(model.token_list) == model.vocab_size
    # the ESPnet wrong-blank defect does not occur
    assert model.decoder.blank_id == 3
    assert model.decoder.embed.padding_idx == 3
    assert torch.all(model.decoder.embed.weight[3] == 0)
    assert model.ctc.ctc_loss.blank == 3
    crit = model.criterion_transducer
    assert isinstance(crit, espnet_multiblank.MultiblankRNNTLoss)
    assert (crit.blank, tuple(crit.big_blank_durations)) == (3, (2, 4, 8))
    # per-utterance costs, reduced by the model over the utterances with a path
    assert crit.opts.sigma == 0.05 and crit.opts.reduction == "none"
    assert model.transducer_conf.reduction == "mean"


def test_stock_espnet_has_the_wrong_blank(tmp_path):
    """What the plug-in fixes: ESPnet's own model keeps decoder.blank_id = 0 and CTC
    blank 0 (= <blank8>) for the same config."""
    config = tiny_config()
    config["model"] = "espnet"
    for key in ("transducer_loss_backend",):
        config["model_conf"].pop(key)
    stock = build(tmp_path, config)
    assert stock.blank_id == 3
    assert stock.decoder.blank_id == 0 and stock.ctc.ctc_loss.blank == 0


def test_standard_transducer_without_warprnnt(tmp_path):
    model = build(tmp_path, tiny_config(durations=(), transducer_multi_blank_sigma=0.0))
    assert model.token_list == TOKENS
    assert (model.blank_id, model.big_blank_durations, model.big_blank_ids) == (
        0,
        (),
        (),
    )
    assert model.decoder.blank_id == 0 and model.ctc.ctc_loss.blank == 0
    loss, stats, _ = model(*batch(model.token_list))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(stats["loss_transducer"])


def test_rebuild_is_idempotent(tmp_path):
    """The saved config lists the big blanks already: rebuilding keeps the layout."""
    model = build(tmp_path, tiny_config())
    config = tiny_config()
    config["token_list"] = list(model.token_list)
    (tmp_path / "config2.yaml").write_text(yaml.safe_dump(config))
    args = ASRTask.get_parser().parse_args(["--config", str(tmp_path / "config2.yaml")])
    again = ASRTask.build_model(args)
    assert again.token_list == model.token_list and again.blank_id == 3


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(
            transducer_fastemit_lambda=0.5,
            transducer_clamp=0.3,
            transducer_reduction="mean_volume",
        ),
    ],
)
def test_model_loss_equals_plugin_loss(tmp_path, options):
    """The transducer branch is exactly espnet_multiblank's loss on the joint output,
    in value and gradient."""
    torch.manual_seed(0)
    model = build(tmp_path, tiny_config(**options))
    g = torch.Generator().manual_seed(1)
    enc = torch.randn(3, 9, 16, generator=g, requires_grad=True)
    enc_lens = torch.tensor([9, 7, 4])
    _, _, text, _ = batch(model.token_list)
    loss, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
    (grad,) = torch.autograd.grad(loss, enc)

    enc2 = enc.detach().clone().requires_grad_(True)
    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text, enc_lens, ignore_id=-1, blank_id=3
    )
    model.decoder.set_device(enc.device)
    logits = model.joint_network(
        enc2.unsqueeze(2), model.decoder(decoder_in).unsqueeze(1)
    )
    expected = espnet_multiblank.multiblank_rnnt_loss(
        logits,
        target,
        t_len,
        u_len,
        blank=3,
        big_blank_durations=[2, 4, 8],
        sigma=0.05,
        reduction=options.get("transducer_reduction", "mean"),
        fastemit_lambda=options.get("transducer_fastemit_lambda", 0.0),
        clamp=options.get("transducer_clamp", 0.0),
    )
    (grad2,) = torch.autograd.grad(expected, enc2)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, grad2, rtol=1e-5, atol=1e-7)


def test_ctc_uses_standard_blank(tmp_path):
    model = build(tmp_path, tiny_config())
    g = torch.Generator().manual_seed(2)
    enc = torch.randn(3, 9, 16, generator=g)
    enc_lens = torch.tensor([9, 7, 4])
    _, _, text, text_lengths = batch(model.token_list)
    got = model.ctc(enc, enc_lens, text, text_lengths)
    logp = model.ctc.ctc_lo(enc).log_softmax(-1).transpose(0, 1)
    targets = torch.cat([t[:n] for t, n in zip(text, text_lengths)])
    want = (
        torch.nn.functional.ctc_loss(
            logp,
            targets,
            enc_lens,
            text_lengths,
            blank=3,
            reduction="sum",
            zero_infinity=True,
        )
        / 3
    )
    torch.testing.assert_close(got, want)


def test_half_precision_joint_output_is_cast_to_float32(tmp_path):
    """Under autocast the joint network may return bf16/fp16; the loss gets float32.
    (CPU LSTMs do not run under bf16 autocast on every CPU, so the joint output is made
    bf16 directly.)"""
    model = build(tmp_path, tiny_config())
    model.joint_network.register_forward_hook(
        lambda mod, inputs, out: out.to(torch.bfloat16)
    )
    seen = []
    model.criterion_transducer.register_forward_pre_hook(
        lambda mod, inputs: seen.append(inputs[0].dtype)
    )
    loss, stats, _ = model(*batch(model.token_list))
    assert seen == [torch.float32]
    assert torch.isfinite(stats["loss_transducer"])


class _ScriptedJoint(torch.nn.Module):
    """Joint network emitting a scripted symbol at each call."""

    def __init__(self, vocab, script):
        super().__init__()
        self.vocab, self.script, self.calls = vocab, list(script), []

    def forward(self, enc_t, dec_out):
        self.calls.append(int(enc_t[0]))
        out = torch.zeros(self.vocab)
        out[self.script.pop(0)] = 10.0
        return out


def test_error_calculator_uses_multiblank_search_and_strips_all_blanks():
    """The validation CER/WER decode with the plug-in's batched multi-blank greedy
    search (tested in test_decoding_search.py) and drop every blank id."""
    vocab = 8  # <blank8>=0 <blank4>=1 <blank2>=2 <blank>=3 a=4 b=5 <space>=6 eos=7
    decoder = TransducerDecoder(vocab, hidden_size=4)
    decoder.blank_id = 3
    decoder.set_device(torch.device("cpu"))
    joint = _ScriptedJoint(vocab, [])
    calc = MultiblankErrorCalculatorTransducer(
        decoder,
        joint,
        [
            "<blank8>",
            "<blank4>",
            "<blank2>",
            "<blank>",
            "a",
            "b",
            "<space>",
            "<sos/eos>",
        ],
        "<space>",
        "<blank>",
        blank_id=3,
        big_blank_durations=[2, 4, 8],
        report_cer=True,
        report_wer=True,
    )
    assert isinstance(calc.beam_search, MultiblankGreedySearch)
    assert calc.beam_search.blank_id == 3
    assert calc.beam_search.lattice.big_blank_durations == (2, 4, 8)
    pred, ref = calc.convert_to_char([[4, 0, 6, 1, 5, 2]], torch.tensor([[4, 6, 5, 3]]))
    assert pred == ["a b"] and ref == ["a b"]


def test_validation_cer_runs(tmp_path):
    model = build(tmp_path, tiny_config(report_cer=True, report_wer=True))
    assert isinstance(model.error_calculator_trans, MultiblankErrorCalculatorTransducer)
    model.eval()
    with torch.no_grad():
        _, stats, _ = model(*batch(model.token_list))
    assert stats["cer_transducer"] is not None and stats["wer_transducer"] is not None


@pytest.mark.parametrize(
    "conf, match",
    [
        (
            dict(transducer_multi_blank_durations=[1, 4]),
            r"model_conf\.transducer_multi_blank_durations must be a list of distinct",
        ),
        (
            dict(transducer_multi_blank_durations=[2, 2]),
            r"model_conf\.transducer_multi_blank_durations must",
        ),
        (
            dict(transducer_multi_blank_durations=[2.5]),
            r"model_conf\.transducer_multi_blank_durations must",
        ),
        (dict(transducer_clamp=-1.0), r"model_conf\.transducer_clamp must be .*>= 0"),
        (
            dict(transducer_multi_blank_sigma=-0.1),
            r"model_conf\.transducer_multi_blank_sigma",
        ),
        (
            dict(transducer_fastemit_lambda="x"),
            r"model_conf\.transducer_fastemit_lambda",
        ),
        (
            dict(transducer_reduction="avg"),
            r"model_conf\.transducer_reduction must be one of \['sum', 'mean', 'mean_v",
        ),
        (dict(transducer_reduction="none"), r"model_conf\.transducer_reduction must"),
        (dict(transducer_loss_backend="cuda"), r"model_conf\.transducer_loss_backend"),
        (dict(sym_blank="<b>"), r"model_conf\.sym_blank='<b>' is not in token_list"),
    ],
)
def test_bad_model_conf_names_the_key(tmp_path, conf, match):
    """Through the plug-in's task (the bin's) the check runs before ESPnet edits the
    token list; through ESPnet's own ASRTask the model's constructor still catches
    everything but a missing sym_blank, which ESPnet's build_model trips on first."""
    with pytest.raises(ConfigError, match=match):
        build(tmp_path, tiny_config(**conf), task=MultiblankASRTask)
    if "sym_blank" not in conf:
        with pytest.raises(ConfigError, match=match):
            build(tmp_path, tiny_config(**conf))


def test_task_checks_before_espnet(tmp_path):
    config = tiny_config(transducer_multi_blank_durations=5)
    with pytest.raises(ConfigError, match=r"model_conf\.transducer_multi_blank_dura"):
        build(tmp_path, config, task=MultiblankASRTask)


def test_wrong_token_layout_names_the_key(tmp_path):
    """A token list whose big blanks are not just before <blank> is refused."""
    config = tiny_config()
    config["token_list"] = ["<blank2>", "<blank4>", "<blank8>"] + TOKENS
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    args = ASRTask.get_parser().parse_args(["--config", str(tmp_path / "c.yaml")])
    with pytest.raises(ConfigError, match=r"token_list\[2\] must be '<blank2>'"):
        ASRTask.build_model(args)


def test_not_a_transducer(tmp_path):
    config = tiny_config()
    config["decoder"] = "rnn"
    config["decoder_conf"] = {}
    with pytest.raises(ConfigError, match="decoder: transducer"):
        build(tmp_path, config)


def test_unknown_choice_names_the_key(tmp_path, capsys):
    """A YAML value bypasses argparse's choices; ESPnet's build_model names the key.
    On the command line argparse refuses it."""
    config = tiny_config()
    config["model"] = "multiblank_espnett"
    with pytest.raises(
        ValueError, match=r"--model must be one of \(.*'multiblank_espnet'"
    ):
        build(tmp_path, config)
    with pytest.raises(SystemExit):
        build(tmp_path, tiny_config(), "--preencoder", "grad_scaledd")
    assert "--preencoder: invalid choice" in capsys.readouterr().err


def test_default_config_lists_the_plugin_keys():
    """ESPnet's --print_config shows get_default_kwargs(model class) as model_conf."""
    from espnet2.utils.get_default_kwargs import get_default_kwargs

    kwargs = get_default_kwargs(MultiblankESPnetASRModel)
    assert kwargs["transducer_multi_blank_durations"] == []
    assert kwargs["transducer_multi_blank_sigma"] == 0.05
    for key in ("transducer_fastemit_lambda", "transducer_clamp"):
        assert kwargs[key] == 0.0
    assert kwargs["transducer_reduction"] == "mean"
    assert kwargs["transducer_loss_backend"] == "auto"
    assert kwargs["batch_exact_encoding"] is True


def test_task_check_uses_the_constructor_defaults(monkeypatch, tmp_path):
    """check_args fills the keys a config leaves out from the model constructor's
    signature (one definition of the defaults): a changed default reaches it."""
    from espnet_multiblank.espnet.model import asr_model as plugin_model
    from espnet_multiblank.espnet.training import task

    defaults = plugin_model.model_conf_defaults()
    assert defaults["transducer_multi_blank_sigma"] == 0.05
    assert defaults["transducer_reduction"] == "mean"
    monkeypatch.setattr(
        task,
        "model_conf_defaults",
        lambda: dict(defaults, transducer_reduction="avg"),
    )
    config = tiny_config()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "c.yaml")]
    )
    with pytest.raises(ConfigError, match=r"transducer_reduction must be one of"):
        task.check_args(args)


def test_ctc_cer_treats_big_blanks_as_blank(tmp_path):
    """With report_cer/report_wer off and ctc_weight > 0, ESPnet reports the CTC CER
    of the greedy CTC output in validation; every blank (standard and big) must act
    as the CTC blank: it separates repeats and is dropped (oracle written here)."""
    import editdistance

    model = build(tmp_path, tiny_config())  # report_* off, ctc_weight 0.3
    assert isinstance(model.error_calculator, MultiblankCTCErrorCalculator)
    tok = {t: i for i, t in enumerate(model.token_list)}
    frames = [
        ["a", "<blank4>", "a", "b", "<blank>", "<blank2>", "b", "<space>", "c"],
        ["<blank8>", "b", "b", "<blank2>", "c", "<blank>", "<blank>", "<blank>", "c"],
        ["a", "a", "<blank4>", "<blank8>", "a", "<blank>", "<blank>", "<blank>", "a"],
    ]
    ids = torch.tensor([[tok[t] for t in row] for row in frames])
    speech, speech_lengths, text, text_lengths = batch(model.token_list)

    def ctc_text(row):
        blanks = {"<blank>", "<blank2>", "<blank4>", "<blank8>"}
        out, prev = [], None
        for t in row:
            t = "<blank>" if t in blanks else t
            if t != prev and t not in ("<blank>", "<space>"):
                out.append(t)
            prev = t
        return "".join(out)

    refs = [
        "".join(model.token_list[i] for i in r if i >= 0 and i != tok["<space>"])
        for r in text.tolist()
    ]
    errors = sum(editdistance.eval(ctc_text(f), r) for f, r in zip(frames, refs))
    want = errors / sum(len(r) for r in refs)
    model.ctc.argmax = lambda encoder_out: ids  # the CTC output to score
    model.eval()
    with torch.no_grad():
        _, stats, _ = model(speech, speech_lengths, text, text_lengths)
    assert stats["cer_ctc"] == pytest.approx(want)
    assert want > 0  # one utterance is wrong: the case can tell
