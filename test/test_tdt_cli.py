"""TDT decoding end to end through ESPnet's stock ``python -m
espnet2.bin.asr_inference`` (with the start-up hook) on a tiny random ``model:
multiblank_espnet`` TDT: the plug-in's own entry point's hypotheses, token for token.

The plug-in's entry point on the TDT (greedy batched and single against the
reference rule, beam, ESPnet's greedy type) runs with every lattice in
test_decoding_cli.py; the stock entry point on the other lattices in
test_decoding_stock.py.
"""

import subprocess
import sys

import pytest
from espnet_experiments import make_tdt_experiment
from test_decoding_cli import REPO, make_data, run_inference  # noqa: I100
from test_decoding_stock import decode_args, read_outputs, stock_env

import espnet_multiblank


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tdt_cli")
    scp = make_data(root)
    espnet_multiblank.register()
    exp = make_tdt_experiment(root)
    return root, scp, exp, stock_env(root)


def test_stock_inference_equals_plugin_inference(setup):
    root, scp, exp, env = setup
    procs = {}
    for conf in ("tdt_greedy.yaml", "tdt_beam.yaml", "beam.yaml"):
        out = root / f"stock_{conf.split('.')[0]}"
        args = decode_args(exp, scp, out, conf)
        args[args.index("--batch_size") + 1] = "1"
        procs[conf] = (
            subprocess.Popen(
                [sys.executable, "-m", "espnet2.bin.asr_inference"] + args,
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ),
            out,
        )
    plugin = {}
    for conf in procs:
        out = root / f"plugin_{conf.split('.')[0]}"
        stats = run_inference(exp, scp, out, conf, "--batch_size", "1")
        plugin[conf] = read_outputs(out), stats
    for conf, (proc, out) in procs.items():
        _, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"{conf}:\n{err[-3000:]}"
        got = read_outputs(out)
        want, stats = plugin[conf]
        assert stats["search"] == (
            "GreedySearch" if conf == "tdt_greedy.yaml" else "BeamSearch"
        )
        assert set(got["token_int"]) == {"u0", "u1", "u2"}
        assert got["token_int"] == want["token_int"], conf
        assert got["text"] == want["text"], conf
        for utt, score in want["score"].items():
            assert float(got["score"][utt]) == pytest.approx(float(score), rel=1e-6)
    assert any(v.strip() for v in plugin["tdt_greedy.yaml"][0]["token_int"].values())
