"""Inference never returns garbage: bad inputs are reported by key, the run goes on.

Each case writes its bad wav in the test: NaN and inf samples, an empty file, one too
short for the encoder, a stereo file, a file at another sample rate, a missing and an
unreadable file, next to good utterances. Checked through the plug-in's entry point
one utterance at a time and in batches (the same utterances fail, with the same
reasons, and the good ones get the same hypotheses), with ``mb_beam`` (also
batched), and through
ESPnet's stock entry point with the start-up hook; the exit status is 1 unless
``--allow_failed_utterances true``. Also: half-precision decoding in every plug-in
search, options that do not apply to a transducer search, a model whose scores are
not finite.
"""

import logging
import subprocess
import sys
from pathlib import Path

import editdistance
import numpy as np
import pytest
import soundfile
import torch
from test_decoding_cli import REPO  # noqa: I100
from test_decoding_stock import (
    decode_args,
    plugin_experiments,
    read_outputs,
    stock_env,
)
from test_tdt_cli import make_tdt_experiment

import espnet_multiblank
from espnet_multiblank.bin.asr_inference import get_parser, main

pytestmark = pytest.mark.timeout(1200)

FS = 16000
GOOD = ["g0", "g1", "g2"]
# key -> the start of the reason written to failed_utterances
BAD = {
    "b_nan": "non-finite samples: 2 NaN, 0 inf",
    "b_inf": "non-finite samples: 0 NaN, 1 inf",
    "b_empty": "empty (no samples)",
    "b_short": "too short: 100 samples (0.006 s), the encoder needs at least",
    "b_stereo": "2 channels, the model takes one",
    "b_rate": "sample rate 8000 Hz, the model's is 16000 Hz",
    "b_missing": "cannot be read:",
    "b_garbage": "cannot be read:",
}


def write_data(root: Path) -> Path:
    rng = np.random.default_rng(0)
    wavs = {
        k: (0.1 * rng.standard_normal(n)).astype(np.float32)
        for k, n in zip(GOOD, (8000, 12000, 6000))
    }
    lines = []
    for key in GOOD:
        soundfile.write(root / f"{key}.wav", wavs[key], FS)
    nan = wavs["g0"].copy()
    nan[[10, 500]] = np.nan
    inf = wavs["g0"].copy()
    inf[77] = np.inf
    soundfile.write(root / "b_nan.wav", nan, FS, subtype="FLOAT")
    soundfile.write(root / "b_inf.wav", inf, FS, subtype="FLOAT")
    soundfile.write(root / "b_empty.wav", np.zeros(0, np.float32), FS)
    soundfile.write(root / "b_short.wav", wavs["g1"][:100], FS)
    soundfile.write(root / "b_stereo.wav", np.stack([wavs["g1"]] * 2, 1), FS)
    soundfile.write(root / "b_rate.wav", wavs["g2"], 8000)
    (root / "b_garbage.wav").write_bytes(b"RIFF not really a wav file")
    order = [
        "g0",
        "b_nan",
        "b_empty",
        "g1",
        "b_short",
        "b_stereo",
        "b_inf",
        "b_rate",
        "b_missing",
        "b_garbage",
        "g2",
    ]
    for key in order:
        lines.append(f"{key} {root / (key + '.wav')}")
    scp = root / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    return scp


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    scp = write_data(root)
    espnet_multiblank.register()
    # labels, not only blanks
    exps = plugin_experiments(root, (("mb", (2, 4), 0.5, 10.0), ("std", (), 0.5, 10.0)))
    (root / "tdt").mkdir()
    exps["tdt"] = make_tdt_experiment(root / "tdt")
    return root, scp, exps


def cli(exp: Path, scp: Path, out: Path, conf: str, *extra: str) -> int:
    """The plug-in's entry point in this process; its exit status."""
    args = decode_args(exp, scp, out, conf) + list(extra)
    torch.set_num_threads(1)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code


def failed(out: Path):
    path = out / "failed_utterances"
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split(" ", 1) for line in lines)


def check_failures(out: Path):
    got = failed(out)
    assert set(got) == set(BAD), got
    for key, start in BAD.items():
        assert got[key].startswith(start), (key, got[key])
    outputs = read_outputs(out)
    assert set(outputs["token_int"]) == set(GOOD)
    for score in outputs["score"].values():
        assert np.isfinite(float(score))
    return outputs


def test_bad_inputs_are_reported_and_the_run_goes_on(setup):
    root, scp, exps = setup
    runs = {}
    for name, conf, extra in (
        ("b1", "mb_greedy.yaml", ("--batch_size", "1")),
        ("b8", "mb_greedy.yaml", ("--batch_size", "8")),
        ("beam", "mb_beam.yaml", ("--batch_size", "1")),
        ("beam8", "mb_beam.yaml", ("--batch_size", "8")),
    ):
        out = root / f"o_{name}"
        assert cli(exps["mb"], scp, out, conf, *extra) == 1
        runs[name] = check_failures(out)
    # batched and one at a time: the same failures, the same hypotheses
    assert runs["b1"]["token_int"] == runs["b8"]["token_int"]
    assert runs["beam"]["token_int"] == runs["beam8"]["token_int"]
    assert any(v.strip() for v in runs["b1"]["token_int"].values())
    # the option decides the exit status, not the outputs
    out = root / "o_allowed"
    code = cli(
        exps["mb"],
        scp,
        out,
        "mb_greedy.yaml",
        "--batch_size",
        "1",
        "--allow_failed_utterances",
        "true",
    )
    assert code == 0
    assert check_failures(out)["token_int"] == runs["b1"]["token_int"]
    # a clean run exits 0 and leaves no failed_utterances
    good = root / "good.scp"
    good.write_text("".join(f"{k} {root / (k + '.wav')}\n" for k in GOOD))
    out = root / "o_good"
    assert cli(exps["mb"], good, out, "mb_greedy.yaml") == 0
    assert not (out / "failed_utterances").exists()
    assert read_outputs(out)["token_int"] == runs["b8"]["token_int"]


def test_stock_entry_point_treats_bad_inputs_the_same(setup, tmp_path):
    root, scp, exps = setup
    env = stock_env(tmp_path)
    out = root / "o_stock"
    proc = subprocess.run(
        [sys.executable, "-m", "espnet2.bin.asr_inference"]
        + decode_args(exps["mb"], scp, out, "mb_greedy.yaml"),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    for key in BAD:
        assert f"utterance {key} not decoded" in proc.stderr
    stock = check_failures(out)
    plugin = root / "o_plugin_b1"
    cli(exps["mb"], scp, plugin, "mb_greedy.yaml", "--batch_size", "1")
    assert stock["token_int"] == read_outputs(plugin)["token_int"]
    assert failed(out) == failed(plugin)


SEARCHES = [
    ("mb", "mb_greedy.yaml", "8"),
    ("mb", "mb_greedy_loop_labels.yaml", "8"),
    ("mb", "mb_beam.yaml", "1"),
    ("mb", "mb_beam.yaml", "8"),
    ("mb", "mb_beam_step.yaml", "8"),
    ("std", "mb_greedy.yaml", "8"),
    ("tdt", "tdt_greedy.yaml", "8"),
    ("tdt", "tdt_beam.yaml", "1"),
    ("tdt", "tdt_beam.yaml", "8"),
]


@pytest.mark.parametrize("model, conf, batch", SEARCHES)
def test_half_precision_decodes_like_float32(setup, model, conf, batch):
    """--dtype float16 / bfloat16: every plug-in search decodes (scores summed in
    float32, finite) and gives nearly the float32 hypotheses."""
    root, _, exps = setup
    good = root / "good.scp"
    good.write_text("".join(f"{k} {root / (k + '.wav')}\n" for k in GOOD))
    outs = {}
    for dtype in ("float32", "float16", "bfloat16"):
        out = root / f"o_{model}_{conf}_{dtype}"
        code = cli(
            exps[model], good, out, conf, "--batch_size", batch, "--dtype", dtype
        )
        assert code == 0
        outs[dtype] = read_outputs(out)
        assert set(outs[dtype]["token_int"]) == set(GOOD)
        for score in outs[dtype]["score"].values():
            assert np.isfinite(float(score))
    # near-ties of these random networks can flip in half precision: the token
    # error rate against float32 stays small (float16 has 11 significant bits,
    # bfloat16 8)
    for dtype, limit in (("float16", 0.05), ("bfloat16", 0.2)):
        errors = tokens = 0
        for key, ref in outs["float32"]["token_int"].items():
            ref, hyp = ref.split(), outs[dtype]["token_int"][key].split()
            errors += editdistance.eval(ref, hyp)
            tokens += len(ref)
        assert tokens >= 5 and errors <= limit * tokens, (dtype, errors, tokens)


def test_half_precision_with_digital_silence(setup):
    """Exact zeros (the padding of synthesised audio) in float16: ESPnet's log-mel
    clamps at 1e-10, which is 0 in float16, so a frontend in float16 gives -inf
    features and NaN scores; the frontend runs in float32 and the utterance decodes
    as in float32."""
    root, _, exps = setup
    rng = np.random.default_rng(3)
    wav = np.concatenate([np.zeros(4000), 0.3 * rng.standard_normal(8000)])
    soundfile.write(root / "silence.wav", wav.astype(np.float32), FS)
    scp = root / "silence.scp"
    scp.write_text(f"s0 {root / 'silence.wav'}\n")
    outs = {}
    for dtype in ("float32", "float16"):
        out = root / f"o_silence_{dtype}"
        assert cli(exps["mb"], scp, out, "mb_greedy.yaml", "--dtype", dtype) == 0
        outs[dtype] = read_outputs(out)
    assert outs["float16"]["token_int"] == outs["float32"]["token_int"]
    assert np.isfinite(float(outs["float16"]["score"]["s0"]))


def test_half_precision_refused_with_espnets_searches_on_cpu(setup):
    """ESPnet's own transducer search (greedy.yaml on a standard model) cannot run in
    half precision on a CPU: refused at start-up, naming --dtype."""
    root, _, exps = setup
    good = root / "good.scp"
    good.write_text("".join(f"{k} {root / (k + '.wav')}\n" for k in GOOD))
    with pytest.raises(ValueError, match="--dtype float16: ESPnet's transducer"):
        cli(exps["std"], good, root / "o_std_half", "greedy.yaml", "--dtype", "float16")


def test_options_that_do_not_apply_give_one_warning(setup, caplog):
    root, _, exps = setup
    good = root / "good.scp"
    good.write_text("".join(f"{k} {root / (k + '.wav')}\n" for k in GOOD))
    with caplog.at_level(logging.WARNING):
        cli(
            exps["mb"],
            good,
            root / "o_opts",
            "mb_greedy.yaml",
            "--ctc_weight",
            "0.3",
            "--penalty",
            "1.0",
            "--lang_prompt_token",
            "<en>",
            "--nbest",
            "3",
        )
    lines = [r.getMessage() for r in caplog.records if "do not apply" in r.getMessage()]
    assert len(lines) == 1
    for option in (
        "--ctc_weight 0.3",
        "--penalty 1.0",
        "--lang_prompt_token <en>",
        "--nbest 3",
    ):
        assert option in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cli(exps["mb"], good, root / "o_noopts", "mb_beam.yaml", "--nbest", "3")
    assert not any("do not apply" in r.getMessage() for r in caplog.records)
    # --use_amp is not an inference option: the parser names it
    with pytest.raises(SystemExit):
        get_parser().parse_args(
            [
                "--output_dir",
                "x",
                "--data_path_and_name_and_type",
                "a,speech,sound",
                "--use_amp",
                "true",
            ]
        )


def test_non_finite_scores_are_never_written(setup):
    """A model whose joint network gives NaN: every utterance is reported, none is
    written with a NaN score."""
    root, _, exps = setup
    bad = root / "nan_model"
    bad.mkdir()
    (bad / "config.yaml").write_text((exps["mb"] / "config.yaml").read_text())
    state = torch.load(exps["mb"] / "model.pth")
    state["joint_network.lin_out.bias"][5] = float("nan")
    torch.save(state, bad / "model.pth")
    good = root / "good.scp"
    good.write_text("".join(f"{k} {root / (k + '.wav')}\n" for k in GOOD))
    for conf in ("mb_greedy.yaml", "mb_beam.yaml"):
        out = root / f"o_nan_{conf}"
        assert cli(bad, good, out, conf) == 1
        reasons = failed(out)
        assert set(reasons) == set(GOOD), reasons
        assert all("non-finite score" in r or "failed" in r for r in reasons.values())
        assert read_outputs(out)["score"] == {}
