"""``model_conf.transducer_fused_joint`` in ``model: multiblank_espnet``: the fused
joint + loss gives the dense model's training step (loss, stats and every parameter's
gradient), with the same parameters; a joint network it cannot fuse is refused when
the model is built, naming the key."""

import contextlib
import importlib.util
import logging
from unittest import mock

import pytest
import torch
import yaml
from espnet_cases import TOKENS, batch, build, tdt_config, tiny_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model import fused_joint
from espnet_multiblank.espnet.model.asr_model import (
    NO_PATH_STAT,
    MultiblankESPnetASRModel,
)
from espnet_multiblank.espnet.model.fused_joint import FusedJointLoss, check_fusable
from espnet_multiblank.espnet.model.no_path import MODEL_REDUCTIONS

espnet_multiblank.register()

import espnet2.tasks.asr  # noqa: E402
from espnet2.asr_transducer.joint_network import JointNetwork  # noqa: E402
from espnet2.asr_transducer.utils import get_transducer_task_io  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.training.task import (  # noqa: E402
    MultiblankASRTask,
    check_args,
)

KEY = r"model_conf\.transducer_fused_joint"
KINDS = ("standard", "multiblank", "tdt")
_GPU = torch.cuda.is_available() and importlib.util.find_spec("numba_cuda")
gpu = pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU and numba-cuda")


def kind_config(kind, **conf):
    if kind == "standard":
        return tiny_config(durations=(), **conf)
    if kind == "multiblank":
        return tiny_config(**conf)
    return tdt_config(**conf)


def fused_config(config, fused=True):
    config = yaml.safe_load(yaml.safe_dump(config))  # a deep copy
    config["model_conf"]["transducer_fused_joint"] = fused
    return config


def twins(tmp_path, config, device="cpu"):
    """The dense model of ``config`` and the fused one with its parameters."""
    torch.manual_seed(0)
    dense = build(tmp_path, config).to(device)
    fused = build(tmp_path, fused_config(config)).to(device)
    assert dense.fused_joint_loss is None
    assert isinstance(fused.fused_joint_loss, FusedJointLoss)
    fused.load_state_dict(dense.state_dict())  # strict: the same parameters
    return dense, fused


@contextlib.contextmanager
def fused_calls(model, per_batch=1):
    """Counts the calls of the fused function while the block runs: ``per_batch``
    for a fused model, none for a dense one (equal results would tell nothing if
    the fused model ran the dense path)."""
    with mock.patch.object(
        fused_joint,
        "fused_transducer_loss",
        wraps=fused_joint.fused_transducer_loss,
    ) as spy:
        yield
    assert spy.call_count == (per_batch if model.fused_joint_loss else 0)


def grads(model):
    return {n: p.grad for n, p in model.named_parameters()}


def assert_same_grads(got, want):
    """Every parameter's gradient, to float32 rounding of its own scale (some
    gradients are zero analytically and rounding noise in both paths)."""
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        assert (g is None) == (w is None), name
        if w is None:
            continue
        atol = 1e-6 + 1e-5 * float(w.abs().max())
        torch.testing.assert_close(g, w, rtol=1e-4, atol=atol, msg=name)


def step(model, speech_lengths=None, seed=1, scale=1.0):
    """One forward (ESPnet's) and backward of ``model`` on the 3-utterance batch;
    ``scale``: an incoming gradient (1 / accum_grad, an AMP scale)."""
    speech, lengths, text, text_lengths = batch(model.token_list)
    if speech_lengths is not None:
        lengths = torch.tensor(speech_lengths)
    device = next(model.parameters()).device
    inputs = [x.to(device) for x in (speech, lengths, text, text_lengths)]
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with fused_calls(model):
        loss, stats, weight = model(*inputs)
        (loss * scale).backward()
    return loss.detach(), stats, grads(model)


# (reduction, options): every reduction; sigma (the configs' 0.05), FastEmit and a
# clamp that binds (the tiny model's logit gradients reach ~0.5)
OPTIONS = [
    ("mean", dict()),
    ("sum", dict(transducer_fastemit_lambda=0.5, transducer_clamp=0.05)),
    ("mean_volume", dict(transducer_fastemit_lambda=0.1, transducer_clamp=0.2)),
    ("mean_batch", dict(transducer_clamp=0.1)),
    ("mean_label_normalized", dict(transducer_fastemit_lambda=0.2)),
]


def test_options_cover_every_model_reduction():
    assert sorted(r for r, _ in OPTIONS) == sorted(MODEL_REDUCTIONS)


@pytest.mark.parametrize("impossible", [False, True], ids=["all_paths", "no_path"])
@pytest.mark.parametrize("reduction, options", OPTIONS, ids=[r for r, _ in OPTIONS])
@pytest.mark.parametrize("kind", KINDS)
def test_training_step_equals_dense(tmp_path, kind, reduction, options, impossible):
    """ESPnet's forward + backward (CTC mixed in with ctc_weight 0.3): the same loss,
    stats and gradient of every parameter as the dense model; an utterance without
    encoder frames is left out alike (its share in the stats, the warning)."""
    config = kind_config(kind, transducer_reduction=reduction, **options)
    dense, fused = twins(tmp_path, config)
    lengths = [2400, 300, 1600] if impossible else None  # 300 samples: 0 frames
    want = step(dense, lengths)
    got = step(fused, lengths)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert got[1].keys() == want[1].keys()
    for name, value in want[1].items():
        if value is not None:
            torch.testing.assert_close(got[1][name], value, rtol=1e-5, atol=1e-5)
    assert float(got[1][NO_PATH_STAT]) == pytest.approx(1 / 3 if impossible else 0)
    assert_same_grads(got[2], want[2])
    assert torch.count_nonzero(got[2]["joint_network.lin_out.weight"]) > 0


@gpu
@pytest.mark.parametrize("kind", KINDS)
def test_training_step_equals_dense_on_gpu(tmp_path, kind):
    """The same on CUDA (the fused path's torch tile operations and CUDA lattice,
    the dense CUDA loss), with an utterance without a path, FastEmit and clamp."""
    reduction, options = OPTIONS[1]
    config = kind_config(kind, transducer_reduction=reduction, **options)
    dense, fused = twins(tmp_path, config, "cuda")
    want = step(dense, [2400, 300, 1600])
    got = step(fused, [2400, 300, 1600])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert float(got[1][NO_PATH_STAT]) == pytest.approx(1 / 3)
    assert_same_grads(got[2], want[2])


def test_no_path_warning_and_zero_batch(tmp_path, caplog):
    """The fused model warns about utterances without a path like the dense one, and
    a batch without any gives 0 with a zero gradient still reaching the joint
    network's parameters."""
    config = kind_config("standard", ctc_weight=0.0)
    _, fused = twins(tmp_path, config)
    fused.train()
    with caplog.at_level(logging.WARNING, logger="espnet_multiblank"):
        step(fused, [2400, 300, 1600])
    warned = [r.getMessage() for r in caplog.records if "no path" in r.getMessage()]
    assert warned and "T=0, L=2 (no encoder frames)" in warned[0]
    enc = torch.randn(2, 9, 16, requires_grad=True)
    _, _, text, _ = batch(fused.token_list)
    fused.zero_grad(set_to_none=True)
    loss, _, _ = fused._calc_transducer_loss(enc, torch.tensor([0, 0]), text[:2])
    assert float(loss) == 0.0 and loss.requires_grad
    loss.backward()
    assert float(fused._no_path_fraction) == 1.0
    assert torch.count_nonzero(enc.grad) == 0
    for p in fused.joint_network.parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_validation_equals_dense(tmp_path, kind):
    """Eval mode without a graph (ESPnet's validation): the same loss and CER / WER
    (decoded with the joint network)."""
    config = kind_config(kind, report_cer=True, report_wer=True)
    if kind == "tdt":
        config["model_conf"]["transducer_tdt_omega"] = 1.0  # off in validation
    dense, fused = twins(tmp_path, config)
    out = []
    for model in (dense, fused):
        model.eval()
        with torch.no_grad(), fused_calls(model):
            out.append(model(*batch(model.token_list))[1])
    want, got = out
    assert want["cer_transducer"] is not None
    for name, value in want.items():
        if value is not None:
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-5)


def test_tdt_omega_draws_as_dense(tmp_path):
    """omega = 0.5: each training batch draws the plain RNN-T step from torch's
    generator as the dense loss does; the same seeds give the same choices, and
    validation never draws."""
    config = kind_config("tdt", transducer_tdt_omega=0.5, ctc_weight=0.0)
    dense, fused = twins(tmp_path, config)
    g = torch.Generator().manual_seed(3)
    enc = torch.randn(3, 9, 16, generator=g)
    enc_lens = torch.tensor([9, 7, 4])
    _, _, text, _ = batch(dense.token_list)
    losses = {}
    for name, model in (("dense", dense), ("fused", fused)):
        for training in (True, False):
            model.train(training)
            for seed in range(6):
                torch.manual_seed(seed)
                with torch.no_grad(), fused_calls(model):
                    loss, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
                losses[name, training, seed] = float(loss)
    plain = []  # the draw each seed makes first: the plain RNN-T step below 0.5
    for seed in range(6):
        torch.manual_seed(seed)
        plain.append(float(torch.rand(())) < 0.5)
    assert any(plain) and not all(plain)  # both branches occur
    for seed in range(6):
        for training in (True, False):
            assert losses["fused", training, seed] == pytest.approx(
                losses["dense", training, seed], rel=1e-5
            )
        tdt = losses["fused", False, seed]
        assert (losses["fused", True, seed] != pytest.approx(tdt)) == plain[seed]


def _projected_reference(model, enc_out, dec_out, target, t_len, u_len):
    """What the fused path promises under autocast: lin_enc / lin_dec as autocast
    runs them, then the activation, output layer and dense loss in float32."""
    joint = model.joint_network
    enc = joint.lin_enc(enc_out).float()
    pred = joint.lin_dec(dec_out).float()
    with torch.autocast(enc_out.device.type, enabled=False):
        hidden = joint.joint_activation(enc.unsqueeze(2) + pred.unsqueeze(1))
        logits = joint.lin_out(hidden)
        return model.criterion_transducer(logits, target, t_len, u_len)


@pytest.mark.parametrize(
    "device, dtype",
    [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=gpu)],
)
@pytest.mark.parametrize("kind", KINDS)
def test_autocast_and_scaled_gradient(tmp_path, kind, device, dtype):
    """Under autocast (CPU: bf16, CUDA: fp16) lin_enc / lin_dec give half
    precision; the fused function computes the activation, the output layer and the
    loss in float32: the costs and gradients (with an AMP-like incoming scale of
    1024) of that computation."""
    config = kind_config(kind, transducer_clamp=0.1)
    dense, fused = twins(tmp_path, config, device)
    g = torch.Generator().manual_seed(7)
    enc_out = torch.randn(3, 9, 16, generator=g).to(device)
    _, _, text, _ = batch(dense.token_list)
    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text.to(device),
        torch.tensor([9, 7, 4], device=device),
        ignore_id=-1,
        blank_id=dense.blank_id,
    )
    results = []
    for model, costs_of in (
        (dense, _projected_reference),
        (fused, MultiblankESPnetASRModel._transducer_costs),
    ):
        model.zero_grad(set_to_none=True)
        model.decoder.set_device(enc_out.device)
        dec_out = model.decoder(decoder_in).detach().requires_grad_(True)
        enc = enc_out.clone().requires_grad_(True)
        with torch.autocast(device, dtype=dtype), fused_calls(model):
            assert model.joint_network.lin_enc(enc).dtype == dtype
            costs = costs_of(model, enc, dec_out, target, t_len, u_len)
        assert costs.dtype == torch.float32
        (costs.sum() * 1024.0).backward()
        joint = {n: p.grad for n, p in model.joint_network.named_parameters()}
        results.append((costs.detach(), enc.grad, dec_out.grad, joint))
    want, got = results
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g_, w_ in zip(got[1:3], want[1:3]):
        torch.testing.assert_close(g_, w_, rtol=1e-4, atol=1e-3)
    assert_same_grads(got[3], want[3])


def test_lin_out_without_bias_is_fused(tmp_path, monkeypatch):
    """An output layer without bias (the fused function takes bias None): the dense
    model's gradients."""

    def joint_without_bias(*args, **kwargs):
        joint = JointNetwork(*args, **kwargs)
        lin = joint.lin_out
        joint.lin_out = torch.nn.Linear(lin.in_features, lin.out_features, bias=False)
        return joint

    monkeypatch.setattr(espnet2.tasks.asr, "JointNetwork", joint_without_bias)
    dense, fused = twins(tmp_path, kind_config("multiblank"))
    assert fused.joint_network.lin_out.bias is None
    want, got = step(dense), step(fused)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert_same_grads(got[2], want[2])


@pytest.mark.parametrize(
    "activation",
    ["relu", "swish", "ftswish", "smish", "mish", "hardtanh", "leaky_relu", "selu"],
)
def test_espnet_activations_are_fused(tmp_path, activation):
    """Every activation ESPnet's joint_activation_type names: accepted, and the
    dense model's loss and gradients (here from the encoder output on)."""
    config = kind_config("tdt")
    config["joint_net_conf"]["joint_activation_type"] = activation
    dense, fused = twins(tmp_path, config)
    g = torch.Generator().manual_seed(2)
    enc_out = torch.randn(3, 9, 16, generator=g)
    _, _, text, _ = batch(dense.token_list)
    out = []
    for model in (dense, fused):
        model.zero_grad(set_to_none=True)
        enc = enc_out.clone().requires_grad_(True)
        with fused_calls(model):
            loss, _, _ = model._calc_transducer_loss(enc, torch.tensor([9, 7, 4]), text)
            loss.backward()
        out.append((loss.detach(), enc.grad, grads(model)))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-4, atol=1e-6)
    assert_same_grads(out[1][2], out[0][2])


def test_same_parameters_and_default_off(tmp_path):
    """The key adds nothing to the state dict (a checkpoint loads either way) and is
    off by default (ESPnet's --print_config shows false)."""
    from espnet2.utils.get_default_kwargs import get_default_kwargs

    dense, fused = twins(tmp_path, kind_config("tdt"))
    assert list(fused.state_dict()) == list(dense.state_dict())
    dense.load_state_dict(fused.state_dict())
    assert (
        get_default_kwargs(MultiblankESPnetASRModel)["transducer_fused_joint"] is False
    )
    assert build(tmp_path, kind_config("standard")).transducer_conf.fused_joint is False


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_key_must_be_a_bool(tmp_path, value):
    """At start-up: the plug-in's task check, its build, ESPnet's ASRTask (the
    model's constructor)."""
    config = fused_config(kind_config("multiblank"), fused=value)
    match = rf"{KEY} must be true or false, got"
    for task in (MultiblankASRTask, ASRTask):
        with pytest.raises(ConfigError, match=match):
            build(tmp_path, config, task=task)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "bad.yaml"), "--token_list", str(tmp_path / "t")]
    )
    (tmp_path / "t").write_text("\n".join(TOKENS) + "\n")
    with pytest.raises(ConfigError, match=match):
        check_args(args)


class _OtherJoint(JointNetwork):
    """A subclass: its forward could compute anything."""


def _with_extra_layer(*args, **kwargs):
    joint = JointNetwork(*args, **kwargs)
    joint.dropout = torch.nn.Dropout(0.1)
    return joint


def _with_activation(module):
    def make(*args, **kwargs):
        joint = JointNetwork(*args, **kwargs)
        joint.joint_activation = module
        return joint

    return make


def _with_weight_norm(*args, **kwargs):
    joint = JointNetwork(*args, **kwargs)
    torch.nn.utils.parametrizations.weight_norm(joint.lin_out)
    return joint


def _without_lin_out(*args, **kwargs):
    joint = JointNetwork(*args, **kwargs)
    joint.lin_out_2 = joint.lin_out
    del joint.lin_out
    return joint


def _with_own_parameter(*args, **kwargs):
    joint = JointNetwork(*args, **kwargs)
    joint.scale = torch.nn.Parameter(torch.ones(()))
    return joint


# (joint network ASRTask builds, message); each for a standard / multi-blank model
# and a TDT (whose constructor rebuilds lin_out first: a TDT model needs one)
UNFUSABLE = [
    (_OtherJoint, r"it is test_espnet_fused_joint\._OtherJoint, not ESPnet's"),
    (
        _with_extra_layer,
        r"its modules are \['dropout', 'joint_activation', 'lin_dec', 'lin_enc', "
        r"'lin_out'\]; expected exactly",
    ),
    (_with_own_parameter, r"parameters or buffers of its own: \['scale'\]"),
    (_with_activation(torch.nn.PReLU()), r"joint_activation is not one it knows"),
    (_with_activation(torch.nn.Softsign()), r"joint_activation is not one it knows"),
]
RNNT_ONLY = [
    (_without_lin_out, r"its modules are .*'lin_out_2'"),
    (_with_weight_norm, r"its lin_out is .*ParametrizedLinear, not a torch\.nn\."),
]


@pytest.mark.parametrize(
    "kind, make_joint, match",
    [("multiblank", *case) for case in UNFUSABLE + RNNT_ONLY]
    + [("standard", *RNNT_ONLY[1])]
    + [("tdt", *case) for case in UNFUSABLE],
)
def test_unfusable_joint_refused_at_build(
    tmp_path, monkeypatch, kind, make_joint, match
):
    """Through ESPnet's ASRTask.build_model (the joint class is the one it builds
    for decoder: transducer): a ConfigError naming the key and what is wrong; the
    same joint network builds with the key off."""
    monkeypatch.setattr(espnet2.tasks.asr, "JointNetwork", make_joint)
    config = kind_config(kind)
    build(tmp_path, config)  # the dense model takes it
    with pytest.raises(ConfigError, match=rf"{KEY}: true cannot fuse .*{match}"):
        build(tmp_path, fused_config(config))


def test_hook_added_later_is_refused_at_the_next_step(tmp_path):
    """A hook on the joint network (which the fused path never calls) is not skipped
    silently: the next step stops, naming the key."""
    _, fused = twins(tmp_path, kind_config("multiblank"))
    step(fused)
    handle = fused.joint_network.register_forward_hook(lambda m, i, o: o * 2)
    with pytest.raises(ConfigError, match=rf"{KEY}.*the joint network have forward"):
        step(fused)
    handle.remove()
    fused.joint_network.lin_out.register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(ConfigError, match=r"lin_out have forward or backward hooks"):
        step(fused)


def test_check_fusable_width():
    joint = JointNetwork(7, 4, 4, joint_space_size=8)
    check_fusable(joint, 7)
    with pytest.raises(ConfigError, match=r"lin_out has 7 outputs, the model's latt"):
        check_fusable(joint, 12)


CONFIGS = ("conformer", "multiblank_conformer", "tdt_conformer")


def test_example_configs_name_the_key_with_its_default(tmp_path):
    """conf/train_*_conformer_transducer.yaml list the key, commented out with its
    default; uncommented, the line is a model_conf key (of the TDT example here),
    and set to true the example builds a fused model."""
    from pathlib import Path

    from espnet_multiblank.espnet.model.model_conf import FUSED_JOINT_DEFAULT

    conf = Path(__file__).resolve().parents[1] / "conf"
    line = f"    # transducer_fused_joint: {str(FUSED_JOINT_DEFAULT).lower()} "
    for name in CONFIGS:
        text = (conf / f"train_{name}_transducer.yaml").read_text()
        assert text.count(line) == 1, name
    text = text.replace(line, line.replace("# transducer", "transducer"), 1)
    config = yaml.safe_load(text)
    assert config["model_conf"]["transducer_fused_joint"] is FUSED_JOINT_DEFAULT
    config["model_conf"]["transducer_fused_joint"] = True
    (tmp_path / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", str(tmp_path / "c.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
        + ["--normalize", "none"]  # its global_mvn needs collect_stats' file
    )
    model = MultiblankASRTask.build_model(args)
    assert isinstance(model.fused_joint_loss, FusedJointLoss)
    assert model.fused_joint_loss.out_features == len(TOKENS) + 5  # V + D of the TDT
