"""LM fusion end to end: ``--lm_train_config --lm_file --lm_weight`` (an ESPnet LM
config written by ``espnet2.tasks.lm``) and ``--ngram_file --ngram_weight`` through the
plug-in's entry point and through ESPnet's stock ``espnet2.bin.asr_inference`` with
the start-up hook, on tiny random ``model: multiblank_espnet`` models.

Both entry points must give the same hypotheses and scores (token for token), scores
must be plain numbers, n-best lists in fused order, and an n-gram where it cannot
apply (ESPnet's beam search) is refused naming the option.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from espnet_experiments import dry_run_experiment, make_tdt_experiment
from test_decoding_cli import REPO, make_data, run_inference  # noqa: I100
from test_decoding_stock import (
    decode_args,
    plugin_experiments,
    read_outputs,
    stock_env,
)

import espnet_multiblank

pytestmark = pytest.mark.timeout(1800)
HAVE_KENLM = importlib.util.find_spec("kenlm") is not None
TOKENS = ["<blank>", "<unk>", "a", "b", "c", "<space>", "<sos/eos>"]

ARPA = """\\data\\
ngram 1=6
ngram 2=3

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.3
-0.7\t</s>\t0
-0.4\ta\t-0.2
-0.9\tb\t-0.1
-0.6\tc\t-0.2

\\2-grams:
-0.2\t<s> a
-0.3\ta b
-0.2\tb </s>

\\end\\
"""


def make_lm(root: Path) -> Path:
    """An ESPnet LM experiment (config.yaml by ESPnet's LM task, model.pth) over the
    ASR token list, with an output bias that favours ``b``."""
    from espnet2.tasks.lm import LMTask

    def favour_b(model):
        model.lm.decoder.bias[TOKENS.index("b")] += 2.0

    return dry_run_experiment(
        root / "lm",
        [
            "--token_type",
            "char",
            "--lm",
            "seq_rnn",
            "--lm_conf",
            "{unit: 16, nlayers: 1}",
        ],
        favour_b,
        task=LMTask,
        tokens=TOKENS,
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_cli")
    scp = make_data(root)
    espnet_multiblank.register()
    exps = plugin_experiments(root, (("mb", (2, 4), 0.5, 10.0), ("std", (), 0.5, 10.0)))
    (root / "tdt").mkdir()
    exps["tdt"] = make_tdt_experiment(root / "tdt")
    lm = make_lm(root)
    arpa = root / "lm.arpa"
    arpa.write_text(ARPA)
    return root, scp, exps, lm, arpa, stock_env(root)


def lm_args(lm: Path, weight: float = 1.0):
    return [
        "--lm_train_config",
        str(lm / "config.yaml"),
        "--lm_file",
        str(lm / "model.pth"),
        "--lm_weight",
        str(weight),
    ]


def ngram_args(arpa: Path, weight: float = 0.8):
    return ["--ngram_file", str(arpa), "--ngram_weight", str(weight)]


# (model, decode config, fused LMs)
CASES = [
    ("mb", "mb_beam.yaml", ("lm",)),
    ("mb", "greedy.yaml", ("lm",)),  # mapped to mb_greedy
    ("std", "greedy.yaml", ("lm",)),  # ESPnet's greedy type: runs fused as mb_greedy
    ("std", "beam.yaml", ("lm",)),  # ESPnet's beam search, its own LM fusion
    ("tdt", "tdt_beam.yaml", ("lm",)),
    ("tdt", "tdt_greedy.yaml", ("lm", "ngram")),
    ("mb", "mb_beam.yaml", ("lm", "ngram")),
    ("std", "mb_greedy.yaml", ("ngram",)),
]


def fused_args(lms, lm, arpa):
    # smaller weights for two LMs at once (each label pays both LMs' costs: with
    # large weights these random models would emit nothing)
    weight = 0.3 if len(lms) == 2 else None
    return (lm_args(lm, weight or 1.0) if "lm" in lms else []) + (
        ngram_args(arpa, weight or 0.8) if "ngram" in lms else []
    )


@pytest.mark.slow
def test_both_entry_points_fuse_the_lm_alike(setup):
    root, scp, exps, lm, arpa, env = setup
    cases = [c for c in CASES if HAVE_KENLM or "ngram" not in c[2]]
    procs = {}
    for model, conf, lms in cases:
        out = root / f"stock_{model}_{conf}_{'_'.join(lms)}"
        args = decode_args(exps[model], scp, out, conf) + fused_args(lms, lm, arpa)
        procs[model, conf, lms] = out, subprocess.Popen(
            [sys.executable, "-m", "espnet2.bin.asr_inference"] + args,
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    plugin, plain = {}, {}
    for model, conf, lms in cases:
        tag = f"{model}_{conf}_{'_'.join(lms)}"
        extra = ["--batch_size", "1"] + fused_args(lms, lm, arpa)
        stats = run_inference(exps[model], scp, root / f"plugin_{tag}", conf, *extra)
        plugin[model, conf, lms] = read_outputs(root / f"plugin_{tag}"), stats
        run_inference(
            exps[model], scp, root / f"plain_{tag}", conf, "--batch_size", "1"
        )
        plain[model, conf, lms] = read_outputs(root / f"plain_{tag}")
    for key, (out, proc) in procs.items():
        _, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"{key}:\n{err[-3000:]}"
        got, (want, _) = read_outputs(out), plugin[key]
        assert got["token_int"] == want["token_int"], key
        for utt, score in want["score"].items():
            float(score)  # a plain number (ESPnet's beam search with an LM: a tensor)
            assert float(got["score"][utt]) == pytest.approx(float(score), rel=1e-6)
    for key, (want, stats) in plugin.items():
        assert set(want["token_int"]) == {"u0", "u1", "u2"}, key
        if key[1] == "beam.yaml":
            continue  # ESPnet's beam search emits no label on these random models
        assert any(v.strip() for v in want["token_int"].values()), key  # labels
        # the LMs change the scores (the end of the sentence at least)
        assert want["score"] != plain[key]["score"], key
    # the searches that run: ESPnet's greedy type runs fused (plug-in), its beam
    # search stays ESPnet's
    assert plugin["std", "greedy.yaml", ("lm",)][1]["search"] == "GreedySearch"
    assert plugin["std", "beam.yaml", ("lm",)][1]["search"] == "BeamSearchTransducer"
    # with a strong LM something else than the scores changes somewhere
    assert any(
        want["token_int"] != plain[k]["token_int"] for k, (want, _) in plugin.items()
    )


def test_nbest_lists_are_in_fused_order(setup):
    root, scp, exps, lm, arpa, _ = setup
    out = root / "nbest"
    run_inference(exps["mb"], scp, out, "mb_beam.yaml", "--nbest", "3", *lm_args(lm))
    scores = {}
    for n in (1, 2, 3):
        lines = (out / f"{n}best_recog" / "score").read_text().splitlines()
        for line in lines:
            utt, score = line.split()
            scores.setdefault(utt, []).append(float(score))
    assert set(scores) == {"u0", "u1", "u2"}
    for utt, s in scores.items():
        assert len(s) == 3 and s == sorted(s, reverse=True), (utt, s)


def test_weight_zero_gives_the_lm_free_outputs(setup):
    root, scp, exps, lm, _, _ = setup
    for model, conf in (("mb", "mb_beam.yaml"), ("tdt", "tdt_greedy.yaml")):
        run_inference(exps[model], scp, root / f"w0_{model}", conf, *lm_args(lm, 0.0))
        run_inference(exps[model], scp, root / f"nolm_{model}", conf)
        assert read_outputs(root / f"w0_{model}") == read_outputs(
            root / f"nolm_{model}"
        )


@pytest.mark.skipif(not HAVE_KENLM, reason="the ngram extra (pip install kenlm)")
def test_ngram_refused_where_it_cannot_apply(setup):
    """ESPnet's beam search cannot use an n-gram: both entry points refuse it,
    naming --ngram_file (ESPnet alone would ignore it silently)."""
    root, scp, exps, _, arpa, env = setup
    with pytest.raises(ValueError, match="--ngram_file"):
        run_inference(
            exps["std"], scp, root / "ng_plugin", "beam.yaml", *ngram_args(arpa)
        )
    proc = subprocess.run(
        [sys.executable, "-m", "espnet2.bin.asr_inference"]
        + decode_args(exps["std"], scp, root / "ng_stock", "beam.yaml")
        + ngram_args(arpa),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode != 0 and "--ngram_file" in proc.stderr


def test_espnet_beam_scores_with_an_lm_become_numbers():
    """ESPnet's beam search adds ``lm_weight * lm_scores[k]`` (a tensor) to a
    hypothesis' score: the plug-in's results hold a float (ESPnet's stock loop would
    write ``tensor(-12.3)`` into the score file)."""
    from espnet2.asr.transducer.beam_search_transducer import Hypothesis

    from espnet_multiblank.espnet.inference.speech2text import to_espnet_hypothesis

    hyp = Hypothesis(score=-1.0 + torch.tensor(-0.5), yseq=[0, 3], dec_state=None)
    out = to_espnet_hypothesis(hyp)
    assert type(out.score) is float and out.score == -1.5
