"""``bench/compare_commits.py --bench decode``'s worker on tiny chunk-conformer
models (``helpers/streaming_cases.py``), in this process: every search of
``DECODE_SEARCHES`` is built from the model's lattice (``mb_*`` / ``tdt_*``) and
timed at batch 1 and batched (streaming: batch 1), one JSON line per case with a
positive median. The parent (two checkouts side by side) is not run here."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import streaming_cases as sc
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "compare_commits.py"


def _bench():
    spec = importlib.util.spec_from_file_location("compare_commits", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind, metric", [("multiblank", "utterance"), ("tdt", "pass")])
def test_decode_worker_times_every_search(kind, metric, tmp_path, capsys):
    bench = _bench()
    exp = sc.make_experiment(tmp_path / "exp", kind)
    scp = sc.write_scp(tmp_path, [2000, 3000, 4000, 5000])
    args = argparse.Namespace(
        model_dir=[str(exp)],
        model_file="model.pth",
        data=str(scp),
        utts=3,
        batch=2,
        chunk=2,
        searches=None,
        metric=metric,
    )
    cases = bench._cases(argparse.Namespace(bench="decode", **vars(args)))
    names = [c["name"] for c in cases]
    streams = [n for n in bench.DECODE_SEARCHES if n.startswith("stream")]
    offline = [n for n in bench.DECODE_SEARCHES if n not in streams]
    assert names == [f"exp {s} b{b}" for s in offline for b in (1, 2)] + [
        f"exp {s} b1" for s in streams
    ]
    threads = torch.get_num_threads()
    capsys.readouterr()
    try:
        bench.worker(cases, 1, 1)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out.splitlines()
    lines = [json.loads(x) for x in out if x.startswith("{")]
    assert Path(lines[0]["package"]) == Path(sc.espnet_multiblank.__file__).parent
    got = {x["case"]: x["value"] for x in lines[1:]}
    assert list(got) == names
    assert all(v is not None and v > 0 for v in got.values()), got


def test_decode_value_by_utterance_and_by_pass():
    """Two passes over a call of 1 utterance and a batch of 3 (hand-computed)."""
    passes = [[(0.1, 1), (0.9, 3)], [(0.3, 1), (0.6, 3)]]
    # every call's seconds per utterance: 0.1, 0.3, 0.3, 0.2
    assert _bench().decode_value(passes, "utterance") == pytest.approx(0.25)
    # each pass's: 1.0 / 4, 0.9 / 4
    assert _bench().decode_value(passes, "pass") == pytest.approx(0.2375)
