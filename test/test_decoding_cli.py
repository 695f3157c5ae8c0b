"""End-to-end: ``espnet_multiblank.bin.asr_inference`` on tiny random models.

The in-process tests use ESPnet's own ``model: espnet`` (standard, and multi-blank via
``model_conf.transducer_multi_blank_durations``), so they do not need the plug-in's
registration; the subprocess test runs the real CLI (``register()`` first) with
``model: multiblank_espnet`` and is skipped while that code is absent.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf" / "decode"
STATS_KEYS = {
    "num_utterances",
    "audio_seconds",
    "decode_seconds",
    "rtf",
    "total_frames",
    "frames_skipped_by_big_blanks",
    "big_blank_emissions",
}
TOKENS = ["<blank>", "<unk>", "a", "b", "c", "<space>", "<sos/eos>"]
LENGTHS = [8000, 12000, 4000]  # samples at 16 kHz
BLANK_BIAS = 1.0  # added to the blank logits of the random joint network


def _train_args(model="espnet", durations=None):
    model_conf = "{}"
    if durations:
        model_conf = "{transducer_multi_blank_durations: %s}" % list(durations)
    return [
        "--model",
        model,
        "--token_type",
        "char",
        "--decoder",
        "transducer",
        "--decoder_conf",
        "{hidden_size: 16}",
        "--joint_net_conf",
        "{joint_space_size: 16}",
        "--encoder",
        "rnn",
        "--encoder_conf",
        "{num_layers: 1, hidden_size: 16, output_size: 16, subsample: [1, 2]}",
        "--frontend_conf",
        "{n_fft: 256, hop_length: 128, n_mels: 8}",
        "--model_conf",
        model_conf,
    ]


def make_experiment(
    root: Path, durations=None, model="espnet", blank_bias=BLANK_BIAS
) -> Path:
    """config.yaml (ASRTask --dry_run) + model.pth with ``blank_bias`` added to the
    joint network's blank logits."""
    from espnet2.tasks.asr import ASRTask

    exp = root / "exp"
    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    ASRTask.main(
        cmd=[
            "--dry_run",
            "true",
            "--output_dir",
            str(exp),
            "--token_list",
            str(root / "tokens.txt"),
        ]
        + _train_args(model, durations)
    )
    torch.manual_seed(0)
    asr_model, _ = ASRTask.build_model_from_file(exp / "config.yaml", None, "cpu")
    n_blanks = len(durations or ())
    with torch.no_grad():  # a few labels, mostly blanks: short hypotheses
        bias = asr_model.joint_network.lin_out.bias
        bias[asr_model.blank_id - n_blanks : asr_model.blank_id + 1] += blank_bias
    torch.save(asr_model.state_dict(), exp / "model.pth")
    return exp


def make_data(root: Path) -> Path:
    import soundfile

    rng = np.random.default_rng(0)
    lines = []
    for i, n in enumerate(LENGTHS):
        wav = root / f"u{i}.wav"
        soundfile.write(wav, (0.1 * rng.standard_normal(n)).astype(np.float32), 16000)
        lines.append(f"u{i} {wav}")
    scp = root / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    return scp


def run_inference(exp: Path, scp: Path, out: Path, conf: str, *extra: str):
    from espnet_multiblank.bin.asr_inference import get_parser, inference

    args = get_parser().parse_args(
        [
            "--config",
            str(CONF / conf),
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
    )
    kwargs = vars(args)
    kwargs.pop("config", None)
    torch.set_num_threads(1)
    inference(**kwargs)
    return check_outputs(out)


def check_outputs(out: Path):
    stats = json.loads((out / "decoding_stats.json").read_text())
    assert STATS_KEYS <= set(stats)
    assert stats["num_utterances"] == len(LENGTHS)
    assert stats["audio_seconds"] == pytest.approx(sum(LENGTHS) / 16000)
    assert stats["decode_seconds"] > 0
    assert stats["rtf"] == pytest.approx(
        stats["decode_seconds"] / stats["audio_seconds"]
    )
    # the search alone is part of the decoding loop's wall time
    assert 0 < stats["search_seconds"] <= stats["decode_seconds"]
    assert stats["total_frames"] > 0
    assert stats["frames_skipped_by_big_blanks"] >= stats["big_blank_emissions"]
    best = out / "1best_recog"
    for name in ("text", "token", "token_int", "score"):
        keys = [
            line.split(maxsplit=1)[0] for line in (best / name).read_text().splitlines()
        ]
        assert sorted(keys) == [f"u{i}" for i in range(len(LENGTHS))], name
    return stats


def test_transducer_conf_on_the_command_line():
    from espnet_multiblank.bin.asr_inference import get_parser

    base = ["--output_dir", "x", "--data_path_and_name_and_type", "a,speech,sound"]
    for value in (
        "search_type=mb_beam,max_sym_per_frame=5",
        "{search_type: mb_beam, max_sym_per_frame: 5}",
    ):
        args = get_parser().parse_args(base + ["--transducer_conf", value])
        assert args.transducer_conf == {
            "search_type": "mb_beam",
            "max_sym_per_frame": 5,
        }
    args = get_parser().parse_args(base + ["--config", str(CONF / "mb_beam.yaml")])
    assert args.transducer_conf["search_type"] == "mb_beam" and args.beam_size == 4
    with pytest.raises(SystemExit):
        get_parser().parse_args(base + ["--transducer_conf", "mb_beam"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode")
    return root, make_data(root)


@pytest.fixture(scope="module")
def mb_exp(workdir):
    root = workdir[0] / "mb"
    root.mkdir()
    return make_experiment(root, durations=(2, 4))


@pytest.fixture(scope="module")
def std_exp(workdir):
    """ESPnet's standard transducer model; its loss needs ``warprnnt_pytorch`` (a
    separately built package, absent here) only to be constructed: stub it."""
    import types

    root = workdir[0] / "std"
    root.mkdir()
    stub = types.ModuleType("warprnnt_pytorch")
    stub.RNNTLoss = lambda **kwargs: torch.nn.Identity()
    saved = sys.modules.get("warprnnt_pytorch")
    sys.modules.setdefault("warprnnt_pytorch", stub)
    try:
        yield make_experiment(root)
    finally:
        if saved is None and sys.modules.get("warprnnt_pytorch") is stub:
            del sys.modules["warprnnt_pytorch"]


def test_espnet_multiblank_config_layout(mb_exp):
    from espnet2.tasks.asr import ASRTask

    from espnet_multiblank.espnet.inference.search import (
        build_transducer_search,
        lattice_from_model,
    )

    model, _ = ASRTask.build_model_from_file(mb_exp / "config.yaml", None, "cpu")
    assert model.token_list[:3] == ["<blank4>", "<blank2>", "<blank>"]
    assert model.decoder.blank_id == 0  # ESPnet's defect...
    lat = lattice_from_model(model)
    assert (lat.blank, lat.big_blank_durations, lat.big_blank_ids) == (
        2,
        (2, 4),
        (1, 0),
    )
    build_transducer_search(model, search_type="greedy")
    assert model.decoder.blank_id == 2  # ...fixed before any search runs


def test_cli_mb_greedy_batched_and_single(workdir, mb_exp):
    root, scp = workdir
    batched = run_inference(mb_exp, scp, root / "o_mbg_b2", "mb_greedy.yaml")
    assert batched["batch_size"] == 8 and batched["search"] == "MultiblankGreedySearch"
    single = run_inference(
        mb_exp, scp, root / "o_mbg_b1", "mb_greedy.yaml", "--batch_size", "1"
    )
    assert single["batch_size"] == 1
    assert single["total_frames"] == batched["total_frames"]
    assert single["big_blank_emissions"] > 0
    # the encoder sees one utterance at a time in both runs: the same labels and the
    # same scores up to float32 rounding in the batched joint (a padded encoder pass
    # moved them by ~1e-5 relative here), each on its own utterance
    results = {}
    for name in ("score", "token_int"):
        for run in ("o_mbg_b2", "o_mbg_b1"):
            lines = (root / run / "1best_recog" / name).read_text().splitlines()
            pairs = (line.partition(" ") for line in lines)
            results[run, name] = {key: value for key, _, value in pairs}
    assert results["o_mbg_b2", "token_int"] == results["o_mbg_b1", "token_int"]
    single_scores = {k: float(v) for k, v in results["o_mbg_b1", "score"].items()}
    assert len(set(single_scores.values())) == len(LENGTHS)
    for key, score in single_scores.items():
        assert float(results["o_mbg_b2", "score"][key]) == pytest.approx(
            score, rel=1e-7
        )


def test_speech2text_results_layout(mb_exp):
    """Token ids -> ESPnet's (text, token, token_int, hyp) with the char tokenizer."""
    from espnet2.asr.transducer.beam_search_transducer import Hypothesis as ESPnetHyp

    from espnet_multiblank.decoding import Hypothesis
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    s2t = MultiblankSpeech2Text(
        asr_train_config=mb_exp / "config.yaml",
        asr_model_file=mb_exp / "model.pth",
        transducer_conf={"search_type": "mb_beam", "beam_size": 3},
    )
    assert s2t.beam_search_transducer.beam_size == 3
    assert s2t.asr_model.decoder.blank_id == 2
    ids = [TOKENS.index(c) + 2 for c in "ab"]  # two big blanks precede <blank>
    hyp = Hypothesis(score=-1.0, yseq=[2] + ids, big_blank_emissions=3)
    ((text, token, token_int, out),) = s2t.hyps_to_results([hyp])
    assert (text, token, token_int) == ("ab", ["a", "b"], ids)
    assert isinstance(out, ESPnetHyp)  # what ESPnet's Speech2Text type-checks
    assert (out.score, out.yseq, out.big_blank_emissions) == (-1.0, hyp.yseq, 3)


def test_cli_mb_beam(workdir, mb_exp):
    root, scp = workdir
    stats = run_inference(mb_exp, scp, root / "o_mbbeam", "mb_beam.yaml")
    assert stats["search"] == "MultiblankBeamSearch"
    assert stats["big_blank_emissions"] > 0


def test_cli_standard_searches_map_on_multiblank_model(workdir, mb_exp):
    root, scp = workdir
    stats = run_inference(mb_exp, scp, root / "o_greedy_mb", "greedy.yaml")
    assert stats["search"] == "MultiblankGreedySearch"


def test_cli_standard_model(workdir, std_exp):
    root, scp = workdir
    for conf in ("greedy.yaml", "beam.yaml"):
        stats = run_inference(std_exp, scp, root / f"o_std_{conf}", conf)
        assert stats["search"] == "BeamSearchTransducer"
        assert stats["big_blank_emissions"] == 0
        assert stats["frames_skipped_by_big_blanks"] == 0
    stats = run_inference(std_exp, scp, root / "o_std_mbg", "mb_greedy.yaml")
    assert stats["search"] == "MultiblankGreedySearch"


@pytest.mark.skipif(
    importlib.util.find_spec("espnet_multiblank.espnet.registration") is None,
    reason="espnet_multiblank.espnet.registration (model: multiblank_espnet) has "
    "not landed yet",
)
def test_cli_subprocess_multiblank_espnet(workdir):
    """``python -m espnet_multiblank.bin.asr_inference``, model: multiblank_espnet."""
    import espnet_multiblank

    root, scp = workdir
    espnet_multiblank.register()  # idempotent; the CLI process registers on its own
    (root / "plugin").mkdir()
    make_experiment(root / "plugin", durations=(2, 4), model="multiblank_espnet")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    exp = root / "plugin" / "exp"
    out = root / "o_plugin"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "espnet_multiblank.bin.asr_inference",
            "--config",
            str(CONF / "mb_greedy.yaml"),
            "--asr_train_config",
            str(exp / "config.yaml"),
            "--asr_model_file",
            str(exp / "model.pth"),
            "--data_path_and_name_and_type",
            f"{scp},speech,sound",
            "--output_dir",
            str(out),
        ],
        check=True,
        env=env,
        cwd=REPO,
    )
    stats = check_outputs(out)
    assert stats["search"] == "MultiblankGreedySearch"


def test_decode_batch_encodes_each_utterance_trimmed(workdir, mb_exp):
    """decode_batch with an encoder that is NOT padding-invariant (its output depends
    on the padded input): the batched results equal decoding each utterance alone,
    which needs each utterance encoded without its padding."""
    import soundfile

    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    root, scp = workdir
    s2t = MultiblankSpeech2Text(
        asr_train_config=mb_exp / "config.yaml",
        asr_model_file=mb_exp / "model.pth",
        transducer_conf={"search_type": "mb_greedy"},
        beam_size=1,
    )
    encode = s2t.asr_model.encode

    def padding_dependent_encode(speech, speech_lengths):
        enc, lens = encode(speech, speech_lengths)
        # a shift by the mean over all input samples, padding included
        return enc + 20.0 * speech.abs().mean(dim=1).view(-1, 1, 1), lens

    s2t.asr_model.encode = padding_dependent_encode
    wavs = [
        torch.tensor(soundfile.read(line.split()[1])[0], dtype=torch.float32)
        for line in scp.read_text().splitlines()
    ]
    lengths = torch.tensor([len(w) for w in wavs])
    speech = torch.nn.utils.rnn.pad_sequence(wavs, batch_first=True)
    batched = s2t.decode_batch(speech, lengths)
    for b, wav in enumerate(wavs):
        ((_, _, alone_ids, alone),) = s2t(wav)
        ((_, _, ids, hyp),) = batched[b]
        assert ids == alone_ids
        assert hyp.score == pytest.approx(alone.score, rel=1e-6)


@pytest.mark.parametrize("samples", [0, 1, 40])
def test_direct_speech2text_refuses_too_short_input(mb_exp, samples):
    """Speech2Text called from Python (not through the inference loop, which reports
    the utterance and goes on): a waveform too short for the frontend and encoder is
    a ValueError that says so and how many samples are needed, not a crash deep in
    the STFT (``reflect_pad_each``) or the subsampling; long enough input decodes."""
    from espnet_multiblank.espnet.inference.inputs import min_encoder_samples
    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    s2t = MultiblankSpeech2Text(
        asr_train_config=mb_exp / "config.yaml",
        asr_model_file=mb_exp / "model.pth",
        transducer_conf={"search_type": "mb_greedy"},
        beam_size=1,
    )
    need = min_encoder_samples(s2t.asr_model, "cpu", torch.float32)
    assert need is not None and need > samples
    g = torch.Generator().manual_seed(samples)
    with pytest.raises(
        ValueError,
        match=f"speech: too short: {samples} samples.*" f"at least {need} samples",
    ):
        s2t(torch.randn(samples, generator=g))
    with pytest.raises(ValueError, match="speech: too short"):
        s2t(torch.randn(need - 1, generator=g).numpy())
    results = s2t(torch.randn(need, generator=g))
    assert len(results) == 1 and isinstance(results[0][0], str)
