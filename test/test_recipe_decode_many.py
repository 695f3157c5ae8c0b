"""The recipe's decoding driver (egs/digits/asr1/local/decode_many.py): many decodings
in one process give the outputs of one process per decoding; a failed job is reported
and leaves no output directory."""

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from espnet_experiments import make_experiment, make_tdt_experiment

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "egs/digits/asr1/local"
CONF = REPO / "conf/decode"
#: what must be the same, file by file, whichever process decoded
COMPARED = ("text", "token", "token_int", "score")


@pytest.fixture(scope="module")
def decode_many():
    sys.path.insert(0, str(LOCAL))
    try:
        return importlib.import_module("decode_many")
    finally:
        sys.path.remove(str(LOCAL))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    import soundfile

    root = tmp_path_factory.mktemp("decode_many")
    rng = np.random.default_rng(1)
    lines = []
    for i, n in enumerate([9000, 5000, 12000]):
        wav = root / f"u{i}.wav"
        soundfile.write(wav, (0.1 * rng.standard_normal(n)).astype(np.float32), 16000)
        lines.append(f"u{i} {wav}")
    (root / "wav.scp").write_text("\n".join(lines) + "\n")
    (root / "mb").mkdir()
    (root / "tdt").mkdir()
    mb = make_experiment(root / "mb", durations=(2, 4), blank_bias=0.5, scale=10.0)
    tdt = make_tdt_experiment(root / "tdt")
    return root, mb, tdt


def job_args(root: Path, exp: Path, conf: str, *extra: str) -> list:
    return [
        "--ngpu",
        "0",
        "--config",
        str(CONF / conf),
        "--asr_train_config",
        str(exp / "config.yaml"),
        "--asr_model_file",
        str(exp / "model.pth"),
        "--data_path_and_name_and_type",
        f"{root / 'wav.scp'},speech,sound",
        *extra,
    ]


def write_queue(path: Path, jobs) -> None:
    path.write_text("".join("\t".join([str(out), *args]) + "\n" for out, args in jobs))


def outputs(out: Path) -> dict:
    return {name: (out / "1best_recog" / name).read_text() for name in COMPARED}


def test_one_process_gives_the_outputs_of_separate_processes(workdir):
    root, mb, tdt = workdir
    beam = job_args(root, mb, "mb_beam.yaml", "--batch_size", "2")
    tdt_bf16 = job_args(root, tdt, "tdt_beam.yaml", "--dtype", "bfloat16")
    # the multi-blank beam before and after a TDT model decoded in bfloat16
    jobs = [
        (root / "many" / "beam", beam),
        (root / "many" / "tdt_bf16", tdt_bf16),
        (root / "many" / "beam_again", beam),
    ]
    queue = root / "queue"
    write_queue(queue, jobs)
    subprocess.run(
        [sys.executable, str(LOCAL / "decode_many.py"), str(queue)], check=True
    )
    for name, args in (("beam", beam), ("tdt_bf16", tdt_bf16)):
        out = root / "alone" / name
        subprocess.run(
            [
                sys.executable,
                "-m",
                "espnet_multiblank.bin.asr_inference",
                *args,
                "--output_dir",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        assert outputs(root / "many" / name) == outputs(out), name
    assert outputs(root / "many" / "beam_again") == outputs(root / "many" / "beam")
    for out, _ in jobs:
        assert not out.with_name(out.name + ".tmp").exists()
        log = (out / "decode.log").read_text()
        # each job's log has its command and ESPnet's logging (the handler made in
        # the first job writes into the later jobs' logs too)
        assert "asr_inference" in log and "INFO: config file:" in log, out
        assert "Logging error" not in log, out
        assert (out / "decoding_stats.json").is_file()
    # some label was decoded (else the comparisons would be vacuous)
    assert any(len(line.split()) > 1 for line in outputs(out)["text"].splitlines())


def test_a_failed_job_stops_the_queue(workdir, decode_many, tmp_path, capfd):
    root, mb, _ = workdir
    bad = job_args(root, mb, "mb_greedy.yaml")
    bad[bad.index("--asr_model_file") + 1] = str(tmp_path / "missing.pth")
    good = job_args(root, mb, "mb_greedy.yaml")
    queue = tmp_path / "queue"
    write_queue(queue, [(tmp_path / "bad", bad), (tmp_path / "good", good)])
    assert decode_many.main([str(queue)]) == 1
    err = capfd.readouterr().err
    assert "decoding failed" in err and str(tmp_path / "bad.tmp.log") in err
    assert "missing.pth" in (tmp_path / "bad.tmp.log").read_text()
    assert not (tmp_path / "bad").exists()
    # the job after the failure was not claimed: another worker would not start it
    assert not (tmp_path / "good").exists() and not (tmp_path / "good.tmp").exists()
    assert (tmp_path / "queue.claims" / "failed").exists()
    assert decode_many.main([str(queue), "--worker", "1"]) == 1


def test_claims_are_exclusive(decode_many, tmp_path):
    assert decode_many.claim(tmp_path, 3)
    assert not decode_many.claim(tmp_path, 3)
    assert decode_many.claim(tmp_path, 4)


@pytest.mark.parametrize(
    "line", ["\t--config\tx.yaml", "out\t--output_dir\tsomewhere"], ids=["no_out", "od"]
)
def test_a_malformed_queue_line_is_refused(decode_many, tmp_path, line):
    queue = tmp_path / "queue"
    queue.write_text(f"ok\t--config\tx.yaml\n{line}\n")
    with pytest.raises(ValueError, match="queue:2"):
        decode_many.read_queue(queue)
