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
