"""``model: multiblank_espnet`` built through ESPnet's own ASRTask from YAML, for every
lattice (standard, multi-blank, TDT), then the multi-blank layout's own checks.

The test bodies that hold for every lattice take its name; its config is
``espnet_cases.lattice_config`` and what the model must look like
``espnet_cases.LAYOUTS`` (written out by hand). The TDT's own checks (the duration
outputs, omega, unreachable lengths, its sigma key) are in test_tdt_model.py.
"""

import pytest
import torch
import yaml
from espnet_cases import (
    DURS,
    LAYOUTS,
    TOKENS,
    batch,
    build,
    lattice_config,
    tiny_config,
)

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.decoding import GreedySearch
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel
from espnet_multiblank.espnet.model.error_calculators import (
    MultiblankCTCErrorCalculator,
    MultiblankErrorCalculatorTransducer,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

espnet_multiblank.register()

from espnet2.asr.decoder.transducer_decoder import TransducerDecoder  # noqa: E402
from espnet2.asr_transducer.joint_network import JointNetwork  # noqa: E402
from espnet2.asr_transducer.utils import get_transducer_task_io  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.inference.search import (  # noqa: E402
    build_transducer_search,
)
from espnet_multiblank.espnet.training.task import (  # noqa: E402
    MultiblankASRTask,
    check_args,
)

lattices = pytest.mark.parametrize("lattice", ["standard", "multiblank", "tdt"])


# ------------------------------------------------------------------- every lattice


@lattices
def test_build_from_yaml_contract(tmp_path, lattice):
    """The token list, blanks, networks and loss of the layout written out by hand;
    the ESPnet wrong-blank defect (decoder and CTC blank 0) does not occur; the
    model trains (a finite loss and gradient)."""
    conf = dict(transducer_tdt_omega=0.25) if lattice == "tdt" else {}
    model = build(tmp_path, lattice_config(lattice, **conf))
    want = LAYOUTS[lattice]
    assert isinstance(model, MultiblankESPnetASRModel)
    assert model.token_list == list(want.token_list)
    assert model.vocab_size == len(want.token_list) == model.decoder.odim
    assert model.blank_id == want.blank
    assert model.big_blank_durations == want.big_blank_durations
    assert model.big_blank_ids == want.big_blank_ids
    assert model.transducer_multi_blank_durations == list(want.big_blank_durations)
    assert model.tdt_durations == want.tdt_durations
    if lattice == "tdt":
        assert model.lattice == TDTLattice(want.blank, want.tdt_durations)
    else:
        assert model.lattice == MultiblankLattice(want.blank, want.big_blank_durations)
    assert isinstance(model.decoder, TransducerDecoder)
    assert isinstance(model.joint_network, JointNetwork)
    # the joint network has V (a TDT: V token + D duration) outputs; the rest has V
    assert model.joint_network.lin_out.out_features == want.joint_outputs
    assert model.ctc.ctc_lo.out_features == len(want.token_list)
    # the ESPnet wrong-blank defect does not occur
    assert model.decoder.blank_id == want.blank
    assert model.decoder.embed.padding_idx == want.blank
    assert torch.all(model.decoder.embed.weight[want.blank] == 0)
    assert model.ctc.ctc_loss.blank == want.blank
    crit = model.criterion_transducer
    assert type(crit).__name__ == want.criterion
    o = crit.opts
    assert (o.blank, o.sigma) == (want.blank, want.sigma)
    if lattice == "tdt":
        assert tuple(o.durations) == want.tdt_durations
        assert o.omega == 0.25 and model.criterion_transducer_eval.opts.omega == 0.0
    else:
        assert isinstance(crit, espnet_multiblank.MultiblankRNNTLoss)
        assert (crit.blank, tuple(crit.big_blank_durations)) == (
            want.blank,
            want.big_blank_durations,
        )
        assert model.criterion_transducer_eval is None
    # per-utterance costs, reduced by the model over the utterances with a path
    assert o.reduction == "none" and model.transducer_conf.reduction == "mean"
    loss, stats, _ = model(*batch(model.token_list))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(stats["loss_transducer"])
    grads = [p.grad for p in model.joint_network.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def _plugin_loss(lattice, logits, target, t_len, u_len, options, **kw):
    """The package's loss of ``lattice`` with the model_conf ``options`` mapped on its
    arguments (``kw``: e.g. the backend)."""
    want = LAYOUTS[lattice]
    common = dict(
        blank=want.blank,
        reduction=options.get("transducer_reduction", "mean"),
        fastemit_lambda=options.get("transducer_fastemit_lambda", 0.0),
        clamp=options.get("transducer_clamp", 0.0),
        **kw,
    )
    if lattice == "tdt":
        return espnet_multiblank.tdt_loss(
            logits,
            target,
            t_len,
            u_len,
            durations=options.get("transducer_tdt_durations", list(DURS)),
            sigma=options.get("transducer_tdt_sigma", want.sigma),
            **common,
        )
    return espnet_multiblank.multiblank_rnnt_loss(
        logits,
        target,
        t_len,
        u_len,
        big_blank_durations=list(want.big_blank_durations),
        sigma=want.sigma,
        **common,
    )


@pytest.mark.parametrize(
    "lattice, options",
    [
        ("standard", dict()),
        ("multiblank", dict()),
        (
            "multiblank",
            dict(
                transducer_fastemit_lambda=0.5,
                transducer_clamp=0.3,
                transducer_reduction="mean_volume",
            ),
        ),
        ("tdt", dict()),
        (
            "tdt",
            dict(
                transducer_fastemit_lambda=0.5,
                transducer_clamp=0.3,
                transducer_reduction="mean_volume",
                transducer_tdt_sigma=0.0,
            ),
        ),
        ("tdt", dict(transducer_tdt_durations=[3, 0, 1], transducer_reduction="sum")),
    ],
)
def test_model_loss_equals_plugin_loss(tmp_path, lattice, options):
    """The transducer branch is exactly espnet_multiblank's loss on the joint network's
    (B, T, U, V) (a TDT: V + D) logits, in value and gradient; and the float64
    PyTorch reference's, within float32 rounding."""
    torch.manual_seed(0)
    model = build(tmp_path, lattice_config(lattice, **options))
    durations = options.get("transducer_tdt_durations", DURS)
    g = torch.Generator().manual_seed(1)
    enc = torch.randn(3, 9, 16, generator=g, requires_grad=True)
    enc_lens = torch.tensor([9, 7, 4])
    _, _, text, _ = batch(model.token_list)
    loss, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
    (grad,) = torch.autograd.grad(loss, enc)

    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text, enc_lens, ignore_id=-1, blank_id=LAYOUTS[lattice].blank
    )
    model.decoder.set_device(enc.device)
    outputs = len(TOKENS) + len(durations)  # a TDT's V + D, with these durations
    if lattice != "tdt":
        outputs = LAYOUTS[lattice].joint_outputs
    # (backend, (rtol, atol) of the loss, of the gradient): the model's own kernel
    # exactly, the float64 reference within float32 rounding
    for backend, loss_tol, grad_tol in (
        ("auto", (1e-6, 1e-6), (1e-5, 1e-7)),
        ("torch", (1e-5, 1e-5), (1e-4, 1e-6)),
    ):
        enc2 = enc.detach().clone().requires_grad_(True)
        logits = model.joint_network(
            enc2.unsqueeze(2), model.decoder(decoder_in).unsqueeze(1)
        )
        assert logits.shape[-1] == outputs
        expected = _plugin_loss(
            lattice, logits, target, t_len, u_len, options, backend=backend
        )
        (grad2,) = torch.autograd.grad(expected, enc2)
        torch.testing.assert_close(loss, expected, rtol=loss_tol[0], atol=loss_tol[1])
        torch.testing.assert_close(grad, grad2, rtol=grad_tol[0], atol=grad_tol[1])


@lattices
def test_rebuild_from_saved_config_and_state(tmp_path, lattice):
    """What ESPnet's trainer saves (the parsed arguments, the token list with the big
    blanks already in it, and the state dict) rebuilds the same model with
    ``build_model_from_file``: the same layout (no big blanks added twice, the
    V + D output layer of a TDT) and the same weights."""
    want = LAYOUTS[lattice]
    (tmp_path / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(lattice_config(lattice)))
    args = ASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "config.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
    )
    model = ASRTask.build_model(args)
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(vars(args)))
    torch.save(model.state_dict(), tmp_path / "model.pth")
    assert vars(args)["token_list"] == list(want.token_list)
    again, _ = ASRTask.build_model_from_file(
        tmp_path / "saved.yaml", tmp_path / "model.pth", "cpu"
    )
    assert again.token_list == model.token_list == list(want.token_list)
    assert again.blank_id == want.blank and again.lattice == model.lattice
    assert again.joint_network.lin_out.weight.shape == (want.joint_outputs, 16)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v, rtol=0, atol=0)


@lattices
def test_ctc_uses_standard_blank(tmp_path, lattice):
    model = build(tmp_path, lattice_config(lattice))
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
            blank=LAYOUTS[lattice].blank,
            reduction="sum",
            zero_infinity=True,
        )
        / 3
    )
    torch.testing.assert_close(got, want)


@lattices
def test_half_precision_joint_output_is_cast_to_float32(tmp_path, lattice):
    """Under autocast the joint network may return bf16/fp16; the loss gets float32.
    (CPU LSTMs do not run under bf16 autocast on every CPU, so the joint output is made
    bf16 directly.)"""
    model = build(tmp_path, lattice_config(lattice))
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


@lattices
def test_validation_decodes_with_the_lattice_greedy_search(tmp_path, lattice):
    """Validation CER/WER come from the plug-in's batched greedy search of the
    lattice over the joint network's outputs: the same hypotheses as the
    inference's greedy search (one utterance at a time); every blank is dropped."""
    want = LAYOUTS[lattice]
    model = build(tmp_path, lattice_config(lattice, report_cer=True, report_wer=True))
    calc = model.error_calculator_trans
    assert isinstance(calc, MultiblankErrorCalculatorTransducer)
    assert type(calc.beam_search) is GreedySearch
    assert calc.beam_search.lattice.kind == (
        "tdt" if lattice == "tdt" else "multiblank"
    )
    assert calc.beam_search.stepper.vocab_size == want.joint_outputs
    assert calc.blank_ids == want.blank_ids
    model.eval()
    with torch.no_grad():
        _, stats, _ = model(*batch(model.token_list))
        assert stats["cer_transducer"] is not None
        assert stats["wer_transducer"] is not None
        g = torch.Generator().manual_seed(4)
        enc = torch.randn(3, 9, 16, generator=g)
        lens = torch.tensor([9, 5, 7])
        search = build_transducer_search(
            model,
            search_type="tdt_greedy" if lattice == "tdt" else "mb_greedy",
            max_sym_per_frame=5,  # the calculator's
        )
        assert type(search) is GreedySearch
        want_hyps = [
            search.search_one(enc[b, :T]).yseq for b, T in enumerate([9, 5, 7])
        ]
        got = [h.yseq for h in calc.beam_search.search_batch(enc, lens)]
    assert got == want_hyps


#: (lattice, model_conf keys, the message[, False: ESPnet's own build_model trips
#: on it before the model's check]): multi-blank keys on the multi-blank config,
#: TDT keys on the TDT config
BAD_CONF = [
    (
        "multiblank",
        dict(transducer_multi_blank_durations=[1, 4]),
        r"model_conf\.transducer_multi_blank_durations must be a list of distinct",
    ),
    (
        "multiblank",
        dict(transducer_multi_blank_durations=[2, 2]),
        r"model_conf\.transducer_multi_blank_durations must",
    ),
    (
        "multiblank",
        dict(transducer_multi_blank_durations=[2.5]),
        r"model_conf\.transducer_multi_blank_durations must",
    ),
    (
        "multiblank",
        dict(transducer_multi_blank_durations=5),
        r"model_conf\.transducer_multi_blank_dura",
        False,
    ),
    (
        "multiblank",
        dict(transducer_clamp=-1.0),
        r"model_conf\.transducer_clamp must be .*>= 0",
    ),
    (
        "multiblank",
        dict(transducer_multi_blank_sigma=-0.1),
        r"model_conf\.transducer_multi_blank_sigma",
    ),
    (
        "multiblank",
        dict(transducer_fastemit_lambda="x"),
        r"model_conf\.transducer_fastemit_lambda",
    ),
    (
        "multiblank",
        dict(transducer_reduction="avg"),
        r"model_conf\.transducer_reduction must be one of \['sum', 'mean', 'mean_v",
    ),
    (
        "multiblank",
        dict(transducer_reduction="none"),
        r"model_conf\.transducer_reduction must",
    ),
    (
        "multiblank",
        dict(transducer_loss_backend="cuda"),
        r"model_conf\.transducer_loss_backend",
    ),
    (
        "multiblank",
        dict(sym_blank="<b>"),
        r"model_conf\.sym_blank='<b>' is not in token_list",
        False,
    ),
    (
        "multiblank",
        dict(transducer_tdt_sigma=0.1),
        r"model_conf\.transducer_tdt_sigma is",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[0, 1], transducer_multi_blank_durations=[2]),
        r"model_conf\.transducer_multi_blank_durations and "
        r"model_conf\.transducer_tdt_durations cannot both be set",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[0]),
        r"model_conf\.transducer_tdt_durations must contain a value >= 1",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[1, 1]),
        r"model_conf\.transducer_tdt_durations must be distinct",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[-1, 1]),
        r"model_conf\.transducer_tdt_durations must contain ints >= 0",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[0, 1.5]),
        r"model_conf\.transducer_tdt_durations\[1\] must be an int",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=4),
        r"model_conf\.transducer_tdt_durations must be a list of distinct",
    ),
    (
        "tdt",
        dict(transducer_tdt_omega=-0.1),
        r"model_conf\.transducer_tdt_omega must be a probability in \[0, 1\]",
    ),
    ("tdt", dict(transducer_tdt_omega=1.5), r"model_conf\.transducer_tdt_omega must"),
    ("tdt", dict(transducer_tdt_omega="x"), r"model_conf\.transducer_tdt_omega must"),
    ("tdt", dict(transducer_tdt_omega=True), r"model_conf\.transducer_tdt_omega must"),
    (
        "tdt",
        dict(transducer_tdt_durations=[0, 2, 4]),
        r"model_conf\.transducer_tdt_durations=\[0, 2, 4\]: no path of this TDT "
        r"covers exactly T encoder frames for every T that is not a multiple of "
        r"2 \(T = 1, 3, 5, \.\.\.\).*model_conf\.transducer_allow_unreachable_"
        r"lengths: true",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[4, 2]),
        r"transducer_tdt_durations=\[4, 2\]: .* not a multiple of 2",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[0, 3, 5]),
        r"transducer_tdt_durations=\[0, 3, 5\]: .* for T = 1, 2, 4, 7, .*Add "
        r"duration 1 \(e\.g\. \[0, 1, 3, 5\]\)",
    ),
    (
        "tdt",
        dict(transducer_tdt_durations=[2, 4], transducer_allow_unreachable_lengths=1),
        r"model_conf\.transducer_allow_unreachable_lengths must be true or false",
    ),
    (
        "tdt",
        dict(transducer_tdt_sigma=0.1, transducer_multi_blank_sigma=0.2),
        r"model_conf\.transducer_tdt_sigma=0\.1 and model_conf\.transducer_multi_"
        r"blank_sigma=0\.2 disagree",
    ),
    (
        "tdt",
        dict(transducer_tdt_sigma=-1.0),
        r"model_conf\.transducer_tdt_sigma must be a finite float >= 0",
    ),
    (
        "tdt",
        dict(batch_exact_encoding="no"),
        r"model_conf\.batch_exact_encoding must be",
    ),
]


@pytest.mark.parametrize(
    "lattice, conf, match, stock",
    [
        pytest.param(*case[:3], case[3:] != (False,), id=f"{case[0]}-conf{i}")
        for i, case in enumerate(BAD_CONF)
    ],
)
def test_bad_model_conf_names_the_key(tmp_path, lattice, conf, match, stock):
    """At start-up through the plug-in's task (before ESPnet edits the token list),
    by the task's check alone (what the entry point runs before any model is built)
    and through ESPnet's own ASRTask (the model's constructor), which catches
    everything but a missing sym_blank or big-blank durations that are not a list:
    ESPnet's build_model trips on those first."""
    config = lattice_config(lattice)
    config["model_conf"].update(conf)
    with pytest.raises(ConfigError, match=match):
        build(tmp_path, config, task=MultiblankASRTask)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "bad.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
    )
    with pytest.raises(ConfigError, match=match):
        check_args(args)
    if stock:
        with pytest.raises(ConfigError, match=match):
            build(tmp_path, config)


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
    assert kwargs["transducer_tdt_durations"] == []
    assert kwargs["transducer_tdt_omega"] == 0.0
    assert kwargs["transducer_tdt_sigma"] is None
    assert kwargs["transducer_allow_unreachable_lengths"] is False


# ------------------------------------------------------ the multi-blank layout's own


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
    assert isinstance(calc.beam_search, GreedySearch)
    assert calc.beam_search.blank_id == 3
    assert calc.beam_search.lattice.big_blank_durations == (2, 4, 8)
    pred, ref = calc.convert_to_char([[4, 0, 6, 1, 5, 2]], torch.tensor([[4, 6, 5, 3]]))
    assert pred == ["a b"] and ref == ["a b"]


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
