"""End-to-end: ``espnet_multiblank.bin.asr_inference`` on tiny random models.

The greedy and beam searches of every lattice (multi-blank, TDT) through the entry
point: batched and single decoding, the hypotheses of the reference greedy rule
(``helpers/search_oracles.py``) on the model's own encoder output, ESPnet's greedy
type mapped on the lattice's search. Then the multi-blank model's layout, ESPnet's
standard model, and Speech2Text called from Python.

The random models (``helpers/espnet_experiments.py``) are written by ESPnet's own
``ASRTask --dry_run``: the multi-blank one and the standard one with ESPnet's own
``model: espnet`` (``model_conf.transducer_multi_blank_durations``), the TDT with
``model: multiblank_espnet``; the subprocess test runs the real CLI with ``model:
multiblank_espnet``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import search_oracles
import torch
from espnet_experiments import (  # noqa: F401  (BLANK_BIAS: test_decoding_stock)
    BLANK_BIAS,
    DECODE_TDT_DURS,
    inference_args,
    make_experiment,
    make_tdt_experiment,
)

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
        inference_args(exp, scp, out, "--config", str(CONF / conf), *extra)
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
    # beam_size: not in the file, the search type's default (test_search_defaults)
    assert args.transducer_conf["search_type"] == "mb_beam" and args.beam_size is None
    with pytest.raises(SystemExit):
        get_parser().parse_args(base + ["--transducer_conf", "mb_beam"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode")
    return root, make_data(root)


#: per lattice: its random model (the blank and durations written out by hand), its
#: decoding configs, the searches they run and the greedy config's rule
LATTICES = {
    "multiblank": SimpleNamespace(
        # emits labels and big blanks
        make=lambda root: make_experiment(
            root, durations=(2, 4), blank_bias=0.5, scale=10.0
        ),
        blank=2,
        big_blank_durations=(2, 4),
        tdt_durations=(),
        greedy="mb_greedy.yaml",
        beam="mb_beam.yaml",
        greedy_search="GreedySearch",
        beam_search="BeamSearch",
        greedy_rule=dict(max_sym=1, decision="total"),
    ),
    "tdt": SimpleNamespace(
        make=make_tdt_experiment,
        blank=0,
        big_blank_durations=(),
        tdt_durations=tuple(DECODE_TDT_DURS),
        greedy="tdt_greedy.yaml",
        beam="tdt_beam.yaml",
        greedy_search="GreedySearch",
        beam_search="BeamSearch",
        greedy_rule=dict(max_sym=10, decision="total"),
    ),
}
lattices = pytest.mark.parametrize("lattice", list(LATTICES))


@pytest.fixture(scope="module")
def experiments(workdir):
    """``experiments(lattice)``: the lattice's experiment, built once for the module
    (on first use)."""
    built = {}

    def get(lattice):
        if lattice not in built:
            root = workdir[0] / lattice
            root.mkdir()
            built[lattice] = LATTICES[lattice].make(root)
        return built[lattice]

    return get


@pytest.fixture(scope="module")
def mb_exp(experiments):
    return experiments("multiblank")


def reference_hypotheses(exp: Path, scp: Path, lattice: str, max_sym, decision):
    """{utt: (labels, score, frames skipped, long blanks)} of the reference greedy
    rule (the networks called directly) on the model's own encoder output."""
    import soundfile
    from espnet2.tasks.asr import ASRTask

    case = LATTICES[lattice]
    model, _ = ASRTask.build_model_from_file(
        exp / "config.yaml", exp / "model.pth", "cpu"
    )
    model.eval()
    nets = SimpleNamespace(
        decoder=model.decoder,
        joint_network=model.joint_network,
        blank_id=case.blank,
        big_blank_durations=case.big_blank_durations,
        tdt_durations=case.tdt_durations,
    )
    out = {}
    for line in scp.read_text().splitlines():
        utt, path = line.split()
        wav, _ = soundfile.read(path, dtype="float32")
        speech = torch.from_numpy(wav)[None]
        with torch.no_grad():
            enc, _ = model.encode(speech, torch.tensor([speech.size(1)]))
        if lattice == "tdt":
            out[utt] = search_oracles.tdt_reference_greedy(
                nets, enc[0], max_sym, decision
            )
        else:
            out[utt] = search_oracles.mb_greedy_path(nets, enc[0], decision, max_sym)
    return out


@lattices
def test_cli_greedy_batched_single_and_reference(workdir, experiments, lattice):
    """The lattice's greedy config batched (its batch_size 8) and one utterance at a
    time: the labels of the reference greedy rule, the same scores up to float32
    rounding (the encoder sees one utterance at a time in both runs: a padded
    encoder pass moved them by ~1e-5 relative), the frames skipped and long blanks
    of the reference; ESPnet's greedy type runs the lattice's greedy search with its
    defaults (10 labels per frame)."""
    from test_decoding_stock import read_outputs

    root, scp = workdir
    case = LATTICES[lattice]
    exp = experiments(lattice)
    runs = {}
    for name, conf, extra in (
        ("batched", case.greedy, ()),
        ("single", case.greedy, ("--batch_size", "1")),
        ("espnet", "greedy.yaml", ()),
    ):
        out = root / f"o_{lattice}_greedy_{name}"
        stats = run_inference(exp, scp, out, conf, *extra)
        runs[name] = read_outputs(out), stats
    (batched, sb), (single, ss), (espnet, se) = (
        runs["batched"],
        runs["single"],
        runs["espnet"],
    )
    assert (sb["batch_size"], ss["batch_size"]) == (8, 1)
    assert sb["search"] == ss["search"] == se["search"] == case.greedy_search
    assert batched["token_int"] == single["token_int"]
    single_scores = {k: float(v) for k, v in single["score"].items()}
    assert len(set(single_scores.values())) == len(LENGTHS)
    for utt, score in single_scores.items():
        assert float(batched["score"][utt]) == pytest.approx(score, rel=1e-7)

    want = reference_hypotheses(exp, scp, lattice, **case.greedy_rule)
    labels = {u: [int(x) for x in v.split()] for u, v in single["token_int"].items()}
    assert labels == {u: w[0] for u, w in want.items()}
    assert any(labels.values())  # the case emits labels
    for utt, score in single_scores.items():
        assert score == pytest.approx(want[utt][1], rel=1e-5, abs=1e-4)
    skipped = sum(w[2] for w in want.values())
    long_blanks = sum(w[3] for w in want.values())
    assert ss["frames_skipped"] == sb["frames_skipped"] == skipped > 0
    assert ss["frames_skipped_by_big_blanks"] == skipped
    assert ss["big_blank_emissions"] == sb["big_blank_emissions"] == long_blanks > 0
    assert ss["total_frames"] == sb["total_frames"] > skipped

    want = reference_hypotheses(exp, scp, lattice, max_sym=10, decision="total")
    labels = {u: [int(x) for x in v.split()] for u, v in espnet["token_int"].items()}
    assert labels == {u: w[0] for u, w in want.items()}


@lattices
def test_cli_beam(workdir, experiments, lattice):
    root, scp = workdir
    case = LATTICES[lattice]
    stats = run_inference(
        experiments(lattice), scp, root / f"o_{lattice}_beam", case.beam
    )
    assert stats["search"] == case.beam_search
    assert stats["big_blank_emissions"] > 0


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


def test_cli_standard_model(workdir, std_exp):
    root, scp = workdir
    for conf in ("greedy.yaml", "beam.yaml"):
        stats = run_inference(std_exp, scp, root / f"o_std_{conf}", conf)
        assert stats["search"] == "BeamSearchTransducer"
        assert stats["big_blank_emissions"] == 0
        assert stats["frames_skipped_by_big_blanks"] == 0
    stats = run_inference(std_exp, scp, root / "o_std_mbg", "mb_greedy.yaml")
    assert stats["search"] == "GreedySearch"


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
            *inference_args(exp, scp, out),
        ],
        check=True,
        env=env,
        cwd=REPO,
    )
    stats = check_outputs(out)
    assert stats["search"] == "GreedySearch"


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
    reason = f"too short: {samples} samples.*at least {need} samples"
    with pytest.raises(
        ValueError, match=f"speech: {reason if samples else 'empty .no samples.'}"
    ):
        s2t(torch.randn(samples, generator=g))
    with pytest.raises(ValueError, match="speech: too short"):
        s2t(torch.randn(need - 1, generator=g).numpy())
    results = s2t(torch.randn(need, generator=g))
    assert len(results) == 1 and isinstance(results[0][0], str)
