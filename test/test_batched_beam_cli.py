"""Batched beam search and CTM output through both entry points, on tiny random
``model: multiblank_espnet`` models (multi-blank, standard, TDT).

* ``mb_beam`` / ``tdt_beam`` (every ``beam_sync`` rule) at ``--batch_size 4`` give
  the n-best lists of ``--batch_size 1`` (tokens, scores to float rounding), in
  input order; the frame rule's batch 1 is the one-utterance search;
* ``--write_ctm true``: one line per word of the 1-best (the text file's words),
  times inside the utterance, the same at batch 1 and 4; the frame shift the
  encoder's (hop x subsampling);
* ESPnet's stock ``espnet2.bin.asr_inference`` batches the plug-in's searches too
  (the same outputs) and refuses ``--write_ctm`` for what ESPnet decodes;
* an utterance the batched search finds no hypothesis for is reported by key while
  the others of its batch are written.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from espnet_experiments import make_tdt_experiment
from test_decoding_cli import REPO  # noqa: I100
from test_decoding_stock import decode_args, plugin_experiments, stock_env

import espnet_multiblank

pytestmark = pytest.mark.timeout(1200)

FS = 16000
LENGTHS = [8000, 12000, 4000, 10000, 6000, 9000, 11000]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("beam_cli")
    rng = np.random.default_rng(3)
    lines = []
    for i, n in enumerate(LENGTHS):
        wav = root / f"u{i}.wav"
        soundfile.write(wav, (0.1 * rng.standard_normal(n)).astype(np.float32), FS)
        lines.append(f"u{i} {wav}")
    scp = root / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    espnet_multiblank.register()
    exps = plugin_experiments(root, (("mb", (2, 4), 0.5, 10.0), ("std", (), 0.5, 10.0)))
    (root / "tdt").mkdir()
    exps["tdt"] = make_tdt_experiment(root / "tdt")
    return root, scp, exps


def decode(exp, scp, out, conf, *extra):
    from espnet_multiblank.bin.asr_inference import get_parser, inference

    args = get_parser().parse_args(decode_args(exp, scp, out, conf) + list(extra))
    kwargs = vars(args)
    kwargs.pop("config", None)
    kwargs.pop("allow_failed_utterances", None)
    torch.set_num_threads(1)
    return inference(**kwargs)


def nbest(out: Path, n: int):
    """{(rank, utt): (token_int, score)}."""
    got = {}
    for rank in range(1, n + 1):
        best = out / f"{rank}best_recog"
        if not best.exists():
            continue
        tokens = dict(
            (line.split(" ", 1) + [""])[:2]
            for line in (best / "token_int").read_text().splitlines()
        )
        for line in (best / "score").read_text().splitlines():
            utt, score = line.split()
            got[rank, utt] = (tokens[utt], float(score))
    return got


CASES = [
    ("mb", "mb_beam.yaml"),
    ("mb", "mb_beam_step.yaml"),
    ("mb", "mb_beam_label.yaml"),
    ("std", "mb_beam.yaml"),
    ("std", "mb_beam_label.yaml"),
    ("tdt", "tdt_beam.yaml"),
    ("tdt", "tdt_beam_step.yaml"),
    ("tdt", "tdt_beam_label.yaml"),
]


@pytest.mark.parametrize("model, conf", CASES)
def test_batch_4_equals_batch_1_with_nbest_and_ctm(setup, model, conf):
    root, scp, exps = setup
    runs = {}
    for batch in ("1", "4"):
        out = root / f"o_{model}_{conf}_{batch}"
        stats = decode(
            exps[model],
            scp,
            out,
            conf,
            "--batch_size",
            batch,
            "--nbest",
            "2",
            "--write_ctm",
            "true",
        )
        assert stats["num_failed"] == 0 and stats["batch_size"] == int(batch)
        runs[batch] = out
    one, four = nbest(runs["1"], 2), nbest(runs["4"], 2)
    assert set(one) == set(four) and len(one) >= len(LENGTHS) + 1
    for key, (tokens, score) in one.items():
        assert four[key][0] == tokens, key
        assert four[key][1] == pytest.approx(score, rel=1e-5, abs=1e-4), key
    assert any(t.strip() for t, _ in one.values())  # the models emit labels
    ctm = {b: (runs[b] / "1best_recog" / "ctm").read_text() for b in runs}
    texts = dict(
        (line.split(" ", 1) + [""])[:2]
        for line in (runs["1"] / "1best_recog" / "text").read_text().splitlines()
    )
    header = [line for line in ctm["1"].splitlines() if line.startswith(";;")]
    # the header says what the times mean, for this lattice (tdt: its durations)
    assert len(header) == 4 and header[0].startswith(";; espnet-multiblank")
    assert ("model's own word duration" in header[2]) == (model == "tdt"), header
    lines = [line.split() for line in ctm["1"].splitlines() if line[:2] != ";;"]
    for utt, text in texts.items():  # char tokens: <space> separates words
        words = [x[4] for x in lines if x[0] == utt]
        assert words == text.split(), utt
    durations = {f"u{i}": n / FS for i, n in enumerate(LENGTHS)}
    for utt, channel, start, dur, _, conf_ in lines:
        assert channel == "1"
        assert 0 <= float(start) < float(start) + float(dur) <= durations[utt] + 0.05
        assert 0 <= float(conf_) <= 1
    assert ctm["4"].startswith("\n".join(header))  # the same header
    for a, b in zip(ctm["1"].splitlines()[4:], ctm["4"].splitlines()[4:]):
        assert a.split()[:5] == b.split()[:5]
        assert float(a.split()[5]) == pytest.approx(float(b.split()[5]), abs=2e-4)


def test_encoder_frame_shift(setup):
    """The tiny models' frontend hops 128 samples at 16 kHz and their one-layer rnn
    encoder keeps every frame (``subsample`` applies per layer: [1]): 8 ms per
    encoder frame; a second of speech is about 1 / 0.008 frames."""
    from espnet2.tasks.asr import ASRTask

    from espnet_multiblank.espnet.inference.timestamps import encoder_frame_shift

    _, _, exps = setup
    model, _ = ASRTask.build_model_from_file(
        exps["mb"] / "config.yaml", exps["mb"] / "model.pth", "cpu"
    )
    shift = encoder_frame_shift(model, FS, "cpu", torch.float32)
    assert shift == pytest.approx(128 / FS)
    with torch.no_grad():
        _, lens = model.encode(torch.zeros(1, 3 * FS), torch.tensor([3 * FS]))
    assert int(lens[0]) * shift == pytest.approx(3.0, abs=2 * shift)
    with pytest.raises(ValueError, match="word times: the encoder frame shift"):
        encoder_frame_shift(model, None, "cpu", torch.float32)


def test_ctm_refused_with_espnets_searches(setup):
    root, scp, exps = setup
    with pytest.raises(ValueError, match="--write_ctm: word times"):
        decode(exps["std"], scp, root / "o_ctm_espnet", "beam.yaml", "--write_ctm", "1")


def test_a_search_without_hypothesis_fails_alone(setup, monkeypatch):
    """The batched search finds no hypothesis for one utterance (its scores are not
    finite): that utterance is reported by key, the others are written as at batch
    1."""
    from espnet_multiblank.decoding import BeamSearch

    root, scp, exps = setup
    ref = root / "o_lost_reference_b1"
    decode(exps["mb"], scp, ref, "mb_beam.yaml", "--batch_size", "1")
    want = nbest(ref, 1)
    search_batch_nbest = BeamSearch.search_batch_nbest

    def one_lost(search, enc_out, enc_lens):
        got = search_batch_nbest(search, enc_out, enc_lens)
        lost = int(enc_lens.argmin())  # the shortest of the batch: u2
        got[lost] = []
        return got

    monkeypatch.setattr(BeamSearch, "search_batch_nbest", one_lost)
    out = root / "o_lost"
    stats = decode(exps["mb"], scp, out, "mb_beam.yaml", "--batch_size", "8")
    assert stats["num_failed"] == 1
    assert (out / "failed_utterances").read_text().startswith("u2 the search")
    got = nbest(out, 1)
    assert set(got) == set(want) - {(1, "u2")}
    for key, (tokens, score) in got.items():
        assert tokens == want[key][0]
        assert score == pytest.approx(want[key][1], rel=1e-5, abs=1e-4)


@pytest.mark.slow
def test_stock_entry_point_batches_the_plugins_searches(setup, tmp_path):
    root, scp, exps = setup
    out = root / "o_stock_b4"
    args = decode_args(exps["mb"], scp, out, "mb_beam.yaml")
    args[args.index("--batch_size") + 1] = "4"
    proc = subprocess.run(
        [sys.executable, "-m", "espnet2.bin.asr_inference"]
        + args
        + ["--nbest", "2", "--write_ctm", "true"],
        env=stock_env(tmp_path),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = root / "o_stock_reference_b1"
    decode(
        exps["mb"],
        scp,
        ref,
        "mb_beam.yaml",
        "--batch_size",
        "1",
        "--nbest",
        "2",
        "--write_ctm",
        "true",
    )
    want = nbest(ref, 2)
    got = nbest(out, 2)
    assert set(got) == set(want)
    for key, (tokens, score) in want.items():
        assert got[key][0] == tokens
        assert got[key][1] == pytest.approx(score, rel=1e-5, abs=1e-4)
    ctm = (out / "1best_recog" / "ctm").read_text().splitlines()
    want_ctm = (ref / "1best_recog" / "ctm").read_text().splitlines()
    assert [x.split()[:5] for x in ctm] == [x.split()[:5] for x in want_ctm]
    assert '"batch_size": 4' in (out / "decoding_stats.json").read_text()


def test_stock_entry_point_refuses_ctm_for_espnets_own_models(tmp_path):
    """A model and decode config ESPnet decodes itself: --write_ctm is refused (its
    searches give no word times) and never reaches ESPnet's loop; --batch_size goes
    to ESPnet's loop as it is."""
    from espnet_multiblank.espnet.inference.stock_inference import _wrap_inference

    config = tmp_path / "config.yaml"
    config.write_text("model: espnet\ndecoder: transformer\n")
    called = []
    wrapped = _wrap_inference(lambda **kw: called.append(kw), {})
    with pytest.raises(ValueError, match="--write_ctm"):
        wrapped(asr_train_config=str(config), batch_size=1, write_ctm=True)
    assert not called
    wrapped(asr_train_config=str(config), batch_size=2, write_ctm=False)
    assert called == [{"asr_train_config": str(config), "batch_size": 2}]
