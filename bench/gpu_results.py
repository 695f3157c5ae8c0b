"""What a run of ``bench/gpu_check.sh`` measured, as one JSON object on stdout (the
script writes it to ``$OUT/gpu_results.json``; issue 40 asks for it beside the
bench/RESULTS.md section).

Reads the run's folder: ``env.txt`` (date, GPU, versions), each stage's pytest log
(passed / failed / skipped: pytest's summary line, or, for a stage cut by its budget
before the summary, the progress characters it printed) and ``failures.txt``, and the
benchmarks' JSON lines (``bench.jsonl``, ``joint_loss.jsonl``, ``decode_beam.jsonl``,
``decode.jsonl`` when present), and the training stage's (``train.jsonl``,
``train.log``: bench/gpu_train.py) as ``training``. Nothing here needs a GPU or torch.

Usage: python bench/gpu_results.py OUT --stages "..." --commit HASH --rc a=0,b=124
"""

import argparse
import json
import os
import re
import sys

PYTEST_LOGS = {
    "test": "pytest_gpu.log",
    "ll": "pytest_label_looping.log",
    "fused_test": "pytest_fused.log",
    "beam_test": "pytest_batched_beam.log",
}
BENCH_FILES = ("bench.jsonl", "joint_loss.jsonl", "decode_beam.jsonl", "decode.jsonl")
TRAIN_FILES = ("train.jsonl", "train.log")
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed)")
_PROGRESS = re.compile(r"^([.FsExX]+)\s*(\[\s*\d+%\])?$")


def pytest_counts(text: str) -> dict:
    """passed / failed / skipped / error of a pytest -q log; ``complete``: whether
    its summary line was printed (a stage cut by its budget prints none)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    summaries = [
        line for line in text.splitlines() if _SUMMARY.search(line) and " in " in line
    ]
    if summaries:
        for n, what in _SUMMARY.findall(summaries[-1]):
            key = "error" if what.startswith("error") else what
            if key in counts:
                counts[key] = int(n)
        return dict(counts, complete=True)
    for line in text.splitlines():
        m = _PROGRESS.match(line.strip())
        if m:
            chars = m.group(1)
            counts["passed"] += chars.count(".")
            counts["failed"] += chars.count("F")
            counts["skipped"] += chars.count("s")
            counts["error"] += chars.count("E")
    return dict(counts, complete=False)


def env_facts(text: str) -> dict:
    lines = text.splitlines()
    facts = {"date": lines[0].strip() if lines else None, "gpu": None}
    for line in lines:
        if line.startswith("GPU "):
            facts["gpu"] = line.split(":", 1)[1].split("(UUID")[0].strip()
        for name in ("torch", "numba", "numba_cuda", "triton", "python", "cuda"):
            if line.startswith(name + " "):
                facts[name] = line.split(" ", 1)[1].strip()
    return facts


def _read(path: str):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _json_lines(text: str) -> list:
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def training(rows: list, log: str = "") -> dict:
    """The training stage (bench/gpu_train.py's JSON lines and log): ``runs`` by
    "lattice/joint" (each row without its per-step losses), ``compare`` by lattice
    (dense vs fused), ``import_errors`` (the log's "import MODULE: ERROR" lines: the
    wheels that did not cover ESPnet's imports), and ``ok``: at least one run, and
    every run with finite losses and parameters and a loss lower at its end than at
    its start."""
    runs, compare = {}, {}
    for r in rows:
        if r.get("name") == "train":
            key = f"{r.get('lattice')}/{r.get('joint')}"
            runs[key] = {k: v for k, v in r.items() if k not in ("name", "losses")}
        elif r.get("name") == "train_compare":
            compare[r.get("lattice")] = {
                k: v for k, v in r.items() if k not in ("name", "lattice")
            }
    ok = bool(runs) and all(
        r.get("falls") is True
        and r.get("nonfinite_loss_steps") == 0
        and r.get("params_finite") is True
        for r in runs.values()
    )
    import_errors = re.findall(r"^import (\S+): (.*)$", log, re.M)
    return {
        "runs": runs,
        "compare": compare,
        "import_errors": [f"{m}: {e}" for m, e in import_errors],
        "ok": ok,
    }


def gather(out: str, stages: str, commit: str, rcs: dict) -> dict:
    env = _read(os.path.join(out, "env.txt")) or ""
    result = {"commit": commit, "stages": stages.split(), "rc": rcs}
    result.update(env_facts(env))
    tests = {}
    for stage, name in PYTEST_LOGS.items():
        text = _read(os.path.join(out, name))
        if text is not None:
            tests[stage] = pytest_counts(text)
    result["tests"] = tests
    failures = _read(os.path.join(out, "failures.txt")) or ""
    result["failed_tests"] = re.findall(r"^===== (\S+)", failures, re.M)
    result["benchmarks"] = {}
    for name in BENCH_FILES:
        text = _read(os.path.join(out, name))
        if text is not None:
            result["benchmarks"][name] = _json_lines(text)
    rows, log = (_read(os.path.join(out, name)) for name in TRAIN_FILES)
    if rows is not None or log is not None:
        result["training"] = training(_json_lines(rows or ""), log or "")
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--stages", default="")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--rc", action="append", default=[], help="stage=rc,...")
    args = p.parse_args(argv)
    rcs = {}
    for item in ",".join(args.rc).split(","):
        if "=" in item:
            k, v = item.split("=", 1)
            rcs[k] = int(v) if v.lstrip("-").isdigit() else v
    json.dump(gather(args.out, args.stages, args.commit, rcs), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
