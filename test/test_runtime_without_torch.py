"""The runtime imports and decodes with torch, ESPnet, Numba and typeguard
unimportable.

A ``sitecustomize`` on the subprocess's path refuses those packages
(``helpers/no_torch.py``); the subprocess imports
``espnet_multiblank.runtime``, decodes with the Python API and with ``python -m
espnet_multiblank.runtime.decode``, and the hypotheses must be those this process
(where torch is importable) gets from the same export.
"""

import json
import subprocess
import sys

import pytest
import soundfile
from export_cases import waveform
from no_torch import BLOCKED, env_without_torch

from espnet_multiblank.runtime import Recognizer

pytestmark = pytest.mark.timeout(600)

SCRIPT = """
import json, sys
import soundfile
from espnet_multiblank.runtime import Recognizer, read_wav

try:
    import torch  # noqa: F401
    sys.exit("torch was importable: the blocker does not work")
except ImportError:
    pass
wavs = sys.argv[2:]
out = {}
for search in ("greedy", "beam"):
    rec = Recognizer(sys.argv[1], search=search)
    got = [rec.recognize(*read_wav(w)) for w in wavs]
    out[search] = [[r.token_ids, r.frames] for r in got]
    s = rec.create_stream(chunk_size=3)
    x, rate = read_wav(wavs[0])
    for i in range(0, x.size, 500):
        s.accept_waveform(x[i : i + 500], rate)
    s.input_finished()
    out[search + "_stream"] = s.result.token_ids
blocked = [m for m in sys.modules if m.split(".")[0] in {blocked!r}]
out["imported"] = blocked
print(json.dumps(out))
"""


def test_runtime_decodes_without_torch_or_espnet(onnx_export, tmp_path):
    _, out = onnx_export("tdt_gaps", "chunk_conformer", blank_bias=-1.0)
    wavs = []
    for i, n in enumerate([3000, 7000, 11000]):
        path = tmp_path / f"u{i}.wav"
        soundfile.write(str(path), waveform(n, 20 + i), 8000, subtype="PCM_16")
        wavs.append(str(path))
    script = SCRIPT.replace("{blocked!r}", repr(BLOCKED))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out), *wavs],
        env=env_without_torch(tmp_path),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["imported"] == []
    from espnet_multiblank.runtime import read_wav

    for search in ("greedy", "beam"):
        rec = Recognizer(out, search=search)
        want = [rec.recognize(*read_wav(w)) for w in wavs]
        assert got[search] == [[r.token_ids, r.frames] for r in want]
        assert (
            got[search + "_stream"]
            == Recognizer(out, search=search, chunk_size=3)
            .recognize(*read_wav(wavs[0]))
            .token_ids
        )
    assert any(got["greedy"][i][0] for i in range(3))  # labels were emitted

    # the command line too
    scp = tmp_path / "wav.scp"
    scp.write_text("".join(f"u{i} {w}\n" for i, w in enumerate(wavs)))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "espnet_multiblank.runtime.decode",
            "--model_dir",
            str(out),
            "--wav_scp",
            str(scp),
            "--output_dir",
            str(tmp_path / "dec"),
        ],
        env=env_without_torch(tmp_path),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads((tmp_path / "dec" / "decoding_stats.json").read_text())
    assert stats["utterances"] == 3 and stats["failed_utterances"] == {}


def test_the_package_imports_torch_only_when_asked(tmp_path):
    """``import espnet_multiblank`` and its lattice need no torch; the loss names
    still import lazily where torch is installed."""
    code = (
        "import sys, espnet_multiblank, espnet_multiblank.lattice, "
        "espnet_multiblank.runtime.metadata\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from espnet_multiblank import multiblank_rnnt_loss, GradMultiply\n"
        "assert 'torch' in sys.modules\n"
        "print('ok')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
