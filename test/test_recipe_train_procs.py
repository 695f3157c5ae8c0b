"""run.sh --train_procs N: the training stages' command lines, threads, markers and
re-runs, with a stand-in for Python (records its arguments, writes the file run.sh
expects). The DDP training itself is tested in test_espnet_ddp.py."""

import os
import re
import subprocess
from pathlib import Path

import pytest

RUN_SH = Path(__file__).resolve().parents[1] / "egs" / "digits" / "asr1" / "run.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
# stand-in for python: record the call, then act like asr_train
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "--output_dir" ] && out=$a
  prev=$a
done
name=$(basename "${out%.tmp}")
echo "$name OMP=${OMP_NUM_THREADS:-unset} $*" >> "$FAKE_LOG"
if [ -n "$out" ]; then
  touch "$out/from_${FAKE_TAG:-run}"
  case " ${FAKE_FAIL:-} " in
    *" $name "*) echo "Traceback: fake failure" >&2; exit 1 ;;
  esac
  touch "$out/valid.loss.ave.pth"
  echo "config" > "$out/config.yaml"
fi
"""


@pytest.fixture
def recipe_dir(tmp_path):
    """A --dir whose stages 1-5 are marked done, and the stand-in python."""
    done = tmp_path / "work" / "exp" / ".done"
    done.mkdir(parents=True)
    for n in range(1, 6):
        (done / str(n)).write_text("earlier\n")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def _call(script, root, *args, **env):
    """Run ``script --dir root/work --python <stand-in> args`` with OMP_NUM_THREADS
    unset; returns the process and the stand-in's recorded calls."""
    log = root / "calls.log"
    full_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    full_env.update(FAKE_LOG=str(log), **env)
    cmd = ["bash", str(script), "--dir", str(root / "work")]
    cmd += ["--python", str(root / "python"), *args]
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return proc, calls


def _run(root, *args, **env):
    proc, calls = _call(RUN_SH, root, "--stage", "6", "--stop_stage", "7", *args, **env)
    return proc, {c.split()[0]: c for c in calls}


DDP_FLAGS = "--multiprocessing_distributed true --dist_world_size 2 --dist_timeout 600"


@pytest.mark.parametrize("jobs, omp", [("2", "OMP=1"), ("1", "OMP=unset")])
def test_train_procs_passes_ddp_flags_to_both_models(recipe_dir, jobs, omp):
    proc, calls = _run(recipe_dir, "--train_procs", "2", "--train_jobs", jobs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(calls) == {"asr_standard", "asr_multiblank"}, calls
    for name, call in calls.items():
        assert DDP_FLAGS in call, call
        assert call.split()[1] == omp, call  # 1 thread per process only with 2 jobs
        exp = recipe_dir / "work" / "exp" / name
        assert (exp / "train_procs").read_text().strip() == "2"
    done = recipe_dir / "work" / "exp" / ".done"
    assert (done / "6").exists() and (done / "7").exists()


def test_one_process_by_default(recipe_dir):
    proc, calls = _run(recipe_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for call in calls.values():
        assert "--multiprocessing_distributed" not in call
        assert "--dist_world_size" not in call
    exp = recipe_dir / "work" / "exp"
    assert (exp / "asr_multiblank" / "train_procs").read_text().strip() == "1"


def test_failed_ddp_training_reruns_cleanly(recipe_dir):
    proc, _ = _run(
        recipe_dir, "--train_procs", "2", FAKE_FAIL="asr_multiblank", FAKE_TAG="first"
    )
    assert proc.returncode != 0 and "training multiblank failed" in proc.stderr
    exp = recipe_dir / "work" / "exp"
    assert (exp / ".done" / "6").exists() and not (exp / ".done" / "7").exists()
    assert (exp / "asr_multiblank.tmp" / "from_first").exists()
    proc, calls = _run(recipe_dir, "--train_procs", "2", FAKE_TAG="second")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(calls) == ["asr_multiblank"]  # the standard model was done already
    assert DDP_FLAGS in calls["asr_multiblank"]
    assert not (exp / "asr_multiblank.tmp").exists()
    assert sorted(p.name for p in (exp / "asr_multiblank").iterdir()) == [
        "config.yaml",
        "from_second",  # nothing left from the failed attempt
        "train.log",
        "train_procs",
        "train_seconds",
        "valid.loss.ave.pth",
    ]


@pytest.mark.parametrize("bad", ["0", "two", "-1", ""])
def test_train_procs_must_be_a_positive_integer(recipe_dir, bad):
    proc, calls = _run(recipe_dir, "--train_procs", bad)
    assert proc.returncode == 1 and calls == {}
    assert f"--train_procs must be a positive integer, got '{bad}'" in proc.stderr


COMPARE_SH = RUN_SH.parent / "local" / "compare_procs.sh"


def _compare(root, *args):
    return _call(COMPARE_SH, root, *args)


def test_compare_procs_trains_every_seed_and_process_count_once(recipe_dir):
    """local/compare_procs.sh: one training per (processes, seed) in its own run dir
    (procs/N for seed 0, procs/N_seedS otherwise) with ESPnet's --seed and run.sh's DDP
    flags; a re-run trains nothing again."""
    section = ("--out", str(recipe_dir / "section.md"))  # not the run's report
    proc, calls = _compare(recipe_dir, "--procs", "1 2", "--seeds", "0 3", *section)
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in calls if c.startswith("asr_multiblank ")]
    procs_dir = recipe_dir / "work" / "procs"
    seen = {}
    for call in trains:
        out = call.split("--output_dir ")[1].split()[0]
        run = Path(out).parents[1].name
        seen[run] = call
    assert sorted(seen) == ["1", "1_seed3", "2", "2_seed3"]
    assert len(trains) == 4
    for run, call in seen.items():
        seed = run.split("_seed")[1] if "_seed" in run else "0"
        assert call.endswith(f"--seed {seed}")
        assert (DDP_FLAGS in call) == run.startswith("2")
        assert str(procs_dir / run / "exp" / "asr_multiblank.tmp") in call
    decodes = [c for c in calls if "espnet_multiblank.bin.asr_inference" in c]
    assert len(decodes) == 4 and all("/mb_greedy.yaml" in c for c in decodes)
    report = [c for c in calls if " -m report.procs " in c]
    assert len(report) == 1 and (recipe_dir / "section.md").exists()
    for run in seen:
        n, seed = run.split("_seed") if "_seed" in run else (run, "0")
        assert f"{n}={seed}={procs_dir / run / 'exp' / 'asr_multiblank'}=" in report[0]

    proc, calls = _compare(recipe_dir, "--procs", "1 2", "--seeds", "0 3", *section)
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in calls if c.startswith("asr_multiblank ")]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--seeds", "1 x"), "--seeds must be non-negative integers, got 'x'"),
        (("--model", "ctc"), "--model must be standard, multiblank or tdt"),
        (("--search", "nope"), "no decode config"),
    ],
)
def test_compare_procs_rejects_bad_options(recipe_dir, args, message):
    proc, calls = _compare(recipe_dir, *args)
    assert proc.returncode != 0 and message in proc.stderr
    assert not calls


def test_run_dir_of_another_stage_layout_is_refused(recipe_dir):
    """Markers written by a run.sh with other stage numbers (the three-model layout
    before the LM stages) would resume the wrong stages: refused, nothing run."""
    done = recipe_dir / "work" / "exp" / ".done"
    (done / "layout").write_text(
        "3 models: 6 standard, 7 multiblank, 8 tdt, 9 decode, 10 score, 11 report\n"
    )
    proc, calls = _run(recipe_dir)
    assert proc.returncode != 0 and "stage markers of another run.sh" in proc.stderr
    assert calls == {}
    (done / "layout").unlink()  # a dir without a layout file: taken as this layout
    proc, calls = _run(recipe_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the layout this run.sh writes (its own `layout="..."` line)
    (layout,) = re.findall(r'^layout="([^"]+)"', RUN_SH.read_text(), re.M)
    assert (done / "layout").read_text() == layout + "\n"
