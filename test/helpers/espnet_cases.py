"""Tiny ``model: multiblank_espnet`` configs and builders shared by the ESPnet tests.

* :data:`TOKENS`: a 7-token char list (``<blank>`` first, as ESPnet's ``asr.sh``);
* :func:`tiny_config`: a one-block conformer transducer with big blanks [2, 4, 8]
  (``durations=()``: standard), :func:`tdt_config`: its TDT twin (:data:`DURS`);
  :func:`lattice_config`: the config of a lattice by name (:data:`LATTICES`);
* :data:`LAYOUTS`: what the model of each lattice's config must look like, written
  out by hand (token list, blank, durations, joint outputs, loss);
* :func:`build`: the model built through ESPnet's (or a given task's) parser;
* :func:`batch`: three short utterances with their labels.

Importing this module registers the plug-in (the configs name its classes).
"""

from dataclasses import dataclass
from typing import Tuple

import torch
import yaml

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

espnet_multiblank.register()

from espnet2.tasks.asr import ASRTask  # noqa: E402

TOKENS = ["<blank>", "<unk>", "a", "b", "c", "<space>", "<sos/eos>"]

#: the TDT durations of :func:`tdt_config`
DURS = [0, 1, 2, 3, 4]


def loss_backend() -> str:
    """The fused CPU kernel when it is importable, else the PyTorch backend."""
    try:
        from espnet_multiblank.loss.cpu import compute  # noqa: F401

        return "auto"
    except ImportError:
        return "torch"


def tiny_config(durations=(2, 4, 8), **model_conf):
    conf = dict(
        transducer_multi_blank_durations=list(durations),
        transducer_multi_blank_sigma=0.05,
        transducer_loss_backend=loss_backend(),
        ctc_weight=0.3,
        report_cer=False,
        report_wer=False,
    )
    conf.update(model_conf)
    return dict(
        model="multiblank_espnet",
        model_conf=conf,
        frontend="default",
        frontend_conf=dict(n_fft=128, win_length=128, hop_length=64, n_mels=20),
        normalize="utterance_mvn",
        encoder="conformer",
        encoder_conf=dict(
            output_size=16,
            attention_heads=2,
            linear_units=16,
            num_blocks=1,
            dropout_rate=0.0,
            positional_dropout_rate=0.0,
            attention_dropout_rate=0.0,
            input_layer="conv2d",
            cnn_module_kernel=3,
            rel_pos_type="latest",
            pos_enc_layer_type="rel_pos",
            selfattention_layer_type="rel_selfattn",
        ),
        decoder="transducer",
        decoder_conf=dict(rnn_type="lstm", num_layers=1, hidden_size=16),
        joint_net_conf=dict(joint_space_size=16),
    )


def tdt_config(durations=DURS, **model_conf):
    conf = dict(transducer_tdt_durations=list(durations))
    conf.update(model_conf)
    return tiny_config(durations=(), **conf)


#: the lattices of :func:`lattice_config`
LATTICES = ("standard", "multiblank", "tdt")


def lattice_config(lattice: str, **model_conf):
    """The tiny config of a lattice: standard (no big blanks, sigma 0), multi-blank
    (big blanks [2, 4, 8]) or TDT (:data:`DURS`); ``model_conf`` overrides."""
    if lattice == "tdt":
        return tdt_config(**model_conf)
    if lattice == "standard":
        return tiny_config(
            **{"durations": (), "transducer_multi_blank_sigma": 0.0, **model_conf}
        )
    if lattice == "multiblank":
        return tiny_config(**model_conf)
    raise ValueError(f"lattice must be one of {LATTICES}, got {lattice!r}")


@dataclass(frozen=True)
class Layout:
    """What the model built from :func:`lattice_config` must look like.

    Attributes:
        token_list: the model's token list (big blanks inserted before <blank>).
        blank: the standard blank's index.
        big_blank_durations, big_blank_ids: the big blanks (longest first in the
            token list: ids in the order of the durations).
        tdt_durations: a TDT's durations.
        joint_outputs: the joint network's outputs (a TDT: V + D).
        sigma: the loss's logit undernormalisation.
        criterion: the training loss' class name.
    """

    token_list: Tuple[str, ...]
    blank: int
    big_blank_durations: Tuple[int, ...]
    big_blank_ids: Tuple[int, ...]
    tdt_durations: Tuple[int, ...]
    joint_outputs: int
    sigma: float
    criterion: str

    @property
    def blank_ids(self) -> frozenset:
        return frozenset((self.blank,) + self.big_blank_ids)


LAYOUTS = {
    "standard": Layout(
        tuple(TOKENS), 0, (), (), (), len(TOKENS), 0.0, "MultiblankRNNTLoss"
    ),
    "multiblank": Layout(
        ("<blank8>", "<blank4>", "<blank2>", *TOKENS),
        3,
        (2, 4, 8),
        (2, 1, 0),
        (),
        len(TOKENS) + 3,
        0.05,
        "MultiblankRNNTLoss",
    ),
    "tdt": Layout(
        tuple(TOKENS), 0, (), (), tuple(DURS), len(TOKENS) + len(DURS), 0.05, "TDTLoss"
    ),
}


def build(tmp_path, config, *extra, task=ASRTask):
    """Parse ``config`` (a dict written as YAML) with ESPnet's ASRTask parser (or
    ``task``'s) and build it."""
    (tmp_path / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    args = task.get_parser().parse_args(
        ["--config", str(tmp_path / "config.yaml")]
        + ["--token_list", str(tmp_path / "tokens.txt")]
        + list(extra)
    )
    return task.build_model(args)


def batch(token_list, seed=0):
    """3 utterances "ab c", "bc", "a" (padded with -1) with random speech."""
    g = torch.Generator().manual_seed(seed)
    speech = torch.randn(3, 2400, generator=g)
    speech_lengths = torch.tensor([2400, 2000, 1600])
    ids = {t: i for i, t in enumerate(token_list)}
    rows = [["a", "b", "<space>", "c"], ["b", "c"], ["a"]]
    text = torch.full((3, 4), -1)
    for r, row in enumerate(rows):
        text[r, : len(row)] = torch.tensor([ids[t] for t in row])
    return speech, speech_lengths, text, torch.tensor([4, 2, 1])
