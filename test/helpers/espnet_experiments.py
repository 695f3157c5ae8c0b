"""ESPnet experiments on disk for the end-to-end tests: random models written by a
task's ``--dry_run``, and tiny trainings through the plug-in's entry point.

* :func:`dry_run_experiment`: ``exp/config.yaml`` written by ESPnet's own
  ``Task.main(--dry_run true)`` (ASRTask or, e.g., LMTask) and ``exp/model.pth``: the
  model it describes with torch seed 0, edited in place by the caller (joint-network
  biases that make a random model emit labels and blanks, ...);
  :func:`asr_model_args`: the arguments of a tiny RNN-encoder transducer for it;
  the decoding tests' random models: :func:`make_experiment` (standard or
  multi-blank), :func:`make_tdt_experiment`;
* training: :data:`TEXTS` as utterances (:func:`write_training_data`), the entry
  point's arguments (:func:`training_args`), a config (:func:`train_config`) and
  ``--collect_stats`` then the training (:func:`collect_stats_and_train`).
"""

from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import soundfile
import torch
from espnet_cases import TOKENS, lattice_config

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.bin import asr_train

# ------------------------------------------------------------------------ dry runs


#: a one-layer RNN encoder (not batch-exact)
RNN_ENCODER = [
    "--encoder",
    "rnn",
    "--encoder_conf",
    "{num_layers: 1, hidden_size: 16, output_size: 16, subsample: [1, 2]}",
]


def asr_model_args(
    model: str = "espnet",
    model_conf: str = "{}",
    encoder: Sequence[str] = RNN_ENCODER,
    frontend_conf: str = "{n_fft: 256, hop_length: 128, n_mels: 8}",
) -> list:
    """ASRTask arguments of a tiny char transducer: ``model`` (ESPnet's own
    ``espnet`` or the plug-in's ``multiblank_espnet``) with ``model_conf`` (YAML),
    the ``encoder`` arguments, a 16-unit prediction and joint network."""
    return [
        "--model",
        model,
        "--model_conf",
        model_conf,
        "--token_type",
        "char",
        "--frontend_conf",
        frontend_conf,
        "--decoder",
        "transducer",
        "--decoder_conf",
        "{hidden_size: 16}",
        "--joint_net_conf",
        "{joint_space_size: 16}",
        *encoder,
    ]


def dry_run_experiment(
    exp: Path,
    args: Sequence[str],
    edit: Optional[Callable[[torch.nn.Module], None]] = None,
    task=None,
    tokens: Sequence[str] = TOKENS,
) -> Path:
    """``task --dry_run`` (default ESPnet's ASRTask) writes ``exp/config.yaml``; the
    model it describes, built with torch seed 0 and edited in place by ``edit``
    (under ``torch.no_grad``), is saved as ``exp/model.pth``.

    Args:
        exp: the experiment folder (created); its token list is written beside it
            as ``<exp name>_tokens.txt``.
        args: the task's other arguments (model, networks, ...).
        edit: changes the random model's weights (None: kept).
        task: an ESPnet task class (default ``espnet2.tasks.asr.ASRTask``).
        tokens: the token list.

    Returns:
        ``exp``.
    """
    if task is None:
        from espnet2.tasks.asr import ASRTask as task
    token_file = exp.parent / f"{exp.name}_tokens.txt"
    token_file.write_text("\n".join(tokens) + "\n")
    task.main(
        cmd=["--dry_run", "true", "--output_dir", str(exp)]
        + ["--token_list", str(token_file)]
        + list(args)
    )
    torch.manual_seed(0)
    model, _ = task.build_model_from_file(exp / "config.yaml", None, "cpu")
    if edit is not None:
        with torch.no_grad():
            edit(model)
    torch.save(model.state_dict(), exp / "model.pth")
    return exp


#: added to the blank logits (big blanks included) of :func:`make_experiment`'s
#: random joint network: a few labels, mostly blanks (short hypotheses)
BLANK_BIAS = 1.0
#: the durations of :func:`make_tdt_experiment`
DECODE_TDT_DURS = [0, 1, 2, 3]


def make_experiment(
    root: Path,
    durations=None,
    model: str = "espnet",
    blank_bias: float = BLANK_BIAS,
    scale: float = 1.0,
) -> Path:
    """``root/exp``: a random standard or multi-blank (big blanks ``durations``)
    transducer of ``model`` (ESPnet's own ``espnet``: the big blanks through ESPnet's
    own ``transducer_multi_blank_durations``) with ``blank_bias`` added to the joint
    network's blank logits and its output weights times ``scale`` (sharper,
    encoder-dependent decisions)."""
    model_conf = "{}"
    if durations:
        model_conf = "{transducer_multi_blank_durations: %s}" % list(durations)
    n_blanks = len(durations or ())

    def edit(asr_model):
        out = asr_model.joint_network.lin_out
        out.bias[asr_model.blank_id - n_blanks : asr_model.blank_id + 1] += blank_bias
        out.weight.mul_(scale)

    return dry_run_experiment(root / "exp", asr_model_args(model, model_conf), edit)


def make_tdt_experiment(root: Path) -> Path:
    """``root/exp``: a random ``model: multiblank_espnet`` TDT (durations
    :data:`DECODE_TDT_DURS`) whose joint network emits labels, long blanks and
    labels that move."""
    model_conf = "{transducer_tdt_durations: %s}" % DECODE_TDT_DURS

    def edit(model):
        model.joint_network.lin_out.weight.mul_(10.0)
        model.joint_network.lin_out.bias[0] += 0.5

    return dry_run_experiment(
        root / "exp", asr_model_args("multiblank_espnet", model_conf), edit
    )


# ------------------------------------------------------------------------ decoding


def inference_args(exp: Path, scp: Path, out: Path, *extra: str) -> list:
    """The inference entry points' arguments that decode ``scp`` (a wav.scp) with
    the experiment ``exp`` (``config.yaml``, ``model.pth``) into ``out``, then
    ``extra``."""
    return [
        "--asr_train_config",
        str(exp / "config.yaml"),
        "--asr_model_file",
        str(exp / "model.pth"),
        "--data_path_and_name_and_type",
        f"{scp},speech,sound",
        "--output_dir",
        str(out),
        *extra,
    ]


# ------------------------------------------------------------------------ training

#: epochs of the tiny trainings (one batch of the 8 utterances each)
N_EPOCHS = 4
TEXTS = ["ab c", "ba", "cab", "c a", "abc", "b", "ca b", "aa"]


def write_training_data(root: Path, short=()) -> None:
    """:data:`TEXTS` as utterances of 3200, 3600 or 4000 samples (``wav.scp``,
    ``text``, ``tokens.txt`` in ``root``); ``short`` adds utterances of 300 samples
    (3 STFT frames: too short for conv2d subsampling, 0 encoder frames) with those
    texts."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "wav.scp", "w") as scp, open(root / "text", "w") as txt:
        for i, text in enumerate(list(TEXTS) + list(short)):
            key = f"utt{i}"
            path = root / f"{key}.wav"
            n = 3200 + 400 * (i % 3) if i < len(TEXTS) else 300
            soundfile.write(path, 0.1 * rng.standard_normal(n), 16000, subtype="PCM_16")
            scp.write(f"{key} {path}\n")
            txt.write(f"{key} {text}\n")
    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")


def training_args(root: Path) -> list:
    """The entry point's arguments for the data of :func:`write_training_data` and
    ``root/train.yaml`` on CPU (no workers, seed 0)."""
    data = [
        "--train_data_path_and_name_and_type",
        f"{root}/wav.scp,speech,sound",
        "--train_data_path_and_name_and_type",
        f"{root}/text,text,text",
        "--valid_data_path_and_name_and_type",
        f"{root}/wav.scp,speech,sound",
        "--valid_data_path_and_name_and_type",
        f"{root}/text,text,text",
    ]
    return data + [
        "--config",
        f"{root}/train.yaml",
        "--token_list",
        f"{root}/tokens.txt",
        "--token_type",
        "char",
        "--use_preprocessor",
        "true",
        "--ngpu",
        "0",
        "--num_workers",
        "0",
        "--seed",
        "0",
    ]


def train_config(lattice: str = "multiblank", **model_conf) -> dict:
    """``espnet_cases.lattice_config(lattice, **model_conf)`` trained with Adam for
    :data:`N_EPOCHS` epochs of one batch, the best model by the valid loss."""
    config = lattice_config(lattice, **model_conf)
    config.update(
        optim="adam",
        optim_conf=dict(lr=0.005),
        batch_type="unsorted",
        batch_size=8,
        max_epoch=N_EPOCHS,
        num_att_plot=0,
        keep_nbest_models=1,
        use_tensorboard=False,
        best_model_criterion=[["valid", "loss", "min"]],
    )
    return config


def collect_stats_and_train(root: Path, main=asr_train.main) -> None:
    """``--collect_stats`` into ``root/stats``, then the training into
    ``root/exp``, with ``main`` (default the plug-in's entry point)."""
    main(
        training_args(root)
        + ["--collect_stats", "true", "--output_dir", f"{root}/stats"]
        + ["--train_shape_file", f"{root}/wav.scp"]
        + ["--valid_shape_file", f"{root}/wav.scp"]
    )
    main(
        training_args(root)
        + ["--output_dir", f"{root}/exp"]
        + ["--train_shape_file", f"{root}/stats/train/speech_shape"]
        + ["--valid_shape_file", f"{root}/stats/valid/speech_shape"]
    )
