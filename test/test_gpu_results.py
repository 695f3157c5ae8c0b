"""bench/gpu_results.py: a gpu_check.sh run's folder to one JSON object (the logs are
written here as pytest and the script write them)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gathers_a_run(tmp_path):
    (tmp_path / "env.txt").write_text(
        "Fri Dec  4 13:35:00 UTC 2026\n"
        "GPU 0: NVIDIA H200 (UUID: GPU-1234)\n"
        "torch 2.11.0+cu130\ntriton 3.6.0\n"
    )
    # a complete stage: its summary line counts
    (tmp_path / "pytest_fused.log").write_text(
        "..F.s\nFAILED test/x.py::t - boom\n3 passed, 1 failed, 1 skipped in 9.1s\n"
    )
    # a stage cut by its budget: its progress characters count
    (tmp_path / "pytest_gpu.log").write_text(
        "...........F..s.......... [ 40%]\n.....F\n"
    )
    (tmp_path / "failures.txt").write_text(
        "===== test/x.py::t (call)\nboom\n===== test/y.py::u[cuda] (call)\nbang\n"
    )
    rows = [{"name": "fused", "mem_mb": 70.0}, {"name": "dense", "mem_mb": 1300.0}]
    (tmp_path / "joint_loss.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows) + "\nnot json\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "gpu_results.py"),
            str(tmp_path),
            "--stages",
            "test fused_test",
            "--commit",
            "abc123",
            "--rc",
            "test=124,fused_test=1",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    res = json.loads(out.stdout)
    assert res["gpu"] == "NVIDIA H200" and res["commit"] == "abc123"
    assert res["torch"] == "2.11.0+cu130" and res["triton"] == "3.6.0"
    assert res["rc"] == {"test": 124, "fused_test": 1}
    fused = res["tests"]["fused_test"]
    assert (fused["passed"], fused["failed"], fused["skipped"]) == (3, 1, 1)
    assert fused["complete"]
    cut = res["tests"]["test"]
    assert (cut["passed"], cut["failed"], cut["skipped"]) == (28, 2, 1)
    assert not cut["complete"]
    assert res["failed_tests"] == ["test/x.py::t", "test/y.py::u[cuda]"]
    assert res["benchmarks"]["joint_loss.jsonl"] == rows


def _train_row(lattice, joint, **over):
    row = dict(
        name="train",
        lattice=lattice,
        joint=joint,
        steps=300,
        steps_done=300,
        loss_start=28.4,
        loss_end=9.1,
        falls=True,
        nonfinite_loss_steps=0,
        nonfinite_grad_steps=0,
        params_finite=True,
        step_ms_median=41.5,
        peak_mem_mb=310.2,
        losses=[28.0, 29.0, 9.0],
    )
    row.update(over)
    return row


def _gather(tmp_path, stages="train", rc="train=0"):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "gpu_results.py"),
            str(tmp_path),
            "--stages",
            stages,
            "--rc",
            rc,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_gathers_the_training_stage(tmp_path):
    rows = [
        _train_row("multiblank", "dense"),
        _train_row("multiblank", "fused", step_ms_median=30.0, peak_mem_mb=200.0),
        dict(name="train_compare", lattice="multiblank", max_rel_diff=2e-6),
    ]
    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows) + "\nTraceback (not json)\n"
    )
    (tmp_path / "train.log").write_text(
        "import espnet2.tasks.abs_task: ModuleNotFoundError: No module named 'h5py'\n"
        "imports: 1 failed\n"
    )
    res = _gather(tmp_path)
    tr = res["training"]
    assert sorted(tr["runs"]) == ["multiblank/dense", "multiblank/fused"]
    fused = tr["runs"]["multiblank/fused"]
    # the per-step losses stay in train.jsonl; the figures come through
    assert "losses" not in fused and "name" not in fused
    assert (fused["step_ms_median"], fused["peak_mem_mb"]) == (30.0, 200.0)
    assert tr["compare"] == {"multiblank": {"max_rel_diff": 2e-6}}
    assert tr["import_errors"] == [
        "espnet2.tasks.abs_task: ModuleNotFoundError: No module named 'h5py'"
    ]
    assert tr["ok"] is True
    assert res["rc"] == {"train": 0}


def test_training_not_ok_on_nan_or_a_loss_that_does_not_fall(tmp_path):
    for bad in (
        dict(nonfinite_loss_steps=3),
        dict(params_finite=False),
        dict(falls=False, loss_end=30.0),
    ):
        rows = [_train_row("tdt", "dense"), _train_row("tdt", "fused", **bad)]
        (tmp_path / "train.jsonl").write_text(
            "\n".join(json.dumps(r) for r in rows) + "\n"
        )
        tr = _gather(tmp_path)["training"]
        assert tr["ok"] is False, bad
    # a stage that wrote nothing: no training section; one that wrote only its log
    # (its imports failed): not ok
    (tmp_path / "train.jsonl").unlink()
    assert "training" not in _gather(tmp_path)
    (tmp_path / "train.log").write_text("import librosa.filters: ImportError: x\n")
    tr = _gather(tmp_path)["training"]
    assert tr == {
        "runs": {},
        "compare": {},
        "import_errors": ["librosa.filters: ImportError: x"],
        "ok": False,
    }
