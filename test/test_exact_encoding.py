"""Batch-exact encoding: every utterance of a padded batch is encoded as if alone.

The property is checked directly: encoder output and length of each utterance in a
padded batch against the same model applied to the utterance alone (no padding),
from the waveform through the frontend, with the repository's and the recipe's
training configs (random weights, eval mode). ESPnet's own model fails the same check
(the problem is real) and passes it once :func:`make_batch_exact` has run.
"""

import copy
import inspect
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

espnet_multiblank.register()

from espnet2.asr.encoder.conformer_encoder import ConformerEncoder  # noqa: E402
from espnet2.asr.encoder.transformer_encoder import TransformerEncoder  # noqa: E402
from espnet2.asr.espnet_model import ESPnetASRModel  # noqa: E402
from espnet2.layers.stft import Stft  # noqa: E402
from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.batch_exact import exact_encoding  # noqa: E402
from espnet_multiblank.espnet.batch_exact.exact_encoding import (  # noqa: E402
    make_batch_exact,
)
from espnet_multiblank.espnet.batch_exact.exact_layers import (  # noqa: E402
    ExactStft,
    MaskedConformerEncoderLayer,
    MaskedConvolutionModule,
    conv_output_lengths,
    masked_batch_norm,
    reflect_pad_each,
)
from espnet_multiblank.espnet.compat import ConvolutionModule  # noqa: E402
from espnet_multiblank.espnet.compat import (  # noqa: E402
    Conv2dSubsampling,
    Conv2dSubsampling1,
    Conv2dSubsampling2,
    Conv2dSubsampling6,
    Conv2dSubsampling8,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [
    "conf/train_conformer_transducer.yaml",
    "conf/train_multiblank_conformer_transducer.yaml",
    "egs/digits/asr1/conf/train_standard.yaml",
    "egs/digits/asr1/conf/train_multiblank.yaml",
]
TOKENS = ["<blank>", "<unk>", "a", "b", "c", "<space>", "<sos/eos>"]
# float32 rounding of the same computation on differently sized tensors; the
# differences being fixed are 1e-2 .. 1e0
ATOL = 2e-5


def _stats_file(root: Path, dim: int) -> Path:
    """Random but plausible global-MVN statistics (log-mel means around -5)."""
    rng = np.random.default_rng(dim)
    count = 1000.0
    mean = rng.normal(-5.0, 2.0, dim)
    var = rng.uniform(1.0, 9.0, dim)
    path = root / f"stats_{dim}.npz"
    np.savez(path, count=count, sum=mean * count, sum_square=(var + mean**2) * count)
    return path


#: encoder_conf keys of ``encoder: chunk_conformer`` that ESPnet's conformer lacks
CHUNK_KEYS = (
    "chunk_size_range",
    "full_context_prob",
    "num_left_chunks",
    "decoding_chunk_size",
    "dynamic_chunk_training",
)


def load_config(rel: str, root: Path, **changes) -> dict:
    """A training YAML with a stats file for global MVN and no validation search.

    The recipe trains ``encoder: chunk_conformer`` (batch-exact by construction,
    test_chunk_conformer.py); here it is ESPnet's conformer of the same sizes, whose
    layers the plug-in makes batch-exact."""
    config = yaml.safe_load((REPO / rel).read_text())
    if config.get("encoder") == "chunk_conformer":
        config["encoder"] = "conformer"
        for key in CHUNK_KEYS:
            config["encoder_conf"].pop(key, None)
    n_mels = (config.get("frontend_conf") or {}).get("n_mels", 80)
    config["normalize_conf"] = {"stats_file": str(_stats_file(root, n_mels))}
    config["model_conf"].update(report_cer=False, report_wer=False)
    config.update(changes)
    return config


def build_model(config: dict, root: Path, seed: int = 0) -> ESPnetASRModel:
    """The model ESPnet's ASRTask builds from ``config``, random weights and random
    batch-norm statistics."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    args = ASRTask.get_parser().parse_args(
        [
            "--config",
            str(root / "config.yaml"),
            "--token_list",
            str(root / "tokens.txt"),
        ]
    )
    torch.manual_seed(seed)
    model = ASRTask.build_model(args)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
    return model


def stock_espnet(config: dict, monkeypatch) -> dict:
    """``config`` for ESPnet's own ``model: espnet`` (only its model_conf keys);
    its standard transducer needs ``warprnnt_pytorch`` only to be built: stubbed."""
    import inspect

    stub = types.ModuleType("warprnnt_pytorch")
    stub.RNNTLoss = lambda **kwargs: torch.nn.Identity()
    monkeypatch.setitem(sys.modules, "warprnnt_pytorch", stub)
    accepted = inspect.signature(ESPnetASRModel.__init__).parameters
    config = copy.deepcopy(config)
    config["model"] = "espnet"
    config["model_conf"] = {
        k: v for k, v in config["model_conf"].items() if k in accepted
    }
    return config


def sample_rate(config: dict) -> int:
    fs = (config.get("frontend_conf") or {}).get("fs", 16000)
    return 8000 if str(fs).lower() in ("8k", "8000") else int(fs)


def waveforms(batch: int, fs: int, seed: int, noise_padding: bool = False):
    """(speech (B, L) float32, lengths (B,) int64): 0.25-1.5 s of noise and tones;
    the padding is zeros (as ESPnet's collate gives) or noise."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(fs // 4, 3 * fs // 2, (batch,), generator=g)
    speech = torch.zeros(batch, int(lengths.max()))
    t = torch.arange(speech.size(1)) / fs
    for b, n in enumerate(lengths.tolist()):
        tone = torch.sin(2 * np.pi * float(200 + 300 * b) * t[:n])
        speech[b, :n] = 0.1 * tone + 0.05 * torch.randn(n, generator=g)
    if noise_padding:
        noise = torch.randn(speech.shape, generator=g) * 0.3
        padding = torch.arange(speech.size(1))[None, :] >= lengths[:, None]
        speech = torch.where(padding, noise, speech)
    return speech, lengths


@torch.no_grad()
def padded_vs_alone(model, speech, lengths):
    """(max |batched - alone| over valid frames, #utterances whose length differs)."""
    enc, enc_lens = model.encode(speech, lengths)
    worst, wrong_lengths = 0.0, 0
    for b, n in enumerate(lengths.tolist()):
        alone, alone_len = model.encode(speech[b : b + 1, :n], lengths[b : b + 1])
        if int(alone_len) != int(enc_lens[b]) or alone.size(1) != int(alone_len):
            wrong_lengths += 1
        t = min(int(alone_len), int(enc_lens[b]))
        worst = max(worst, float((alone[0, :t] - enc[b, :t]).abs().max()))
    return worst, wrong_lengths


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The plug-in's model built from each config (cached)."""
    root = tmp_path_factory.mktemp("exact")
    cache = {}

    def get(rel):
        if rel not in cache:
            name = rel.replace("/", "_")
            config = load_config(rel, root)
            cache[rel] = build_model(config, root / name).eval()
        return cache[rel]

    return get


def transformer_config(root: Path) -> dict:
    """The recipe's config with ESPnet's transformer encoder (conv2d subsampling)."""
    return load_config(
        "egs/digits/asr1/conf/train_multiblank.yaml",
        root,
        encoder="transformer",
        encoder_conf=dict(
            output_size=96,
            attention_heads=4,
            linear_units=256,
            num_blocks=3,
            input_layer="conv2d",
            normalize_before=True,
        ),
    )


@pytest.mark.parametrize("rel", CONFIGS)
def test_configs_are_batch_exact(rel, models):
    model = models(rel)
    assert model.batch_exact_encoding == exact_encoding.BatchExactness(True)
    layers = list(model.encoder.encoders)
    assert all(type(m) is MaskedConformerEncoderLayer for m in layers)
    assert all(type(m.conv_module) is MaskedConvolutionModule for m in layers)
    assert type(model.frontend.stft) is ExactStft


#: ESPnet 202611 masks padding itself in its Conv2d subsampling (the output lengths),
#: its conformer convolution (in eval mode) and its utterance MVN (espnet/espnet#6600
#: and the convolution's ``mask_pad``); ESPnet 202511 does none of that. The STFT's
#: reflection of the batch's padding, and batch norm's training statistics over
#: padded frames, remain in both.
ESPNET_MASKS_ENCODER_PADDING = (
    "mask_pad" in inspect.signature(ConvolutionModule.forward).parameters
)


def assert_stock_espnet_differs(worst: float, wrong_lengths: int) -> None:
    """What a stock model (STFT frontend, conv2d subsampling) gets wrong on a padded
    batch, in the installed ESPnet."""
    assert worst > 1e-2  # the STFT's reflection of the padding, in every version
    if ESPNET_MASKS_ENCODER_PADDING:
        assert wrong_lengths == 0
    else:
        assert wrong_lengths > 0


@pytest.mark.parametrize("batch", [2, 5, 8])
@pytest.mark.parametrize("rel", CONFIGS)
def test_padded_batch_equals_alone(rel, batch, models):
    model = models(rel)
    config = yaml.safe_load((REPO / rel).read_text())
    speech, lengths = waveforms(batch, sample_rate(config), seed=batch)
    worst, wrong_lengths = padded_vs_alone(model, speech, lengths)
    assert wrong_lengths == 0
    assert worst < ATOL


def test_padding_content_does_not_matter(models):
    model = models(CONFIGS[-1])
    speech, lengths = waveforms(6, 8000, seed=3)
    noisy, _ = waveforms(6, 8000, seed=3, noise_padding=True)
    with torch.no_grad():
        a, a_lens = model.encode(speech, lengths)
        b, b_lens = model.encode(noisy, lengths)
    assert torch.equal(a_lens, b_lens)
    for i, n in enumerate(a_lens.tolist()):
        torch.testing.assert_close(a[i, :n], b[i, :n], atol=ATOL, rtol=0)


@pytest.mark.parametrize("batch", [3, 8])
def test_transformer_padded_batch_equals_alone(batch, tmp_path):
    model = build_model(transformer_config(tmp_path), tmp_path / "m").eval()
    assert model.batch_exact_encoding.exact
    speech, lengths = waveforms(batch, 8000, seed=batch)
    worst, wrong_lengths = padded_vs_alone(model, speech, lengths)
    assert wrong_lengths == 0 and worst < ATOL


@pytest.mark.parametrize("rel", [CONFIGS[1], CONFIGS[3]])
def test_stock_espnet_model_is_not_padding_invariant_until_made_exact(
    rel, tmp_path, monkeypatch
):
    config = stock_espnet(load_config(rel, tmp_path), monkeypatch)
    model = build_model(config, tmp_path / "m").eval()
    assert type(model) is ESPnetASRModel
    speech, lengths = waveforms(8, sample_rate(config), seed=0)
    worst, wrong_lengths = padded_vs_alone(model, speech, lengths)
    assert_stock_espnet_differs(worst, wrong_lengths)  # ESPnet's: the bug is real

    # the unpadded utterance's output does not change
    with torch.no_grad():
        before = model.encode(speech[:1, : lengths[0]], lengths[:1])
    assert make_batch_exact(model).exact
    with torch.no_grad():
        after = model.encode(speech[:1, : lengths[0]], lengths[:1])
    torch.testing.assert_close(after[0], before[0], atol=1e-6, rtol=0)
    assert torch.equal(after[1], before[1])
    worst, wrong_lengths = padded_vs_alone(model, speech, lengths)
    assert wrong_lengths == 0 and worst < ATOL


def _train_config(root: Path, model: str, monkeypatch) -> dict:
    """The recipe's multi-blank config without dropout or SpecAugment, for the
    plug-in's model ("plugin"), the same with ``batch_exact_encoding: false``
    ("plugin_not_exact") or ESPnet's own model ("stock")."""
    config = load_config(CONFIGS[-1], root, specaug=None)
    for key in list(config["encoder_conf"]):
        if "dropout" in key:
            config["encoder_conf"][key] = 0.0
    if model == "plugin_not_exact":
        config["model_conf"]["batch_exact_encoding"] = False
    return stock_espnet(config, monkeypatch) if model == "stock" else config


@pytest.mark.parametrize("model", ["plugin", "plugin_not_exact", "stock"])
def test_training_mode_ignores_padding(model, tmp_path, monkeypatch):
    """In training (batch-norm batch statistics, no dropout or SpecAugment), the
    valid frames and the running statistics do not depend on what the padding holds;
    ESPnet's model fails this, and so does the plug-in's with
    ``batch_exact_encoding: false`` (ESPnet's encoder layers as they are)."""
    stock = model != "plugin"
    config = _train_config(tmp_path, model, monkeypatch)
    model = build_model(config, tmp_path / "m").train()
    speech, lengths = waveforms(5, 8000, seed=7)
    noisy, _ = waveforms(5, 8000, seed=7, noise_padding=True)
    outs, stats = [], []
    for x in (speech, noisy):
        m = copy.deepcopy(model)
        with torch.no_grad():
            enc, enc_lens = m.encode(x, lengths)
        outs.append([enc[i, :n] for i, n in enumerate(enc_lens.tolist())])
        bn = m.encoder.encoders[0].conv_module.norm
        stats.append((bn.running_mean.clone(), bn.running_var.clone()))
    same = all(
        torch.allclose(a, b, atol=ATOL, rtol=0) for a, b in zip(outs[0], outs[1])
    ) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(stats[0], stats[1]))
    assert same != stock


@pytest.mark.parametrize("momentum", [0.1, None])
def test_masked_batch_norm_is_batch_norm_of_the_valid_frames(momentum):
    g = torch.Generator().manual_seed(0)
    C, lengths = 6, [9, 4, 7]
    x = torch.randn(3, C, 9, generator=g, dtype=torch.float64) * 3 + 1
    x.requires_grad_(True)
    mask = (torch.arange(9)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]
    bn = torch.nn.BatchNorm1d(C, momentum=momentum).double()
    with torch.no_grad():
        bn.weight.normal_(generator=g)
        bn.bias.normal_(generator=g)
    oracle = copy.deepcopy(bn)
    y = masked_batch_norm(bn, x, mask)
    y2 = masked_batch_norm(bn, x, mask)  # second update of the running stats
    valid = torch.cat([x[b, :, :n] for b, n in enumerate(lengths)], dim=1)[None]
    ref = oracle(valid)
    ref2 = oracle(valid)
    got = torch.cat([y[b, :, :n] for b, n in enumerate(lengths)], dim=1)[None]
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(y2, y)
    torch.testing.assert_close(ref2, ref)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(bn, name), getattr(oracle, name))
    assert y.masked_select(~mask).abs().max() == 0
    w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    (gx,) = torch.autograd.grad((got * w).sum(), x)
    (gref,) = torch.autograd.grad((ref * w).sum(), x)
    torch.testing.assert_close(gx, gref)  # zero on the padded frames in both
    # eval mode: running statistics, frame by frame
    bn.eval()
    torch.testing.assert_close(masked_batch_norm(bn, x, mask), bn(x))


@pytest.mark.parametrize("channels", [None, 2])
def test_reflect_pad_each_matches_torch_per_utterance(channels):
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([50, 13, 31, 40])
    shape = (4, 50) if channels is None else (4, 50, channels)
    x = torch.randn(shape, generator=g)
    pad = 12
    out = reflect_pad_each(x, lengths, pad)
    assert out.shape[:2] == (4, 50 + 2 * pad)
    for b, n in enumerate(lengths.tolist()):
        row = x[b, :n].T if channels else x[b, :n][None]
        ref = torch.nn.functional.pad(row[None], (pad, pad), mode="reflect")[0]
        ref = ref.T if channels else ref[0]
        torch.testing.assert_close(out[b, : n + 2 * pad], ref, atol=0, rtol=0)
        assert out[b, n + 2 * pad :].abs().max() == 0 if n < 50 else True


def test_exact_stft_equals_espnet_stft_alone():
    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([3000, 1234, 2200])
    x = torch.randn(3, 3000, generator=g)
    stft = Stft(n_fft=256, win_length=200, hop_length=80)
    exact = copy.deepcopy(stft)
    exact.__class__ = ExactStft
    batched, olens = exact(x, lengths)
    espnet_batched, espnet_olens = stft(x, lengths)
    assert torch.equal(olens, espnet_olens)
    differs = False
    for b, n in enumerate(lengths.tolist()):
        alone, alone_len = stft(x[b : b + 1, :n], lengths[b : b + 1])
        assert int(alone_len) == int(olens[b]) == alone.size(1)
        torch.testing.assert_close(batched[b, : alone.size(1)], alone[0])
        differs |= not torch.allclose(espnet_batched[b, : alone.size(1)], alone[0])
    assert differs  # ESPnet's Stft in a padded batch: the last frames differ


SUBSAMPLING = [
    Conv2dSubsampling,
    Conv2dSubsampling1,
    Conv2dSubsampling2,
    Conv2dSubsampling6,
    Conv2dSubsampling8,
]


@pytest.mark.parametrize("cls", SUBSAMPLING)
def test_conv_output_lengths_are_the_frames_computed(cls):
    torch.manual_seed(0)
    embed = cls(40, 4, 0.0)
    convs = tuple(m for m in embed.conv if isinstance(m, torch.nn.Conv2d))
    for t in range(15, 40):
        x, _ = embed(torch.randn(1, t, 40), None)
        frames = x[0].size(1) if isinstance(x, tuple) else x.size(1)
        assert conv_output_lengths(convs, torch.tensor([t])).item() == frames


ENCODERS = {
    "conformer-conv2d-relpos": lambda: ConformerEncoder(
        20,
        16,
        2,
        24,
        2,
        input_layer="conv2d",
        rel_pos_type="latest",
        pos_enc_layer_type="rel_pos",
        selfattention_layer_type="rel_selfattn",
        macaron_style=True,
        use_cnn_module=True,
        cnn_module_kernel=7,
    ),
    "conformer-conv2d6-abspos": lambda: ConformerEncoder(
        20,
        16,
        2,
        24,
        2,
        input_layer="conv2d6",
        pos_enc_layer_type="abs_pos",
        selfattention_layer_type="selfattn",
        use_cnn_module=True,
        cnn_module_kernel=5,
    ),
    "conformer-linear-relpos": lambda: ConformerEncoder(
        20,
        16,
        2,
        24,
        2,
        input_layer="linear",
        rel_pos_type="latest",
        pos_enc_layer_type="rel_pos",
        selfattention_layer_type="rel_selfattn",
        use_cnn_module=True,
        cnn_module_kernel=9,
    ),
    "transformer-conv2d8": lambda: TransformerEncoder(
        20, 16, 2, 24, 2, input_layer="conv2d8"
    ),
    "transformer-conv2d2": lambda: TransformerEncoder(
        20, 16, 2, 24, 2, input_layer="conv2d2"
    ),
    "transformer-conv2d1": lambda: TransformerEncoder(
        20, 16, 2, 24, 2, input_layer="conv2d1"
    ),
}


@torch.no_grad()
def encoder_padded_vs_alone(encoder, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), 20, generator=g)
    lens = torch.tensor(lengths)
    out, olens, _ = encoder(x, lens)
    worst, wrong = 0.0, 0
    for b, n in enumerate(lengths):
        alone, alone_len, _ = encoder(x[b : b + 1, :n], lens[b : b + 1])
        wrong += int(alone_len) != int(olens[b])
        t = min(int(alone_len), int(olens[b]))
        worst = max(worst, float((alone[0, :t] - out[b, :t]).abs().max()))
    return worst, wrong


def _make_encoder_exact(encoder) -> None:
    actions = []
    exact_encoding._encoder_module(encoder, "encoder", actions)
    for apply in actions:
        apply()


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_encoder_types_padded_vs_alone(name):
    torch.manual_seed(0)
    encoder = ENCODERS[name]().eval()
    lengths = [61, 40, 23, 17, 55, 33]
    worst, wrong = encoder_padded_vs_alone(encoder, lengths)
    if ESPNET_MASKS_ENCODER_PADDING:  # ESPnet 202611 fixed these in eval mode
        assert wrong == 0 and worst < ATOL
    else:  # each of these differs in ESPnet 202511
        assert wrong > 0 or worst > 1e-3
    _make_encoder_exact(encoder)
    worst, wrong = encoder_padded_vs_alone(encoder, lengths)
    assert wrong == 0 and worst < ATOL


def _rnn_config(root):
    config = load_config(CONFIGS[-1], root)
    config["encoder"] = "rnn"
    config["encoder_conf"] = dict(num_layers=1, hidden_size=16, output_size=16)
    return config


def _legacy_config(root):
    config = load_config(CONFIGS[-1], root)
    config["encoder_conf"].update(
        rel_pos_type="legacy",
        pos_enc_layer_type="legacy_rel_pos",
        selfattention_layer_type="legacy_rel_selfattn",
    )
    return config


def _conv1d_ff_config(root):
    config = load_config(CONFIGS[-1], root)
    config["encoder_conf"].update(positionwise_layer_type="conv1d")
    return config


@pytest.mark.parametrize(
    "make, culprit",
    [
        (_rnn_config, "encoder (espnet2.asr.encoder.rnn_encoder.RNNEncoder)"),
        (_legacy_config, "LegacyRelPositionalEncoding"),
        (_conv1d_ff_config, "MultiLayeredConv1d"),
    ],
)
def test_unknown_modules_leave_the_model_alone(make, culprit, tmp_path):
    model = build_model(make(tmp_path), tmp_path / "m").eval()
    result = model.batch_exact_encoding
    assert not result.exact and culprit in result.reason
    assert make_batch_exact(model) == result
    assert type(model.frontend.stft) is Stft  # all or nothing
    for m in model.modules():
        assert not m._forward_hooks
        assert type(m) not in (MaskedConvolutionModule, MaskedConformerEncoderLayer)


def test_legacy_rel_pos_is_really_not_padding_invariant(tmp_path, monkeypatch):
    """Why legacy_rel_pos is refused: with every other fix applied its attention
    still depends on the padded length."""
    from espnet_multiblank.espnet.compat import legacy_module

    LegacyRelPositionMultiHeadedAttention = legacy_module(
        "nets.pytorch_backend.transformer.attention"
    ).LegacyRelPositionMultiHeadedAttention
    LegacyRelPositionalEncoding = legacy_module(
        "nets.pytorch_backend.transformer.embedding"
    ).LegacyRelPositionalEncoding

    monkeypatch.setattr(
        exact_encoding,
        "_PER_FRAME_OR_MASKED",
        exact_encoding._PER_FRAME_OR_MASKED
        + (LegacyRelPositionalEncoding, LegacyRelPositionMultiHeadedAttention),
    )
    model = build_model(_legacy_config(tmp_path), tmp_path / "m").eval()
    assert model.batch_exact_encoding.exact
    worst, wrong_lengths = padded_vs_alone(model, *waveforms(5, 8000, seed=1))
    assert wrong_lengths == 0 and worst > 1e-3


def test_idempotent_same_state_dict_deepcopy(models, tmp_path, monkeypatch):
    model = models(CONFIGS[-1])
    assert make_batch_exact(model).exact
    assert len(model.encoder.embed._forward_hooks) == 1
    stock = build_model(
        stock_espnet(load_config(CONFIGS[-1], tmp_path), monkeypatch), tmp_path / "s"
    )
    keys = {k for k in stock.state_dict() if not k.startswith("criterion")}
    assert keys <= set(model.state_dict())
    stock.load_state_dict(model.state_dict(), strict=False)
    clone = copy.deepcopy(model)
    speech, lengths = waveforms(4, 8000, seed=5)
    worst, wrong_lengths = padded_vs_alone(clone, speech, lengths)
    assert wrong_lengths == 0 and worst < ATOL


def test_utterance_mvn_padded_batch_equals_alone(tmp_path):
    """Utterance MVN takes its statistics over each utterance's valid frames."""
    config = load_config(CONFIGS[-1], tmp_path, normalize="utterance_mvn")
    config["normalize_conf"] = {"norm_vars": True}
    model = build_model(config, tmp_path / "m").eval()
    assert model.batch_exact_encoding.exact
    worst, wrong_lengths = padded_vs_alone(model, *waveforms(6, 8000, seed=11))
    assert wrong_lengths == 0 and worst < ATOL


@pytest.mark.parametrize("norm_means", [True, False])
@pytest.mark.parametrize("norm_vars", [True, False])
def test_exact_utterance_mvn_equals_espnet_alone(norm_means, norm_vars):
    from espnet2.layers.utterance_mvn import UtteranceMVN

    from espnet_multiblank.espnet.batch_exact.exact_layers import ExactUtteranceMVN

    g = torch.Generator().manual_seed(4)
    lengths = torch.tensor([30, 12, 21])
    x = torch.randn(3, 30, 5, generator=g) * 2 + 3
    espnet = UtteranceMVN(norm_means=norm_means, norm_vars=norm_vars)
    exact = ExactUtteranceMVN(norm_means=norm_means, norm_vars=norm_vars)
    batched, _ = exact(x.clone(), lengths)
    espnet_batched, _ = espnet(x.clone(), lengths)
    differs = False
    for b, n in enumerate(lengths.tolist()):
        alone, _ = espnet(x[b : b + 1, :n].clone(), lengths[b : b + 1])
        torch.testing.assert_close(batched[b, :n], alone[0])
        differs |= not torch.allclose(espnet_batched[b, :n], alone[0])
    # ESPnet 202511 subtracts the mean from the padded frames too, then counts them
    # (202611 zeroes them first)
    assert differs == (norm_means and norm_vars and not ESPNET_MASKS_ENCODER_PADDING)


def test_switch_off_keeps_espnet_layers_and_decoding_makes_them_exact(tmp_path):
    """``model_conf.batch_exact_encoding: false``: ESPnet's layers (the padded batch
    differs from each utterance alone, as in ESPnet) and the state dict of the
    default; the plug-in's batched decoding (its Speech2Text's batch_exactness,
    run on the first batch) still makes the loaded model exact."""
    from espnet_multiblank.espnet.inference.speech2text import PluginSearchMixin

    config = load_config(CONFIGS[-1], tmp_path)
    config["model_conf"]["batch_exact_encoding"] = False
    model = build_model(config, tmp_path / "off").eval()
    assert model.batch_exact_encoding == exact_encoding.BatchExactness(
        False, "model_conf.batch_exact_encoding is false"
    )
    assert type(model.frontend.stft) is Stft
    assert not any(
        type(m) in (MaskedConformerEncoderLayer, MaskedConvolutionModule)
        for m in model.modules()
    )
    default = build_model(load_config(CONFIGS[-1], tmp_path), tmp_path / "on")
    assert model.state_dict().keys() == default.state_dict().keys()
    speech, lengths = waveforms(8, 8000, seed=0)
    worst, wrong_lengths = padded_vs_alone(model, speech, lengths)
    assert_stock_espnet_differs(worst, wrong_lengths)

    decoding = types.SimpleNamespace(asr_model=model)
    assert PluginSearchMixin.batch_exactness(decoding).exact
    assert model.batch_exact_encoding.exact
    worst, wrong_lengths = padded_vs_alone(model, speech, lengths)
    assert wrong_lengths == 0 and worst < ATOL
