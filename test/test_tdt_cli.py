"""TDT decoding end to end: ``espnet_multiblank.bin.asr_inference`` and ESPnet's stock
``python -m espnet2.bin.asr_inference`` (with the start-up hook) on a tiny random
``model: multiblank_espnet`` TDT."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import soundfile
import torch
from test_decoding_cli import REPO, _train_args, make_data, run_inference  # noqa: I100
from test_decoding_stock import decode_args, read_outputs, stock_env
from test_tdt_search import reference_greedy

import espnet_multiblank

DURS = [0, 1, 2, 3]


def make_tdt_experiment(root: Path) -> Path:
    """config.yaml (ASRTask --dry_run) + model.pth of a random TDT whose joint network
    emits labels, long blanks and labels that move."""
    from espnet2.tasks.asr import ASRTask

    exp = root / "exp"
    (root / "tokens.txt").write_text(
        "\n".join(["<blank>", "<unk>", "a", "b", "c", "<space>", "<sos/eos>"]) + "\n"
    )
    args = _train_args("multiblank_espnet")
    args[args.index("--model_conf") + 1] = "{transducer_tdt_durations: %s}" % DURS
    ASRTask.main(
        cmd=["--dry_run", "true", "--output_dir", str(exp)]
        + ["--token_list", str(root / "tokens.txt")]
        + args
    )
    torch.manual_seed(0)
    model, _ = ASRTask.build_model_from_file(exp / "config.yaml", None, "cpu")
    with torch.no_grad():
        model.joint_network.lin_out.weight.mul_(10.0)
        model.joint_network.lin_out.bias[0] += 0.5
    torch.save(model.state_dict(), exp / "model.pth")
    return exp


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tdt_cli")
    scp = make_data(root)
    espnet_multiblank.register()
    exp = make_tdt_experiment(root)
    return root, scp, exp, stock_env(root)


def oracle(exp: Path, scp: Path):
    """{utt: (labels, frames skipped)} of the TDT greedy rule (test_tdt_search's
    reference, the networks called directly) on the model's own encoder output."""
    from espnet2.tasks.asr import ASRTask

    model, _ = ASRTask.build_model_from_file(
        exp / "config.yaml", exp / "model.pth", "cpu"
    )
    model.eval()
    ns = SimpleNamespace(
        decoder=model.decoder,
        joint_network=model.joint_network,
        blank_id=model.blank_id,
        tdt_durations=model.tdt_durations,
    )
    out = {}
    for line in scp.read_text().splitlines():
        utt, path = line.split()
        wav, _ = soundfile.read(path, dtype="float32")
        speech = torch.from_numpy(wav)[None]
        with torch.no_grad():
            enc, _ = model.encode(speech, torch.tensor([speech.size(1)]))
        labels, _, skipped, _ = reference_greedy(ns, enc[0], max_sym=10)
        out[utt] = (labels, skipped)
    return out


def test_plugin_cli(setup):
    """tdt_greedy (batch 1 and 2), tdt_beam and ESPnet's greedy type (mapped to
    tdt_greedy); hypotheses and frames skipped equal the reference greedy rule."""
    root, scp, exp, _ = setup
    got = {}
    for conf, extra in (
        ("tdt_greedy.yaml", ("--batch_size", "1")),
        ("tdt_greedy.yaml", ("--batch_size", "2")),
        ("greedy.yaml", ()),
        ("tdt_beam.yaml", ()),
    ):
        out = root / f"o_{conf.split('.')[0]}_{'_'.join(extra)}"
        stats = run_inference(exp, scp, out, conf, *extra)
        got[conf, extra] = read_outputs(out), stats
    (g1, s1), (g2, s2) = (
        got["tdt_greedy.yaml", ("--batch_size", "1")],
        got["tdt_greedy.yaml", ("--batch_size", "2")],
    )
    assert s1["search"] == s2["search"] == "TDTGreedySearch"
    assert s2["batch_size"] == 2
    assert g1["token_int"] == g2["token_int"]
    for utt, score in g1["score"].items():
        assert float(g2["score"][utt]) == pytest.approx(float(score), rel=1e-5)
    gm, sm = got["greedy.yaml", ()]
    assert sm["search"] == "TDTGreedySearch" and gm["token_int"] == g1["token_int"]
    _, sb = got["tdt_beam.yaml", ()]
    assert sb["search"] == "TDTBeamSearch"

    want = oracle(exp, scp)
    labels = {u: [int(x) for x in v.split()] for u, v in g1["token_int"].items()}
    assert labels == {u: w[0] for u, w in want.items()}
    assert any(labels.values())  # the case emits labels
    skipped = sum(w[1] for w in want.values())
    assert s1["frames_skipped"] == s2["frames_skipped"] == skipped > 0
    assert s1["frames_skipped_by_big_blanks"] == skipped
    assert s1["total_frames"] > skipped


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
            "TDTGreedySearch" if conf == "tdt_greedy.yaml" else "TDTBeamSearch"
        )
        assert set(got["token_int"]) == {"u0", "u1", "u2"}
        assert got["token_int"] == want["token_int"], conf
        assert got["text"] == want["text"], conf
        for utt, score in want["score"].items():
            assert float(got["score"][utt]) == pytest.approx(float(score), rel=1e-6)
    assert any(v.strip() for v in plugin["tdt_greedy.yaml"][0]["token_int"].values())
