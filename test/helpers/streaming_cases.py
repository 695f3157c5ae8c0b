"""Tiny ``encoder: chunk_conformer`` experiments and waveforms for the streaming tests.

* :func:`make_experiment`: ``config.yaml`` + ``model.pth`` of a random standard,
  multi-blank ([2, 4]) or TDT (0..3) model at 8 kHz with global MVN (what the recipe
  uses), built through ESPnet's ASR task (the plug-in registered);
* :func:`waveform`, :func:`write_scp`: noise and tones, and a ``wav.scp``;
* :func:`speech2text`: the plug-in's ``Speech2Text`` of an experiment.
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
KINDS = {
    "standard": {},
    "multiblank": {"transducer_multi_blank_durations": [2, 4]},
    "tdt": {"transducer_tdt_durations": [0, 1, 2, 3]},
}


def stats_file(root: Path, dim: int) -> Path:
    """A global-MVN statistics file of ``dim`` features (random, seeded by dim)."""
    rng = np.random.default_rng(dim)
    mean, var = rng.normal(-5.0, 2.0, dim), rng.uniform(1.0, 9.0, dim)
    path = root / "feats_stats.npz"
    np.savez(path, count=1000.0, sum=mean * 1000, sum_square=(var + mean**2) * 1000)
    return path


def config(
    root: Path,
    kind: str,
    n_mels: int = 10,
    num_blocks: int = 2,
    frontend: str = "default",
) -> dict:
    """The training config of a tiny chunk-conformer model of ``kind`` (``frontend``:
    ESPnet's ``default`` or the plug-in's ``kaldi_fbank``, with frames of the same
    size: 100 samples every 40)."""
    conf = dict(
        token_type="char",
        model="multiblank_espnet",
        model_conf=dict(
            KINDS[kind], ctc_weight=0.3, report_cer=False, report_wer=False
        ),
        frontend="default",
        frontend_conf=dict(
            fs="8k", n_fft=128, win_length=100, hop_length=40, n_mels=n_mels
        ),
        normalize="global_mvn",
        normalize_conf=dict(stats_file=str(stats_file(root, n_mels))),
        encoder="chunk_conformer",
        encoder_conf=dict(
            output_size=16,
            attention_heads=2,
            linear_units=16,
            num_blocks=num_blocks,
            cnn_module_kernel=3,
            dropout_rate=0.0,
            positional_dropout_rate=0.0,
            attention_dropout_rate=0.0,
            chunk_size_range=[1, 4],
        ),
        decoder="transducer",
        decoder_conf=dict(rnn_type="lstm", num_layers=1, hidden_size=16),
        joint_net_conf=dict(joint_space_size=16),
    )
    if frontend == "kaldi_fbank":
        conf.update(
            frontend="kaldi_fbank",
            frontend_conf=dict(
                fs="8k", n_mels=n_mels, frame_length_ms=12.5, frame_shift_ms=5.0
            ),
        )
    return conf


def make_experiment(
    root: Path,
    kind: str,
    seed: int = 0,
    blank_bias: float = 0.5,
    frontend: str = "default",
):
    """``root/config.yaml`` and ``root/model.pth`` (random weights, random batch-norm
    statistics, ``blank_bias`` added to the blank logits: short hypotheses)."""
    root.mkdir(parents=True, exist_ok=True)
    conf = config(root, kind, frontend=frontend)
    return build_experiment(root, conf, seed, blank_bias)


def build_experiment(root: Path, conf: dict, seed: int = 0, blank_bias: float = 0.5):
    """The model of the training config ``conf`` (ESPnet's dry run writes
    ``root/config.yaml``), saved as ``root/model.pth`` with random batch-norm
    statistics, joint outputs times 3 and ``blank_bias`` added to every blank's
    logit (the plug-in's model or ESPnet's own)."""
    from espnet2.tasks.asr import ASRTask

    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (root / "train.yaml").write_text(yaml.safe_dump(conf))
    ASRTask.main(  # writes root/config.yaml, the full training arguments
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


def speech2text(exp: Path, **kwargs):
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    return MultiblankSpeech2Text(
        asr_train_config=str(exp / "config.yaml"),
        asr_model_file=str(exp / "model.pth"),
        device="cpu",
        **kwargs,
    )


def waveform(samples: int, seed: int) -> np.ndarray:
    """float32 noise and a tone that changes pitch."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / FS
    tone = 0.2 * np.sin(2 * np.pi * (300 + 200 * seed + 150 * t) * t)
    return (tone + 0.05 * rng.standard_normal(samples)).astype(np.float32)


def write_scp(root: Path, lengths, seed: int = 0) -> Path:
    import soundfile

    lines = []
    for i, n in enumerate(lengths):
        wav = root / f"u{i}.wav"
        soundfile.write(wav, waveform(n, seed + i), FS)
        lines.append(f"u{i} {wav}")
    scp = root / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    return scp


def pieces(speech: np.ndarray, size: int):
    """``speech`` cut into pieces of ``size`` samples (0: one piece), the last one
    final (possibly empty)."""
    if size <= 0:
        return [(speech, True)]
    out = [(speech[i : i + size], False) for i in range(0, len(speech), size)]
    out.append((speech[:0], True))
    return out
