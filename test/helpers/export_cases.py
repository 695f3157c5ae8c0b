"""Small random models of every lattice kind and encoder for the export and runtime
tests, and their exports.

* :func:`make_experiment`: ``config.yaml`` + ``model.pth`` of a random standard,
  multi-blank ([2, 4]) or TDT model with a ``chunk_conformer``, ``conformer`` or
  ``transformer`` encoder, 8 kHz, built through ESPnet's ASR task (the plug-in
  registered), with weights that make it emit labels and blanks of every length;
* :func:`exported`: the model exported (cached per test session).
"""

from pathlib import Path

import numpy as np
import torch
import yaml

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

espnet_multiblank.register()

FS = 8000
TOKENS = ["<blank>", "<unk>", "a", "b", "c", "d", "<space>", "<sos/eos>"]
LATTICES = {
    "standard": {},
    "multiblank": {"transducer_multi_blank_durations": [2, 4]},
    "tdt": {"transducer_tdt_durations": [0, 1, 2, 3]},
    # non-contiguous durations: a duration's index is not its frames
    "tdt_gaps": {"transducer_tdt_durations": [0, 1, 2, 4]},
}
ENCODERS = ("chunk_conformer", "conformer", "transformer")


def stats_file(root: Path, dim: int) -> Path:
    """A global-MVN statistics file of ``dim`` features (random, seeded by dim)."""
    rng = np.random.default_rng(dim)
    mean, var = rng.normal(-5.0, 2.0, dim), rng.uniform(1.0, 9.0, dim)
    path = root / "feats_stats.npz"
    np.savez(path, count=1000.0, sum=mean * 1000, sum_square=(var + mean**2) * 1000)
    return path


def config(
    root: Path,
    lattice: str,
    encoder: str = "chunk_conformer",
    normalize: str = "global_mvn",
    token_type: str = "char",
    rnn_type: str = "lstm",
    num_layers: int = 1,
    model: str = "multiblank_espnet",
) -> dict:
    """The training config of a tiny model (``model``: the plug-in's
    ``multiblank_espnet`` or ESPnet's own ``espnet``, whose multi-blank models need no
    plug-in in training)."""
    n_mels = 10
    enc_conf = dict(
        output_size=16,
        attention_heads=2,
        linear_units=16,
        num_blocks=2,
        dropout_rate=0.0,
        positional_dropout_rate=0.0,
        attention_dropout_rate=0.0,
        input_layer="conv2d",
    )
    if encoder in ("chunk_conformer", "conformer"):
        enc_conf.update(
            cnn_module_kernel=3,
            rel_pos_type="latest",
            pos_enc_layer_type="rel_pos",
            selfattention_layer_type="rel_selfattn",
        )
    if encoder == "chunk_conformer":
        enc_conf.update(chunk_size_range=[1, 4])
    conf = dict(
        token_type=token_type,
        model=model,
        model_conf=dict(
            LATTICES[lattice], ctc_weight=0.3, report_cer=False, report_wer=False
        ),
        frontend="default",
        frontend_conf=dict(
            fs="8k", n_fft=128, win_length=100, hop_length=40, n_mels=n_mels
        ),
        encoder=encoder,
        encoder_conf=enc_conf,
        decoder="transducer",
        decoder_conf=dict(rnn_type=rnn_type, num_layers=num_layers, hidden_size=16),
        joint_net_conf=dict(joint_space_size=16),
    )
    if normalize == "global_mvn":
        conf.update(
            normalize="global_mvn",
            normalize_conf=dict(stats_file=str(stats_file(root, n_mels))),
        )
    elif normalize is not None:
        conf.update(normalize=normalize)
    return conf


def make_experiment(
    root: Path,
    lattice: str,
    encoder: str = "chunk_conformer",
    seed: int = 0,
    blank_bias: float = 0.5,
    **kw,
) -> Path:
    """``root/config.yaml`` and ``root/model.pth``: random weights, random
    batch-norm statistics, sharpened joint outputs and ``blank_bias`` added to the
    blank logits (short hypotheses that still emit labels)."""
    from espnet2.tasks.asr import ASRTask

    root.mkdir(parents=True, exist_ok=True)
    conf = config(root, lattice, encoder, **kw)
    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (root / "train.yaml").write_text(yaml.safe_dump(conf))
    ASRTask.main(
        cmd=[
            "--dry_run",
            "true",
            "--output_dir",
            str(root),
            "--config",
            str(root / "train.yaml"),
            "--token_list",
            str(root / "tokens.txt"),
        ]
    )
    torch.manual_seed(seed)
    model, _ = ASRTask.build_model_from_file(root / "config.yaml", None, "cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
        model.joint_network.lin_out.weight.mul_(3.0)
        bias = model.joint_network.lin_out.bias
        blank = model.blank_id
        big = getattr(model, "big_blank_durations", None)
        if big is None:  # ESPnet's own model
            big = getattr(model, "transducer_multi_blank_durations", None) or ()
        bias[blank - len(big) : blank + 1] += blank_bias
    torch.save(model.state_dict(), root / "model.pth")
    return root


def waveform(samples: int, seed: int) -> np.ndarray:
    """float32 noise and a tone that changes pitch."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / FS
    tone = 0.2 * np.sin(2 * np.pi * (300 + 200 * (seed % 7) + 150 * t) * t)
    return (tone + 0.05 * rng.standard_normal(samples)).astype(np.float32)


def exported(cache: dict, tmp_root: Path, lattice: str, encoder: str, **kw) -> Path:
    """The exported directory of :func:`make_experiment`'s model (made once per
    ``cache`` dict, e.g. a session fixture's)."""
    from espnet_multiblank.export.exporter import export_model

    key = (lattice, encoder, tuple(sorted(kw.items())))
    if key not in cache:
        name = "_".join([lattice, encoder] + [f"{k}{v}" for k, v in sorted(kw.items())])
        exp = make_experiment(tmp_root / name, lattice, encoder, **kw)
        export_model(
            exp / "config.yaml", exp / "model.pth", tmp_root / (name + "_onnx")
        )
        cache[key] = (exp, tmp_root / (name + "_onnx"))
    return cache[key]
