"""``frontend: grad_scaled`` / ``preencoder: grad_scaled`` (GradMultiply wrappers)."""

import copy

import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank import register
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.frontends.grad_scaled import (
    GradScaledFrontend,
    GradScaledPreEncoder,
)

register()

from espnet2.tasks.asr import ASRTask  # noqa: E402

SINC = dict(in_channels=1, out_channels=128, fs=16000)  # ESPnet: multiple of 128
WINDOW = dict(win_length=400, hop_length=160)


def _sinc_grads(scale: float, state=None):
    """Gradients of the sinc pre-encoder's parameters behind a sliding window."""
    from espnet2.asr.frontend.windowing import SlidingWindow

    torch.manual_seed(0)
    frontend = SlidingWindow(**WINDOW)
    pre = GradScaledPreEncoder("sinc", SINC, grad_scale=scale)
    if state is not None:
        pre.load_state_dict(state)
    wav = torch.randn(2, 2000, generator=torch.Generator().manual_seed(1))
    lens = torch.tensor([2000, 1500])
    feats, flens = frontend(wav, lens)
    out, _ = pre(feats, flens)
    (out.square().mean() + out.mean()).backward()
    return pre, {
        n: p.grad.clone() for n, p in pre.named_parameters() if p.grad is not None
    }


def test_preencoder_scales_upstream_gradient_exactly():
    """Powers of two (and 0) commute exactly with every float operation of the
    backward pass, so the scaled gradients must be bit-identical to scale x the
    unscaled ones; other scales agree up to rounding."""
    ref, g_ref = _sinc_grads(1.0)
    state = copy.deepcopy(ref.state_dict())
    assert g_ref and all(g.abs().sum() > 0 for g in g_ref.values())
    for scale, exact in ((0.5, True), (-0.25, True), (0.0, True), (0.1, False)):
        _, g = _sinc_grads(scale, state=state)
        assert g.keys() == g_ref.keys()
        for name in g_ref:
            want = g_ref[name] * scale
            if exact:
                assert torch.equal(g[name], want), (scale, name)
            else:
                tol = 1e-5 * g_ref[name].abs().max().item()
                torch.testing.assert_close(g[name], want, rtol=1e-4, atol=tol)


def test_frontend_wrapper_scales_learnable_frontend():
    """The wrapped frontend's parameters receive grad_scale x their gradient and the
    forward output is unchanged."""
    conf = dict(
        norm_mode="layer_norm",
        conv_mode="standard",
        bias=False,
        shapes=[(8, 10, 5), (8, 3, 2)],
    )
    outs, grads = [], []
    for scale in (1.0, 0.25):
        torch.manual_seed(0)
        fe = GradScaledFrontend("wav2vec_cnn", conf, grad_scale=scale)
        wav = torch.randn(2, 800, generator=torch.Generator().manual_seed(3))
        feats, _ = fe(wav, torch.tensor([800, 600]))
        feats.pow(2).sum().backward()
        outs.append(feats.detach())
        grads.append({n: p.grad for n, p in fe.named_parameters()})
        assert fe.output_size() == feats.size(-1)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    for name, g in grads[0].items():
        assert torch.equal(grads[1][name], 0.25 * g), name


def _parse(tmp_path, *extra):
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("<blank>\n<unk>\na\nb\n<sos/eos>\n")
    return ASRTask.get_parser().parse_args(
        ["--token_list", str(tokens), "--encoder", "rnn", "--decoder", "transducer"]
        + ["--encoder_conf", "num_layers=1", "--encoder_conf", "hidden_size=8"]
        + ["--encoder_conf", "output_size=8", "--decoder_conf", "hidden_size=8"]
        + ["--joint_net_conf", "joint_space_size=8", "--model", "multiblank_espnet"]
        + list(extra)
    )


def test_selectable_from_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "frontend: sliding_window\n"
        "frontend_conf: {win_length: 400, hop_length: 160}\n"
        "normalize: null\n"
        "preencoder: grad_scaled\n"
        "preencoder_conf:\n"
        "    preencoder: sinc\n"
        "    preencoder_conf: {in_channels: 1, out_channels: 128}\n"
        "    grad_scale: 0.1\n"
    )
    model = ASRTask.build_model(_parse(tmp_path, "--config", str(cfg)))
    assert isinstance(model.preencoder, GradScaledPreEncoder)
    assert model.preencoder.grad_scale == 0.1
    assert type(model.preencoder.preencoder).__name__ == "LightweightSincConvs"
    wav = torch.randn(2, 1600)
    loss, _, _ = model(
        wav,
        torch.tensor([1600, 1200]),
        torch.tensor([[2, 3], [3, -1]]),
        torch.tensor([2, 1]),
    )
    loss.backward()
    assert torch.isfinite(loss)


def test_frontend_conf_from_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "frontend: grad_scaled\n"
        "frontend_conf:\n"
        "    frontend: default\n"
        "    frontend_conf: {n_fft: 128, hop_length: 64, n_mels: 10}\n"
        "    grad_scale: 0.5\n"
    )
    model = ASRTask.build_model(_parse(tmp_path, "--config", str(cfg)))
    assert isinstance(model.frontend, GradScaledFrontend)
    assert model.frontend.output_size() == 10


@pytest.mark.parametrize(
    "conf, match",
    [
        (
            dict(frontend="nope"),
            r"frontend_conf\.frontend must be one of \[.*'default'",
        ),
        (dict(frontend="grad_scaled"), r"frontend_conf\.frontend cannot be"),
        (
            dict(frontend="default", frontend_conf=dict(bogus=1)),
            r"frontend_conf\.frontend_conf is invalid for frontend 'default'",
        ),
        (
            dict(frontend="default", grad_scale=float("nan")),
            r"frontend_conf\.grad_scale must be a finite number",
        ),
    ],
)
def test_bad_wrapper_conf_names_the_key(conf, match):
    with pytest.raises(ConfigError, match=match):
        GradScaledFrontend(**conf)


def test_bad_preencoder_conf_names_the_key():
    with pytest.raises(
        ConfigError, match=r"preencoder_conf\.preencoder must be one of"
    ):
        GradScaledPreEncoder("conv9000")
