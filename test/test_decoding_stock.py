"""ESPnet's stock ``python -m espnet2.bin.asr_inference`` on the plug-in's models.

With the start-up hook, the stock module must decode ``model: multiblank_espnet``
models with the plug-in's searches (the same hypotheses as the plug-in's own entry
point, token for token), and refuse what it cannot do with an error naming the
plug-in's entry point: never a silent wrong answer (before the hook wrapped it, the
stock module emitted big blanks as labels).

The subprocesses run the hook of this checkout: a ``sitecustomize`` on PYTHONPATH
replaces whatever hook the environment's ``.pth`` installed by this checkout's
bootstrap (:func:`espnet_multiblank.espnet.autoregister.pth_line`).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from espnet_experiments import inference_args
from hook_env import stock_env
from test_decoding_cli import (  # noqa: I100
    CONF,
    REPO,
    make_data,
    make_experiment,
    run_inference,
)

import espnet_multiblank


def read_outputs(out: Path):
    """{file: {utt: value}} of 1best_recog."""
    best = out / "1best_recog"
    result = {}
    for name in ("token_int", "token", "text", "score"):
        path = best / name
        lines = path.read_text().splitlines() if path.exists() else []
        result[name] = dict(
            (line.split(" ", 1) + [""])[:2] for line in lines if line.strip()
        )
    return result


def plugin_experiments(root: Path, specs) -> dict:
    """``{name: exp dir}`` of tiny random ``model: multiblank_espnet`` models, one per
    ``(name, big-blank durations, blank bias, joint output scale)``."""
    exps = {}
    for name, durations, bias, scale in specs:
        (root / name).mkdir()
        exps[name] = make_experiment(
            root / name, durations, model="multiblank_espnet", blank_bias=bias
        )
        path = exps[name] / "model.pth"
        state = torch.load(path)
        state["joint_network.lin_out.weight"] *= scale
        torch.save(state, path)
    return exps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("stock")
    scp = make_data(root)
    espnet_multiblank.register()
    # joint networks that make these random models emit labels (and big blanks)
    exps = plugin_experiments(root, (("mb", (2, 4), 0.5, 10.0), ("std", (), 0, 1)))
    env = stock_env(root)
    return root, scp, exps, env


def decode_args(exp: Path, scp: Path, out: Path, conf: str):
    return inference_args(
        exp, scp, out, "--config", str(CONF / conf), "--batch_size", "1"
    )


# (model, decode config): greedy/beam are ESPnet's search types (served by the plug-in
# on a multi-blank model), mb_beam a plug-in type
CASES = [
    ("mb", "greedy.yaml"),
    ("mb", "beam.yaml"),
    ("mb", "mb_beam.yaml"),
    ("std", "greedy.yaml"),
    ("std", "beam.yaml"),
]


@pytest.mark.slow
def test_stock_inference_equals_plugin_inference(setup):
    """Stock CLI (subprocesses, in parallel) vs the plug-in's own inference."""
    root, scp, exps, env = setup
    procs = {}
    for model, conf in CASES + [("mb", "batch")]:
        out = root / f"o_stock_{model}_{conf.split('.')[0]}"
        args = decode_args(
            exps[model], scp, out, conf.replace("batch", "mb_greedy.yaml")
        )
        if conf == "batch":  # the plug-in's loop batches on the stock route too
            args[args.index("--batch_size") + 1] = "2"
        procs[model, conf] = (
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
    for model, conf in CASES + [("mb", "mb_greedy.yaml")]:
        out = root / f"o_plugin_{model}_{conf.split('.')[0]}"
        stats = run_inference(exps[model], scp, out, conf, "--batch_size", "1")
        plugin[model, conf] = read_outputs(out), stats
    stock, stock_stats = {}, {}
    for key, (proc, out) in procs.items():
        _, err = proc.communicate(timeout=1800)
        stock[key] = proc.returncode, err, read_outputs(out)
        stock_stats[key] = out / "decoding_stats.json"

    code, err, outputs = stock.pop(("mb", "batch"))
    assert code == 0, err[-3000:]
    batched_stats = json.loads(stock_stats.pop(("mb", "batch")).read_text())
    assert batched_stats["batch_size"] == 2
    # batched greedy gives the hypotheses of batch 1
    assert set(outputs["token_int"]) == {"u0", "u1", "u2"}
    assert outputs["token_int"] == plugin["mb", "mb_greedy.yaml"][0]["token_int"]
    for (model, conf), (code, err, got) in stock.items():
        assert code == 0, f"{model} {conf} failed:\n{err[-3000:]}"
        want, _ = plugin[model, conf]
        assert set(got["token_int"]) == {"u0", "u1", "u2"}
        assert got["token_int"] == want["token_int"], (model, conf)
        assert got["text"] == want["text"], (model, conf)
        for utt, score in want["score"].items():
            assert float(got["score"][utt]) == pytest.approx(float(score), rel=1e-6)
        # the stock run writes the plug-in's statistics too (for throughput reports)
        st = json.loads(stock_stats[model, conf].read_text())
        _, plugin_st = plugin[model, conf]
        assert st["num_utterances"] == plugin_st["num_utterances"] == 3
        assert st["entry_point"] == "espnet2.bin.asr_inference"
        for key in ("total_frames", "frames_skipped", "big_blank_emissions"):
            assert st[key] == plugin_st[key], (model, conf, key)
        assert 0 < st["search_seconds"] <= st["decode_seconds"]
    # the cases decode labels, and the multi-blank model big blanks
    for model in ("mb", "std"):
        tokens = plugin[model, "greedy.yaml"][0]["token_int"].values()
        assert any(t.strip() for t in tokens)
    assert plugin["mb", "greedy.yaml"][1]["big_blank_emissions"] > 0


def test_help_texts_argparse_cannot_format_are_escaped():
    """A lone "%" in a help text (ESPnet 202611's --ctc_window_margin says "3.19% CER")
    makes argparse's --help raise; the wrapped get_parser escapes it, and leaves
    "%(default)s", "%%" and texts that format alone."""
    import argparse

    from espnet_multiblank.espnet.inference.stock_inference import (
        escape_stray_percents,
    )

    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--a", default=5, help="3.19% CER, default %(default)s")
    parser.add_argument("--b", default=1, help="100%% sure, default %(default)s")
    with pytest.raises(ValueError, match="unsupported format character"):
        parser.format_help()
    escape_stray_percents(parser)
    text = " ".join(parser.format_help().split())
    assert "3.19% CER, default 5" in text and "100% sure, default 1" in text
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["b"] == "100%% sure, default %(default)s"  # it formatted: unchanged
