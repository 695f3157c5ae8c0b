#!/usr/bin/env python3
"""The live page in a real browser on a recipe's model: its final text against the
offline decoding of the wav.

Starts the server (``python -m espnet_multiblank.runtime.serve``) on an exported
streaming model and, for each of the first ``--utts`` utterances of
``DATA_DIR/wav.scp``, opens the page in Debian's headless Chromium with the wav as
the microphone (``--use-file-for-fake-audio-capture``), lets it record the wav's
length plus ``--tail`` seconds, and compares the page's final text with

* the runtime's offline decoding of the wav at the server's chunk size (the goal:
  equal), and
* the offline decoding of what the server heard (``--save_audio_dir``; always equal
  unless the server is wrong: Chromium resamples the file, so the two audios differ
  slightly).

``--screenshot PNG`` saves the page of the first utterance (docs/serve_page.png).

Usage::

    python bench/serve_page.py exp/asr_multiblank/onnx egs/digits/asr1/data/test \\
        --utts 10 --screenshot docs/serve_page.png
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test" / "helpers"))

import browser  # noqa: E402
from live_server import live_server  # noqa: E402

from espnet_multiblank.runtime import ExportedModel, Recognizer, read_wav  # noqa: E402
from espnet_multiblank.runtime.serve import default_chunk_size  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("data_dir", help="a folder with wav.scp")
    p.add_argument("--utts", type=int, default=10)
    p.add_argument("--tail", type=float, default=0.3, help="seconds after the wav")
    p.add_argument("--screenshot", default=None)
    args = p.parse_args()
    if browser.missing():
        sys.exit(browser.missing())

    model = ExportedModel(args.model_dir)
    chunk = default_chunk_size(model)
    offline = Recognizer(model, chunk_size=chunk)
    lines = (Path(args.data_dir) / "wav.scp").read_text().splitlines()[: args.utts]
    heard_dir = Path(tempfile.mkdtemp(prefix="serve_page_"))
    equal_wav = equal_heard = 0
    try:
        serve_args = ["--save_audio_dir", str(heard_dir), "--chunk_size", str(chunk)]
        with live_server(args.model_dir, *serve_args) as srv:
            for n, line in enumerate(lines):
                key, path = line.split(maxsplit=1)
                x, rate = read_wav(path)
                seconds = round(x.size / rate + args.tail, 2)
                with browser.Browser(path) as b:
                    live = b.record(srv.url + f"?seconds={seconds}")
                    if n == 0 and args.screenshot:
                        b.screenshot(args.screenshot)
                heard = [np.load(f) for f in sorted(heard_dir.glob(f"{n}-*.npy"))]
                page = live["transcript"].split()
                from_wav = offline.recognize(x, rate).text.split()
                from_heard = " ".join(
                    offline.recognize(h).text for h in heard if h.size
                ).split()
                equal_wav += page == from_wav
                equal_heard += page == from_heard
                mark = "=" if page == from_wav else "!="
                print(f"{key}: page {' '.join(page)!r} {mark} wav's offline decoding")
                if live["error"]:
                    print(f"  page error: {live['error']}")
    finally:
        shutil.rmtree(heard_dir, ignore_errors=True)
    print(
        f"{len(lines)} utterances: page = offline decoding of the wav {equal_wav}, "
        f"= offline decoding of what the server heard {equal_heard}"
    )
    return 0 if equal_heard == len(lines) else 1


if __name__ == "__main__":
    sys.exit(main())
