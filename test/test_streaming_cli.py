"""``--streaming true`` at both entry points, and ``espnet_multiblank.bin.stream_wav``.

Oracles: the streaming decoder's Python API on the same model and wavs (the CLI must
write its final hypotheses); the same run with other piece lengths and batch sizes
(identical 1-best lines); the stock entry point against the plug-in's.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile
import torch
from espnet_experiments import inference_args
from hook_env import stock_env
from streaming_cases import (
    FS,
    make_experiment,
    pieces,
    speech2text,
    waveform,
    write_scp,
)

from espnet_multiblank.espnet.inference.streaming import StreamingDecoder

pytestmark = pytest.mark.timeout(1200)

LENGTHS = [6000, 9100, 3500]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming_cli")
    exp = make_experiment(root / "mb", "multiblank", blank_bias=1.5)
    scp = write_scp(root, LENGTHS)
    return root, exp, scp


def decode_args(exp, scp, out, *extra):
    conf = out.parent / "decode_mb_greedy.yaml"  # ESPnet's parser: a YAML only
    conf.write_text("beam_size: 1\ntransducer_conf:\n    search_type: mb_greedy\n")
    return inference_args(
        exp, scp, out, "--config", str(conf), "--streaming", "true", *extra
    )


def run_plugin(exp, scp, out, *extra):
    from espnet_multiblank.bin.asr_inference import get_parser, inference

    args = get_parser().parse_args(decode_args(exp, scp, out, *extra))
    kwargs = vars(args)
    kwargs.pop("config", None)
    kwargs.pop("allow_failed_utterances")
    return inference(**kwargs)


def read(out, name):
    path = out / "1best_recog" / name
    return [line.split(" ", 1) for line in path.read_text().splitlines()]


def test_streaming_cli_writes_the_streaming_decoders_hypotheses(setup):
    root, exp, scp = setup
    outs = {}
    for size, batch in ((0, 1), (400, 1), (1111, 1), (700, 2)):
        out = root / f"out_{size}_{batch}"
        stats = run_plugin(
            exp,
            scp,
            out,
            "--sim_chunk_length",
            str(size),
            "--batch_size",
            str(batch),
            "--streaming_chunk_size",
            "3",
            "--write_ctm",
            str(size == 400).lower(),
        )
        assert stats["streaming"] is True and stats["chunk_frames"] == 3
        assert stats["num_utterances"] == 3 and stats["num_failed"] == 0
        assert stats["audio_seconds"] == pytest.approx(sum(LENGTHS) / FS)
        assert stats["batch_size"] == batch and stats["sim_chunk_length"] == size
        assert stats["chunk_seconds"] == pytest.approx(3 * 0.02)  # 5 ms hop x 4
        assert 0 < stats["search_seconds"] and 0 < stats["encoder_seconds"]
        assert json.loads((out / "decoding_stats.json").read_text()) == stats
        outs[size, batch] = [read(out, n) for n in ("token_int", "score")]
        emission = read(out, "emission")
        assert [k for k, _ in emission] == ["u0", "u1", "u2"]  # input order
    # offline at the same chunk (batched, the chunk-masked encoder output): the
    # same hypotheses
    offline = root / "offline_chunk3"
    stats = run_plugin(
        exp,
        scp,
        offline,
        "--streaming",
        "false",
        "--streaming_chunk_size",
        "3",
        "--batch_size",
        "2",
        "--write_ctm",
        "true",
    )
    assert "streaming" not in stats and stats["batch_size"] == 2
    assert read(offline, "token_int") == outs[0, 1][0]
    # word times: the streamed 1-best's equal the offline search's (confidences to
    # the rounding of another batch size)
    ctms = [
        [
            line.split()
            for line in (d / "1best_recog" / "ctm").read_text().splitlines()
            if not line.startswith(";;")  # the header
        ]
        for d in (root / "out_400_1", offline)
    ]
    assert ctms[0] and [r[:5] for r in ctms[0]] == [r[:5] for r in ctms[1]]
    for a, b in zip(*ctms):
        assert float(a[5]) == pytest.approx(float(b[5]), abs=1e-3)
    # the piece length changes nothing at all; other batch sizes round differently
    assert outs[400, 1] == outs[0, 1] and outs[1111, 1] == outs[0, 1]
    assert outs[700, 2][0] == outs[0, 1][0]
    for (k1, s1), (k2, s2) in zip(outs[700, 2][1], outs[0, 1][1]):
        assert k1 == k2 and float(s1) == pytest.approx(float(s2), abs=1e-4)
    # the Python API on the same model and wavs
    decoder = StreamingDecoder(
        speech2text(exp, transducer_conf={"search_type": "mb_greedy"}, beam_size=1), 3
    )
    token_int, score = outs[0, 1]
    for i, line in enumerate(scp.read_text().splitlines()):
        speech, _ = soundfile.read(line.split()[1], dtype="float32")
        decoder.open(f"u{i}", FS)
        for piece, final in pieces(speech, 700):
            result = decoder.feed({f"u{i}": (piece, final)})[f"u{i}"]
        assert token_int[i] == [f"u{i}", " ".join(map(str, result.results[0][2]))]
        assert float(score[i][1]) == result.results[0][3].score


def test_bad_wavs_are_reported_by_key(setup, tmp_path):
    root, exp, _ = setup
    good = waveform(5000, 1)
    nan = good.copy()
    nan[4000] = np.nan
    files = {
        "a_good": (good, FS),
        "b_nan": (nan, FS),
        "c_stereo": (np.stack([good, good], 1), FS),
        "d_rate": (good, 16000),
        "e_short": (good[:50], FS),
    }
    lines = []
    for key, (data, rate) in files.items():
        path = tmp_path / f"{key}.wav"
        soundfile.write(path, data, rate, subtype="FLOAT")
        lines.append(f"{key} {path}")
    scp = tmp_path / "wav.scp"
    scp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    stats = run_plugin(exp, scp, out, "--sim_chunk_length", "800", "--batch_size", "3")
    assert stats["num_failed"] == 4
    failed = dict(
        line.split(" ", 1)
        for line in (out / "failed_utterances").read_text().splitlines()
    )
    assert "non-finite samples: 1 NaN" in failed["b_nan"]
    assert "2 channels" in failed["c_stereo"]
    assert "sample rate 16000 Hz" in failed["d_rate"]
    assert "too short" in failed["e_short"]
    assert [k for k, _ in read(out, "token_int")] == ["a_good"]


def test_a_model_that_cannot_stream_is_refused(tmp_path):
    from espnet_experiments import make_experiment as make_rnn_experiment
    from test_decoding_cli import make_data

    exp = make_rnn_experiment(tmp_path, (2,), model="multiblank_espnet")
    scp = make_data(tmp_path)
    with pytest.raises(ValueError, match="encoder: chunk_conformer"):
        run_plugin(exp, scp, tmp_path / "out")


@pytest.mark.slow
def test_stock_entry_point_streams_like_the_plugins(setup):
    root, exp, scp = setup
    plugin = root / "plugin_stock_cmp"
    # one torch thread, as the stock subprocess (stock_env): the encoder's sums
    # round differently with another thread count, and this process's count
    # depends on the tests that ran before (scores differed in the 7th digit)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_plugin(exp, scp, plugin, "--sim_chunk_length", "500")
    finally:
        torch.set_num_threads(threads)
    stock = root / "stock"
    proc = subprocess.run(
        [sys.executable, "-m", "espnet2.bin.asr_inference"]
        + decode_args(exp, scp, stock, "--sim_chunk_length", "500"),
        env=stock_env(root),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ignored" not in proc.stderr
    for name in ("token_int", "score", "emission"):
        assert read(stock, name) == read(plugin, name)
    stats = json.loads((stock / "decoding_stats.json").read_text())
    assert stats["streaming"] and stats["entry_point"] == "espnet2.bin.asr_inference"


def test_stream_wav_prints_partials_and_the_final_hypothesis(setup, capsys):
    from espnet_multiblank.bin.stream_wav import main

    root, exp, scp = setup
    wav = scp.read_text().split()[3]  # u1
    code = main(
        [
            "--asr_train_config",
            str(exp / "config.yaml"),
            "--asr_model_file",
            str(exp / "model.pth"),
            "--wav",
            wav,
            "--piece_ms",
            "150",
            "--chunk_size",
            "3",
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    final = [line for line in lines if "final:" in line]
    assert len(final) == 1 and "emitted:" in lines[-1]
    times = [float(line.split("s")[0]) for line in lines[:-2]]
    assert times == sorted(times) and len(set(times)) == len(times)
    decoder = StreamingDecoder(
        speech2text(exp, transducer_conf={"search_type": "mb_greedy"}, beam_size=1), 3
    )
    decoder.open("u1", FS)
    speech, _ = soundfile.read(wav, dtype="float32")
    result = decoder.feed({"u1": (speech, True)})["u1"]
    assert final[0].split("final:")[1].strip() == " ".join(result.results[0][1])
