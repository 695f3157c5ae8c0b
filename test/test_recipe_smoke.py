"""End-to-end smoke test of the digits recipe: `bash egs/digits/asr1/run.sh --smoke`.

Runs every stage (tools, TTS synthesis, data dirs, token list, collect_stats, training
of the three transducers and of the two LMs, decoding, LM-fused decoding with the
weights chosen on dev, scoring, report) on a few hundred utterances with a tiny model,
in a temporary directory (`--dir`), and checks that the outputs exist and are
well-formed. No WER threshold: two epochs of a tiny model recognise little.

Needs the Debian TTS tools (sox, espeak-ng, flite, festival + voices): stage 1 installs
them when running as root (as CI does); otherwise the test is skipped when they are
missing. Takes about 3 minutes on 2 CPU cores (more on a loaded machine).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "egs" / "digits" / "asr1"
TOOLS = ("sox", "espeak-ng", "flite", "festival")
STATS_KEYS = {
    "num_utterances",
    "audio_seconds",
    "decode_seconds",
    "rtf",
    "total_frames",
    "frames_skipped",
    "frames_skipped_by_big_blanks",
    "big_blank_emissions",
}
DECODES = [
    ("standard", "greedy"),
    ("standard", "beam"),
    ("standard", "mb_greedy"),
    ("multiblank", "mb_greedy"),
    ("multiblank", "mb_beam"),
    ("tdt", "tdt_greedy"),
    ("tdt", "tdt_beam"),
    # the smoke run's batched beam searches (their directories' names)
    ("tdt", "tdt_beam_label_b32"),
    ("multiblank", "mb_beam_b32"),
]
# the smoke run's streaming decodings (run.sh: stream_jobs, stream_chunks, ...)
STREAM_JOBS = [("multiblank", "mb_greedy"), ("tdt", "tdt_greedy")]
STREAM_CHUNKS = (4,)
STREAM_BATCH, STREAM_BATCH_CHUNK, STREAM_UTTS = 4, 4, 20
# the smoke run's deployment (run.sh: deploy_models, deploy_tags)
DEPLOY_MODELS = ("multiblank", "tdt")
DEPLOY_TAGS = ("greedy_b1", "beam_b32", "stream_greedy_c4")
# the smoke run's --lm_searches, --lm_extra_jobs and --dtype_jobs (directory names)
LM_SEARCHES = [("tdt", "tdt_beam_label_b32")]
LM_EXTRA = [("tdt", "tdt_beam", 1), ("tdt", "tdt_beam_b32", 32)]
DTYPE_JOBS = [("multiblank", "mb_greedy")]
#: LM -> (dev set, test sets, the smoke run's candidate weights)
LMS = {
    "train": ("dev", ("test", "test_real"), ("0.2",)),
    "known": ("dev_known", ("test_known",), ("0.4", "0.8")),
}


def _tools_available():
    return all(shutil.which(t) for t in TOOLS)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    if not _tools_available() and os.geteuid() != 0:
        pytest.skip(
            "TTS tools missing and not root: sudo apt-get install -y sox espeak-ng "
            "flite festival festvox-kallpc16k festvox-us-slt-hts festvox-kdlpc16k"
        )
    work = tmp_path_factory.mktemp("digits_smoke")
    cmd = [
        "bash",
        str(RECIPE / "run.sh"),
        "--smoke",
        "--dir",
        str(work),
        "--python",
        sys.executable,
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log = proc.stdout
    (work / "run.log").write_text(log)
    assert (
        proc.returncode == 0
    ), f"run.sh --smoke failed (rc {proc.returncode}):\n{log[-6000:]}"
    return work, log


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_data_dirs(smoke_run):
    work, _ = smoke_run
    for s in ("train", "dev", "test", "test_real", "dev_known", "test_known"):
        d = work / "data_smoke" / s
        files = {
            f: (d / f).read_text().splitlines() for f in ("wav.scp", "text", "utt2spk")
        }
        utts = [line.split()[0] for line in files["wav.scp"]]
        assert utts and utts == sorted(utts), s
        for f, lines in files.items():
            assert [line.split()[0] for line in lines] == utts, (s, f)
        for line in files["wav.scp"]:
            assert Path(line.split(maxsplit=1)[1]).is_file()
        spk2utt = (d / "spk2utt").read_text().split()
        assert spk2utt, s
    # speaker-disjoint: no training speaker in the held-out sets
    spk = {
        s: {
            line.split()[1]
            for line in (work / "data_smoke" / s / "utt2spk").read_text().splitlines()
        }
        for s in ("train", "dev", "test", "dev_known", "test_known")
    }
    held_out = spk["dev"] | spk["test"] | spk["dev_known"] | spk["test_known"]
    assert not spk["train"] & held_out
    # the known sets say numbers of the account list, the LM "known"'s text
    accounts = {
        line.split(maxsplit=1)[1]
        for line in (work / "data_smoke" / "accounts" / "text").read_text().splitlines()
    }
    for s in ("dev_known", "test_known"):
        text = (work / "data_smoke" / s / "text").read_text().splitlines()
        assert text and all(line.split(maxsplit=1)[1] in accounts for line in text)
    tokens = (
        (work / "data_smoke" / "token_list" / "word" / "tokens.txt").read_text().split()
    )
    assert tokens[0] == "<blank>" and tokens[-1] == "<sos/eos>"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_synthesis_is_bit_identical_across_runs(smoke_run, tmp_path):
    """The same seed gives the same waveforms: the smoke run's dev set (40
    utterances, seed 2, every TTS engine of the held-out voices) synthesised again
    here, in one process instead of two, is byte for byte the smoke run's (sox
    dithers with an unseeded generator unless told -R)."""
    work, _ = smoke_run
    again = tmp_path / "dev"
    subprocess.run(
        [sys.executable, str(RECIPE / "local" / "synth_digits.py"), "--set", "dev"]
        + ["--num", "40", "--seed", "2", "--nj", "1", str(again)],
        check=True,
        capture_output=True,
    )
    first = sorted((work / "wav_smoke" / "dev" / "wav").glob("*.wav"))
    assert len(first) == 40
    for path in first:
        assert (again / "wav" / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_training_outputs(smoke_run):
    work, _ = smoke_run
    for m in ("standard", "multiblank", "tdt"):
        d = work / "exp_smoke" / f"asr_{m}"
        assert (d / "config.yaml").is_file()
        assert (d / "valid.loss.ave.pth").exists()
        assert (d / "images" / "loss.png").is_file()
        log = (d / "train.log").read_text()
        assert re.search(r"1epoch results: .*\[valid\] .*loss=", log), m
        assert float((d / "train_seconds").read_text()) > 0
    cfg = (work / "exp_smoke" / "asr_multiblank" / "config.yaml").read_text()
    assert "<blank8>" in cfg and "transducer_multi_blank_durations" in cfg
    cfg = yaml.safe_load((work / "exp_smoke" / "asr_tdt" / "config.yaml").read_text())
    assert cfg["model_conf"]["transducer_tdt_durations"] == list(range(9))
    assert "<blank8>" not in cfg["token_list"]


def test_configs_differ_only_in_loss_keys():
    std = yaml.safe_load((RECIPE / "conf" / "train_standard.yaml").read_text())
    mb = yaml.safe_load((RECIPE / "conf" / "train_multiblank.yaml").read_text())
    tdt = yaml.safe_load((RECIPE / "conf" / "train_tdt.yaml").read_text())
    assert mb["model_conf"].pop("transducer_multi_blank_durations") == [2, 4, 8]
    assert std["model_conf"].pop("transducer_multi_blank_durations") == []
    assert tdt["model_conf"].pop("transducer_multi_blank_durations") == []
    # the same largest jump as the multi-blank model's <blank8>
    assert tdt["model_conf"].pop("transducer_tdt_durations") == list(range(9))
    assert tdt["model_conf"].pop("transducer_tdt_omega") == 0.1
    # the same sigma, under the TDT's own key
    assert tdt["model_conf"].pop("transducer_tdt_sigma") == 0.05
    assert mb["model_conf"].pop("transducer_multi_blank_sigma") == 0.05
    assert std["model_conf"].pop("transducer_multi_blank_sigma") == 0.05
    assert mb == std == tdt
    # the models for sherpa-onnx: the same but for the front end (sherpa-onnx's)
    for name in ("standard", "tdt"):
        base = yaml.safe_load((RECIPE / "conf" / f"train_{name}.yaml").read_text())
        kaldi = yaml.safe_load(
            (RECIPE / "conf" / f"train_{name}_kaldi.yaml").read_text()
        )
        assert kaldi.pop("frontend") == "kaldi_fbank"
        assert kaldi.pop("frontend_conf") == {"fs": "8k", "n_mels": 23}
        base.pop("frontend"), base.pop("frontend_conf")
        assert kaldi == base


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_decoding_and_scores(smoke_run):
    work, _ = smoke_run
    for m, search in DECODES:
        for s in ("test", "test_real"):
            d = work / "exp_smoke" / f"asr_{m}" / f"decode_{search}_valid.loss.ave" / s
            stats = json.loads((d / "decoding_stats.json").read_text())
            assert STATS_KEYS <= set(stats), (m, search, s)
            n = len((work / "data_smoke" / s / "wav.scp").read_text().splitlines())
            assert stats["num_utterances"] == n
            hyps = (d / "1best_recog" / "text").read_text().splitlines()
            assert len(hyps) == n
            score = json.loads((d / "score.json").read_text())
            assert 0 <= score["wer"] and score["num_utterances"] == n
            if m == "standard":
                assert stats["frames_skipped"] == 0
            assert stats["batch_size"] == (32 if search.endswith("_b32") else 1)
            # the plug-in's searches write test_real's word times, scored against
            # the known boundaries
            ctm = d / "1best_recog" / "ctm"
            if s == "test_real" and search.startswith(("mb_", "tdt_")):
                words = sum(len(line.split()) - 1 for line in hyps)
                lines = ctm.read_text().splitlines()
                assert lines[0].startswith(";; espnet-multiblank")  # the header
                assert len([x for x in lines if x[:2] != ";;"]) == words
                times = json.loads((d / "times.json").read_text())
                assert times["reference_words"] > 0
            else:
                assert not ctm.exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_test_real_word_boundaries(smoke_run):
    """test_real keeps the known boundaries of its concatenated words."""
    work, _ = smoke_run
    d = work / "data_smoke" / "test_real"
    texts = dict(line.split(" ", 1) for line in (d / "text").read_text().splitlines())
    times = (d / "word_times").read_text().splitlines()
    assert len(times) == len(texts)
    for line in times:
        utt, *rest = line.split()
        words, starts, ends = rest[0::3], rest[1::3], rest[2::3]
        assert " ".join(words) == texts[utt].strip()
        bounds = [float(x) for pair in zip(starts, ends) for x in pair]
        assert bounds == sorted(bounds) and bounds[0] > 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_lms_and_fused_decoding(smoke_run):
    """Both LMs trained; every beam search decoded with each on its dev set at every
    candidate weight, the chosen weight written, and the test sets decoded with it
    (test_known also without)."""
    work, _ = smoke_run
    exp = work / "exp_smoke"
    for m, search, bs in LM_EXTRA:  # at the chosen weights
        known = json.loads(
            (
                exp / f"asr_{m}" / f"lm_known_weight_{LM_SEARCHES[0][1]}"
                "_valid.loss.ave.json"
            ).read_text()
        )
        name = f"decode_{search}_lm_known_w{known['chosen']}_valid.loss.ave"
        d = exp / f"asr_{m}" / name / "test_known"
        stats = json.loads((d / "decoding_stats.json").read_text())
        assert stats["batch_size"] == bs
        assert json.loads((d / "score.json").read_text())["wer"] >= 0
    for lm in LMS:
        d = exp / f"lm_{lm}"
        assert (d / "config.yaml").is_file() and (d / "valid.loss.best.pth").exists()
        assert re.search(
            r"1epoch results: .*\[valid\] .*loss=", (d / "train.log").read_text()
        )
    for m, search in LM_SEARCHES:
        for lm, (dev, tests, weights) in LMS.items():
            choice = json.loads(
                (
                    exp / f"asr_{m}" / f"lm_{lm}_weight_{search}_valid.loss.ave.json"
                ).read_text()
            )
            # weight 0 (no LM) is a candidate too: an LM that does not lower the dev
            # WER is not used
            assert choice["chosen"] in ("0",) + tuple(weights)
            assert set(choice["dev_wer"]) == set(weights)
            runs = [
                (f"decode_{search}_lm_{lm}_w{w}_valid.loss.ave", dev) for w in weights
            ]
            runs += [(f"decode_{search}_valid.loss.ave", dev)]
            for s in tests:
                runs.append(
                    (f"decode_{search}_lm_{lm}_w{choice['chosen']}_valid.loss.ave", s)
                )
                runs.append((f"decode_{search}_valid.loss.ave", s))
            for name, s in runs:
                d = exp / f"asr_{m}" / name / s
                n = len((work / "data_smoke" / s / "wav.scp").read_text().splitlines())
                score = json.loads((d / "score.json").read_text())
                assert score["num_utterances"] == n, (d, score)
                for line in (d / "1best_recog" / "score").read_text().splitlines():
                    float(line.split()[1])  # plain numbers


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_half_precision_decodings(smoke_run):
    work, _ = smoke_run
    exp = work / "exp_smoke"
    n = len((work / "data_smoke" / "test" / "wav.scp").read_text().splitlines())
    for m, search in DTYPE_JOBS:
        for dtype in ("float16", "bfloat16"):
            d = exp / f"asr_{m}" / f"decode_{search}_{dtype}_valid.loss.ave" / "test"
            stats = json.loads((d / "decoding_stats.json").read_text())
            assert stats["dtype"] == dtype and stats["num_failed"] == 0
            assert json.loads((d / "score.json").read_text())["num_utterances"] == n


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_streaming_decodings(smoke_run):
    """Stage 12: every model's greedy search at each chunk: test offline with the
    chunk mask, STREAM_UTTS utterances of test and test_real streamed (and batched);
    scored; emission delays on test_real; a report section."""
    work, _ = smoke_run
    exp = work / "exp_smoke"
    n_test = len((work / "data_smoke" / "test" / "wav.scp").read_text().splitlines())
    runs = [(f"chunk_{{}}_c{c}", "test", n_test) for c in STREAM_CHUNKS]
    for c in STREAM_CHUNKS:
        runs += [
            (f"stream_{{}}_c{c}_b1", s, STREAM_UTTS) for s in ("test", "test_real")
        ]
    runs.append(
        (f"stream_{{}}_c{STREAM_BATCH_CHUNK}_b{STREAM_BATCH}", "test", STREAM_UTTS)
    )
    for m, search in STREAM_JOBS:
        for name, s, n in runs:
            d = exp / f"asr_{m}" / (name.format(search) + "_valid.loss.ave") / s
            stats = json.loads((d / "decoding_stats.json").read_text())
            assert stats["num_utterances"] == n and stats["num_failed"] == 0, d
            assert bool(stats.get("streaming")) == name.startswith("stream"), d
            assert json.loads((d / "score.json").read_text())["num_utterances"] == n
            if name.startswith("stream"):
                emission = (d / "1best_recog" / "emission").read_text().splitlines()
                assert len(emission) == n
            if s == "test_real":
                delay = json.loads((d / "emission_delay.json").read_text())
                assert delay["matched_words"] >= 0
    md = (exp / "RESULTS.md").read_text()
    section = md.split("\n## Streaming\n")[1].split("\n## ")[0]
    for m, search in STREAM_JOBS:
        rows = [r for r in section.splitlines() if r.startswith(f"| {m} | {search} |")]
        assert len(rows) == len(STREAM_CHUNKS) + 1, section  # + the batched run


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_deployment_stage(smoke_run):
    """Stage 14: each model exported to ONNX and test decoded by the torch-free
    runtime; the greedy and streamed hypotheses are the plug-in's (the streams'
    those of the plug-in's offline decoding at the same chunk); scored; reported."""
    work, _ = smoke_run
    exp = work / "exp_smoke"
    n_test = len((work / "data_smoke" / "test" / "wav.scp").read_text().splitlines())

    def texts(d):
        lines = (d / "1best_recog" / "text").read_text().splitlines()
        return dict((line.split(" ", 1) + [""])[:2] for line in lines)

    for m in DEPLOY_MODELS:
        assert (exp / f"asr_{m}" / "onnx_valid.loss.ave" / "encoder.onnx").exists()
        greedy = "tdt_greedy" if m == "tdt" else "mb_greedy"
        for tag in DEPLOY_TAGS:
            d = exp / f"asr_{m}" / f"runtime_{tag}_valid.loss.ave" / "test"
            stats = json.loads((d / "decoding_stats.json").read_text())
            assert stats["utterances"] == n_test and stats["failed_utterances"] == {}
            assert (
                json.loads((d / "score.json").read_text())["num_utterances"] == n_test
            )
            if tag == "greedy_b1":
                ref = exp / f"asr_{m}" / f"decode_{greedy}_valid.loss.ave" / "test"
                assert texts(d) == texts(ref)
            if tag == "stream_greedy_c4":
                ref = exp / f"asr_{m}" / f"chunk_{greedy}_c4_valid.loss.ave" / "test"
                assert texts(d) == texts(ref)
    md = (exp / "RESULTS.md").read_text()
    section = md.split("\n## Deployment without torch")[1].split("\n## ")[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and "---" not in r]
    assert len(rows) == 1 + len(DEPLOY_MODELS) * len(DEPLOY_TAGS), section
    # stage 9's TDT on sherpa-onnx's features, decoded by sherpa-onnx: the runtime
    # with sherpa-onnx's rule gives its hypotheses
    name = "tdt_kaldi"
    sherpa = exp / f"asr_{name}" / "sherpa_greedy_valid.loss.ave" / "test"
    nemo = exp / f"asr_{name}" / "runtime_nemo_b1_valid.loss.ave" / "test"
    assert texts(sherpa) == texts(nemo) and len(texts(sherpa)) == n_test
    stats = json.loads((sherpa / "decoding_stats.json").read_text())
    assert stats["num_utterances"] == n_test and stats["rtf"] > 0
    assert "\n## sherpa-onnx\n" in md


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_report(smoke_run):
    work, log = smoke_run
    exp = work / "exp_smoke"
    md = (exp / "RESULTS.md").read_text()
    decoding = md.split("\n## Decoding\n")[1].split("\n## ")[0]  # the main table
    rows = [line for line in decoding.splitlines() if line.startswith("| ")]
    for m, search in DECODES:
        row = [r for r in rows if r.startswith(f"| {m} | {search} |")]
        assert len(row) == 1, (m, search, md)
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        assert re.fullmatch(r"\d+\.\d+%", cells[2]), row  # WER test
        assert re.fullmatch(r"\d+\.\d+%", cells[3]), row  # WER test_real
        assert cells[4].endswith(" s"), row  # decode time
        assert cells[6].endswith(" s"), row  # search time
    assert "speed-up" in md
    assert "## Repeated digits" in md and "## TDT vs multi-blank" in md
    lm_md = md.split("\n## Language models (shallow fusion)\n")[1].split("\n## ")[0]
    for m, search in LM_SEARCHES:
        rows = [r for r in lm_md.splitlines() if r.startswith(f"| {m} | {search} |")]
        assert len(rows) == 2, lm_md  # one per LM
        assert all("->" in r for r in rows), rows
    assert "- known-list condition" in lm_md and "- `test` with the LM" in lm_md
    assert "LM fusion at the chosen weights" in lm_md
    batched = md.split("\n## Batched beam search")[1].split("\n## ")[0]
    for m, search in (("tdt", "tdt_beam_label_b32"), ("multiblank", "mb_beam_b32")):
        assert any(r.startswith(f"| {m} | {search} |") for r in batched.splitlines())
    assert "- batched beam at most 1.5x the batched greedy" in batched
    times = md.split("\n## Word timestamps")[1].split("\n## ")[0]
    assert sum(r.startswith("| ") for r in times.splitlines()) >= 6
    half = md.split("\n## Half precision\n")[1].split("\n## ")[0]
    for m, search in DTYPE_JOBS:
        assert sum(r.startswith(f"| {m} | {search} |") for r in half.splitlines()) == 2
    for name in ("valid_loss.png", "wer_vs_search_time.png"):
        assert (exp / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the smoke run writes nothing into the recipe directory
    assert not (RECIPE / "exp_smoke").exists()
    # a re-run skips every finished stage
    proc = subprocess.run(
        [
            "bash",
            str(RECIPE / "run.sh"),
            "--smoke",
            "--dir",
            str(work),
            "--python",
            sys.executable,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count("done already") == 16, proc.stdout
