"""Unit checks of the recipe's report (egs/digits/asr1/local/make_report.py and the
section modules in local/report/)."""

import importlib
import sys
from pathlib import Path

import pytest

LOCAL = Path(__file__).resolve().parents[1] / "egs/digits/asr1/local"


@pytest.fixture(scope="module")
def make_report():
    """The stage-times section (its run_span), imported as make_report.py does."""
    sys.path.insert(0, str(LOCAL))
    try:
        yield importlib.import_module("report.stages")
    finally:
        sys.path.remove(str(LOCAL))


def write_markers(done: Path, stages):
    done.mkdir()
    for n, (finish, secs) in stages.items():
        (done / str(n)).write_text(f"{finish}, {secs} s\n")


def test_run_span_covers_parallel_stages(make_report, tmp_path):
    """Stages 6 and 7 run side by side: the span is first start to last finish, not
    the sum of the stage times (here 09:00:00 - 10 s to 09:30:00)."""
    stages = {k: (f"2026-01-01T09:00:{k:02d}", 1) for k in range(1, 6)}
    stages[1] = ("2026-01-01T09:00:00", 10)
    stages[6] = ("2026-01-01T09:20:00", 1000)
    stages[7] = ("2026-01-01T09:20:05", 1000)
    stages[8] = ("2026-01-01T09:29:59", 590)
    stages[9] = ("2026-01-01T09:30:00", 1)
    write_markers(tmp_path / "done", stages)
    assert make_report.run_span(str(tmp_path / "done")) == pytest.approx(1810.0)


def test_run_span_needs_every_stage(make_report, tmp_path):
    stages = {k: (f"2026-01-01T09:00:{k:02d}", 1) for k in range(1, 9)}  # no 9
    write_markers(tmp_path / "done", stages)
    assert make_report.run_span(str(tmp_path / "done")) is None
    (tmp_path / "done" / "9").write_text("garbled\n")
    assert make_report.run_span(str(tmp_path / "done")) is None
