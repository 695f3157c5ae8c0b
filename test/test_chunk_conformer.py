"""``encoder: chunk_conformer``: chunk masks, chunk-by-chunk == masked forward,
causality, batch-exactness, dynamic chunk training, registration, training.

Oracles: the mask against its definition written as loops; the chunk-by-chunk forward
(caches) against the full forward with the chunk mask; the full forward against
itself with later input changed (a chunk's output must not move); every utterance
of a padded batch against the utterance alone.
"""

import copy

import numpy as np
import pytest
import torch
import yaml
from espnet_cases import TOKENS
from streaming_cases import config as streaming_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

espnet_multiblank.register()

from espnet2.tasks.asr import ASRTask  # noqa: E402

from espnet_multiblank.espnet.batch_exact.exact_encoding import (  # noqa: E402
    make_batch_exact,
)
from espnet_multiblank.espnet.encoders.chunk_conformer import (  # noqa: E402
    ChunkConformerEncoder,
)
from espnet_multiblank.espnet.encoders.chunk_masks import (  # noqa: E402
    chunk_mask,
    draw_chunk,
)
from espnet_multiblank.espnet.errors import ConfigError  # noqa: E402

IDIM = 20  # feature size (conv2d8 needs >= 15)
# float32 rounding of the same computation on differently shaped tensors
ATOL = 2e-5


def encoder(seed=0, **conf):
    """A tiny chunk conformer in eval mode with random batch-norm statistics."""
    kw = dict(
        output_size=16,
        attention_heads=2,
        linear_units=24,
        num_blocks=2,
        cnn_module_kernel=5,
        dropout_rate=0.0,
        positional_dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    kw.update(conf)
    torch.manual_seed(seed)
    enc = ChunkConformerEncoder(IDIM, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in enc.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
    return enc.eval()


def chunk_by_chunk(enc, feats, chunk, frames):
    """The encoder output of ``feats`` (1, F, IDIM) computed chunk by chunk."""
    stream = enc.init_stream(1, chunk)
    outs, k = [], 0
    while k < frames:
        c = min(chunk, frames - k)
        start = enc.subsampling * k
        outs.append(
            enc.forward_chunk(feats[:, start : start + enc.input_frames(c)], stream)
        )
        k += c
    assert stream.frames == frames
    return torch.cat(outs, 1)


def test_chunk_mask_is_its_definition():
    for T, chunk, left in [(7, 1, -1), (10, 3, -1), (10, 3, 0), (11, 2, 1), (5, 8, 2)]:
        got = chunk_mask(T, chunk, left, torch.device("cpu"))
        for i in range(T):
            for j in range(T):
                ci, cj = i // chunk, j // chunk
                want = cj <= ci and (left < 0 or cj >= ci - left)
                assert bool(got[i, j]) == want, (T, chunk, left, i, j)


@pytest.mark.parametrize(
    "input_layer, chunk, left, macaron, cnn",
    [
        ("conv2d", 1, -1, False, True),
        ("conv2d", 4, -1, True, True),
        ("conv2d", 3, 1, False, True),
        ("conv2d", 5, 0, False, False),
        ("conv2d", 64, -1, False, True),  # one chunk longer than the utterance
        ("conv2d2", 4, 2, False, True),
        ("conv2d6", 2, -1, True, True),
        ("conv2d8", 3, -1, False, True),
        ("conv2d1", 7, 1, False, True),
    ],
)
def test_chunk_by_chunk_equals_the_chunk_masked_forward(
    input_layer, chunk, left, macaron, cnn
):
    enc = encoder(input_layer=input_layer, macaron_style=macaron, use_cnn_module=cnn)
    feats = torch.randn(1, 93, IDIM, generator=torch.Generator().manual_seed(1))
    enc.set_decoding_chunk(chunk, left)
    full, lens, _ = enc(feats, torch.tensor([93]))
    assert int(lens) == full.size(1) > chunk or chunk == 64
    streamed = chunk_by_chunk(enc, feats, chunk, full.size(1))
    torch.testing.assert_close(streamed, full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunk, left", [(3, -1), (4, 1)])
def test_a_chunk_never_sees_later_input(chunk, left):
    enc = encoder()
    enc.set_decoding_chunk(chunk, left)
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(1, 80, IDIM, generator=g)
    full, _, _ = enc(feats, torch.tensor([80]))
    T = full.size(1)
    for k in range(0, T, chunk):
        end = min(k + chunk, T)  # chunk [k, end) reads input up to this frame
        last_input = enc.input_frames(end)
        changed = feats.clone()
        changed[:, last_input:] = torch.randn(1, 80 - last_input, IDIM, generator=g)
        out, _, _ = enc(changed, torch.tensor([80]))
        assert torch.equal(out[:, :end], full[:, :end])
        if end < T:  # the next frame does see it (the test can fail)
            assert not torch.equal(out[:, end:], full[:, end:])


def test_full_context_sees_the_future_and_chunks_do_not():
    enc = encoder()
    feats = torch.randn(1, 60, IDIM, generator=torch.Generator().manual_seed(3))
    enc.set_decoding_chunk(0)
    full_context, _, _ = enc(feats, torch.tensor([60]))
    enc.set_decoding_chunk(2)
    chunked, _, _ = enc(feats, torch.tensor([60]))
    # the last chunk sees everything before it either way; the first does not
    assert not torch.allclose(full_context[:, :2], chunked[:, :2], atol=1e-3)


@pytest.mark.parametrize("chunk, left", [(0, -1), (1, -1), (4, -1), (3, 1)])
def test_padded_batch_equals_each_utterance_alone(chunk, left):
    enc = encoder()
    enc.set_decoding_chunk(chunk, left)
    g = torch.Generator().manual_seed(4)
    lens = torch.tensor([71, 40, 15, 58])
    feats = torch.randn(4, 71, IDIM, generator=g)
    feats = feats.masked_fill(
        torch.arange(71)[None, :, None] >= lens[:, None, None], 7.0
    )
    out, olens, _ = enc(feats, lens)
    for b, n in enumerate(lens.tolist()):
        alone, alone_len, _ = enc(feats[b : b + 1, :n], lens[b : b + 1])
        assert int(alone_len) == int(olens[b]) == alone.size(1)
        torch.testing.assert_close(out[b, : alone.size(1)], alone[0], atol=ATOL, rtol=0)


def test_training_ignores_padding_and_its_batch_norm_statistics():
    """Train mode (batch statistics), fixed chunk: valid frames and running
    statistics do not depend on what the padding holds."""
    enc = encoder(dynamic_chunk_training=False, decoding_chunk_size=3).train()
    g = torch.Generator().manual_seed(5)
    lens = torch.tensor([60, 33, 47])
    feats = torch.randn(3, 60, IDIM, generator=g)
    pad = torch.arange(60)[None, :, None] >= lens[:, None, None]
    outs, stats = [], []
    for fill in (0.0, 5.0):
        m = copy.deepcopy(enc)
        out, olens, _ = m(feats.masked_fill(pad, fill), lens)
        outs.append([out[b, :n] for b, n in enumerate(olens.tolist())])
        bn = m.encoders[0].conv_module.norm
        stats.append((bn.running_mean.clone(), bn.running_var.clone()))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for a, b in zip(*stats):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_dynamic_chunk_training_draws():
    g = torch.Generator().manual_seed(0)
    draws = [draw_chunk(0.3, (2, 6), g) for _ in range(4000)]
    full = sum(d == 0 for d in draws) / len(draws)
    assert abs(full - 0.3) < 0.03
    sizes = [d for d in draws if d]
    assert set(sizes) == {2, 3, 4, 5, 6}
    enc = encoder(chunk_size_range=[2, 6], full_context_prob=0.3, decoding_chunk_size=5)
    assert enc.current_chunk() == 5  # eval: the decoding chunk
    enc.train()
    torch.manual_seed(0)
    assert {enc.current_chunk() for _ in range(200)} == {0, 2, 3, 4, 5, 6}


@pytest.mark.parametrize(
    "key, value",
    [
        ("rel_pos_type", "legacy"),
        ("pos_enc_layer_type", "abs_pos"),
        ("normalize_before", False),
        ("input_layer", "linear"),
        ("chunk_size_range", [4, 2]),
        ("full_context_prob", 1.5),
        ("num_left_chunks", -2),
        ("decoding_chunk_size", -1),
    ],
)
def test_unsupported_values_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"encoder_conf.{key}"):
        ChunkConformerEncoder(12, **{key: value})


def test_bad_chunk_arguments():
    enc = encoder()
    with pytest.raises(ValueError, match="chunk_size"):
        enc.set_decoding_chunk(-1)
    with pytest.raises(ValueError, match="num_left_chunks"):
        enc.set_decoding_chunk(2, -3)
    with pytest.raises(ValueError, match="chunk"):
        enc.init_stream(1, 0)
    stream = enc.init_stream(1, 2)
    with pytest.raises(ValueError, match="feats must hold"):
        enc.forward_chunk(torch.zeros(1, enc.input_frames(3), IDIM), stream)


def build(root, config):
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
    torch.manual_seed(0)
    return ASRTask.build_model(args)


def test_selectable_from_a_config_and_batch_exact_from_the_waveform(tmp_path):
    model = build(tmp_path, streaming_config(tmp_path, "multiblank", 12, 1))
    assert type(model.encoder) is ChunkConformerEncoder
    assert make_batch_exact(model).exact
    model.eval()
    model.encoder.set_decoding_chunk(2)
    g = torch.Generator().manual_seed(6)
    lens = torch.tensor([4000, 2300, 3100])
    speech = 0.1 * torch.randn(3, 4000, generator=g)
    speech = speech.masked_fill(torch.arange(4000)[None] >= lens[:, None], 0.3)
    with torch.no_grad():
        enc, enc_lens = model.encode(speech, lens)
        for b, n in enumerate(lens.tolist()):
            alone, alone_len = model.encode(speech[b : b + 1, :n], lens[b : b + 1])
            assert int(alone_len) == int(enc_lens[b])
            torch.testing.assert_close(
                enc[b, : int(alone_len)], alone[0], atol=ATOL, rtol=0
            )


@pytest.mark.slow
def test_trains_through_espnets_trainer(tmp_path):
    """collect_stats and 4 epochs of ESPnet's trainer with dynamic chunks: finite,
    decreasing losses; the saved model rebuilds with the chunk encoder."""
    from espnet_experiments import (
        N_EPOCHS,
        collect_stats_and_train,
        train_config,
        write_training_data,
    )

    write_training_data(tmp_path)
    config = train_config("multiblank")
    config["encoder"] = "chunk_conformer"
    conf = dict(config["encoder_conf"], chunk_size_range=[1, 3], full_context_prob=0.5)
    for key in ("rel_pos_type", "pos_enc_layer_type", "selfattention_layer_type"):
        conf.pop(key)
    config["encoder_conf"] = conf
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    collect_stats_and_train(tmp_path)
    exp = tmp_path / "exp"
    ckpt = torch.load(exp / "checkpoint.pth", map_location="cpu", weights_only=False)
    stats = ckpt["reporter"]["stats"]
    train = [float(stats[e]["train"]["loss"]) for e in range(1, N_EPOCHS + 1)]
    assert all(np.isfinite(train)) and train[-1] < 0.95 * train[0], train
    model, _ = ASRTask.build_model_from_file(
        exp / "config.yaml", exp / f"{N_EPOCHS}epoch.pth", "cpu"
    )
    assert type(model.encoder) is ChunkConformerEncoder
    assert model.encoder.chunk_size_range == (1, 3)
