"""Small random models of every lattice kind and encoder for the export and runtime
tests, and their exports.

* :func:`make_experiment`: ``config.yaml`` + ``model.pth`` of a random standard,
  multi-blank ([2, 4]) or TDT model with a ``chunk_conformer``, ``conformer`` or
  ``transformer`` encoder, 8 kHz, built through ESPnet's ASR task (the plug-in
  registered), with weights that make it emit labels and blanks of every length;
* :func:`exported`: the model exported (cached per test session).
"""

from pathlib import Path

from streaming_cases import FS, TOKENS, build_experiment, stats_file, waveform

__all__ = ["FS", "TOKENS", "config", "exported", "make_experiment", "waveform"]

LATTICES = {
    "standard": {},
    "multiblank": {"transducer_multi_blank_durations": [2, 4]},
    "tdt": {"transducer_tdt_durations": [0, 1, 2, 3]},
    # non-contiguous durations: a duration's index is not its frames
    "tdt_gaps": {"transducer_tdt_durations": [0, 1, 2, 4]},
    # no duration 1: near the end no arc may fit (the searches' "stuck" rule)
    "tdt_no1": {
        "transducer_tdt_durations": [0, 2, 3],
        "transducer_allow_unreachable_lengths": True,
    },
}
ENCODERS = ("chunk_conformer", "conformer", "transformer")


def config(
    root: Path,
    lattice: str,
    encoder: str = "chunk_conformer",
    normalize: str = "global_mvn",
    token_type: str = "char",
    rnn_type: str = "lstm",
    num_layers: int = 1,
    model: str = "multiblank_espnet",
    frontend: str = "default",
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
    if frontend == "kaldi_fbank":  # frames of the same size: 100 samples every 40
        conf.update(
            frontend="kaldi_fbank",
            frontend_conf=dict(
                fs="8k", n_mels=n_mels, frame_length_ms=12.5, frame_shift_ms=5.0
            ),
        )
    elif frontend == "sherpa":  # kaldi_fbank as sherpa-onnx computes it (25 / 10 ms)
        conf.update(frontend="kaldi_fbank", frontend_conf=dict(fs="8k", n_mels=n_mels))
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
    """``root/config.yaml`` and ``root/model.pth`` of :func:`config`'s model, with
    the random weights of ``streaming_cases.build_experiment`` (sharpened joint
    outputs, ``blank_bias`` added to the blank logits)."""
    root.mkdir(parents=True, exist_ok=True)
    return build_experiment(
        root, config(root, lattice, encoder, **kw), seed, blank_bias
    )


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
