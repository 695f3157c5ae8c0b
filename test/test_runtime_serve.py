"""The live server (``python -m espnet_multiblank.runtime.serve``) and its page.

The server runs as a subprocess in which torch and ESPnet cannot be imported
(``helpers/no_torch.py``), on a small random streaming model. The oracle is the
runtime's offline decoding at the server's chunk size,
``Recognizer(model_dir, chunk_size=C).recognize(samples)``:

* the protocol with a real WebSocket client: the final result over the socket is the
  offline one (pieces of several sizes, with and without the sample-rate message),
  one reply per piece, partial results that only grow;
* bad clients (each kind of garbage) get an error naming what is wrong and are
  closed, while good clients running at the same time get their exact results and
  the server lives on;
* segments (endpoints): each segment's final result is the offline decoding of that
  segment's samples, and the segments' samples are what was sent;
* the page in Debian's headless Chromium with a wav file as the microphone: the
  page's final text is the offline decoding of the audio the server received, and
  that audio is the wav (aligned, within the resampling's error); a screenshot;
* a load test: 16 clients at once, each final result equal to the offline one; the
  real-time factor of each stream is printed.
"""

import asyncio
import json
import urllib.error
import urllib.request

import browser
import numpy as np
import pytest
import soundfile
from export_cases import FS, waveform
from live_server import live_server
from no_torch import env_without_torch

from espnet_multiblank.runtime import Recognizer, read_wav

pytest.importorskip("websockets", reason="the live server needs websockets")
from espnet_multiblank.runtime.serve_client import send_samples  # noqa: E402

pytestmark = pytest.mark.timeout(600)

CHUNK = 4
IDLE = 1.5  # seconds: the protocol server's idle limit
MAX_PIECE = 2000  # samples: the protocol server's piece limit (0.25 s)


@pytest.fixture(scope="module")
def model(onnx_export):
    _, out = onnx_export("multiblank", "chunk_conformer", blank_bias=-1.0)
    return out


@pytest.fixture(scope="module")
def offline(model):
    return Recognizer(model, chunk_size=CHUNK)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    args = ["--chunk_size", str(CHUNK), "--idle_seconds", str(IDLE)]
    args += ["--max_piece_seconds", str(MAX_PIECE / FS), "--endpoint_seconds", "0"]
    env = env_without_torch(tmp_path_factory.mktemp("no_torch"))
    with live_server(model, *args, env=env) as srv:
        yield srv
        assert srv.alive


def run(coro):
    return asyncio.run(coro)


def assert_offline(message: dict, want) -> None:
    """A final message is the offline result ``want``."""
    assert message["is_final"] is True
    assert message["tokens"] == want.tokens
    assert message["text"] == want.text
    assert message["timestamps"] == pytest.approx(want.timestamps)
    assert message["frames_skipped"] == want.frames_skipped
    assert message["num_frames"] == want.num_frames == message["decided"]
    # the jumps the page draws account for every skipped frame
    assert sum(d - 1 for _, d in message["skips"]) == want.frames_skipped


def test_the_server_imports_no_torch_and_serves_the_page(server):
    page = urllib.request.urlopen(server.url, timeout=10).read().decode()
    assert "page.js" in page
    for name in ("page.js", "recorder.js", "style.css"):
        with urllib.request.urlopen(server.url + name, timeout=10) as r:
            assert r.status == 200 and len(r.read()) > 100
            assert r.headers["Content-Type"].startswith(("text/javascript", "text/css"))
    info = json.loads(urllib.request.urlopen(server.url + "info", timeout=10).read())
    assert info["sample_rate"] == FS and info["chunk_size"] == CHUNK
    assert info["lattice"] == "multiblank" and info["big_blank_durations"] == [2, 4]
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(server.url + "nothing", timeout=10)


@pytest.mark.parametrize("piece,rate", [(333, FS), (800, None), (1601, FS)])
def test_final_result_over_the_socket_is_the_offline_decoding(
    server, offline, piece, rate
):
    waves = [waveform(n, 30 + i) for i, n in enumerate([4000, 9000, 13001])]

    async def all_of_them():
        return await asyncio.gather(
            *(send_samples(server.ws_url, w, rate, piece) for w in waves)
        )

    sessions = run(all_of_them())
    emitted = 0
    for w, session in zip(waves, sessions):
        want = offline.recognize(w)
        emitted += len(want.tokens)
        assert session.error is None and session.close_code == 1000
        pieces = -(-w.size // piece)
        assert len(session.messages) == pieces + 1  # one per piece, the final
        *partials, final = session.messages
        assert_offline(final, want)
        assert final["samples"] == w.size and final["segment"] == 0
        for m in partials:
            assert not m["is_final"] and m["segment"] == 0
            assert m["tokens"] == want.tokens[: len(m["tokens"])]  # only grows
        assert [m["samples"] for m in partials] == [
            min((i + 1) * piece, w.size) for i in range(pieces)
        ]
    assert emitted > 0  # the model emits words: the comparison means something


def _piece(n, seed=0, value=None):
    x = waveform(n, seed)
    if value is not None:
        x[::97] = value
    return x.astype("<f4").tobytes()


#: garbage -> (messages sent, what the error says, close code)
BAD = {
    "text after audio": ([_piece(800), "hello"], "unexpected text message 'hello'"),
    "rate after audio": (
        [_piece(800), '{"sample_rate": 8000}'],
        "unexpected text message",
    ),
    "invalid JSON": (['{"sample_rate": '], "not valid JSON"),
    "not an object": (["[8000]"], "must be a JSON object"),
    "unknown key": (['{"rate": 8000}'], "unknown keys ['rate']"),
    "wrong rate": (
        ['{"sample_rate": 16000}'],
        "sample rate 16000 Hz, the model takes 8000 Hz",
    ),
    "float rate": (['{"sample_rate": 8000.5}'], "sample_rate must be an int"),
    "NaN samples": ([_piece(800), _piece(800, 1, np.nan)], "9 NaN"),
    "inf samples": ([_piece(800, 1, np.inf)], "non-finite samples: 0 NaN, 9 inf"),
    "odd bytes": ([b"\0" * 6], "6 bytes"),
    "piece over the limit": ([_piece(MAX_PIECE + 1)], "the limit is 2000"),
    "silence": ([], f"nothing received for {IDLE:g} s"),
    "silence after audio": ([_piece(800)], f"nothing received for {IDLE:g} s"),
}


async def _bad_client(url, messages):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    replies = []
    async with connect(url, max_size=None) as ws:
        try:
            for m in messages:
                await ws.send(m)
            async for reply in ws:
                replies.append(json.loads(reply))
        except ConnectionClosed:
            pass
        return replies, ws.close_code


async def _much_too_big(url):
    """A message over the WebSocket library's own frame limit: closed with 1009."""
    return await _bad_client(url, [_piece(5 * MAX_PIECE)])


async def _vanishes(url):
    """Sends a piece and drops the connection without ``Done``."""
    from websockets.asyncio.client import connect

    async with connect(url) as ws:
        await ws.send(_piece(800))
        await ws.recv()
    return "gone"


def test_bad_clients_get_an_error_and_good_ones_are_undisturbed(server, offline):
    good = [waveform(12000, 40), waveform(6000, 41)]

    async def everyone():
        return await asyncio.gather(
            # a good client paced as a microphone, during all the garbage
            send_samples(server.ws_url, good[0], FS, 800, realtime=True),
            *(_bad_client(server.ws_url, m) for m, _ in BAD.values()),
            _much_too_big(server.ws_url),
            _vanishes(server.ws_url),
            send_samples(server.ws_url, good[1], None, 500),
            _bad_client(server.ws_url, ["Done"]),  # nothing, then the end
        )

    paced, *bad, too_big, vanished, fast, empty = run(everyone())
    for (name, (_, says)), (replies, code) in zip(BAD.items(), bad):
        assert replies, name
        assert "error" in replies[-1], (name, replies)
        assert says in replies[-1]["error"], (name, replies[-1])
        assert all("error" not in r for r in replies[:-1]), name
        assert code == (1009 if name == "piece over the limit" else 1008), name
    assert too_big == ([], 1009)
    assert vanished == "gone"
    for session, w in zip([paced, fast], good):
        assert session.error is None and session.close_code == 1000
        assert_offline(session.messages[-1], offline.recognize(w))
    assert empty[1] == 1000 and len(empty[0]) == 1
    assert empty[0][0]["is_final"] and empty[0][0]["text"] == ""
    assert server.alive
    # and serves the next one
    again = run(send_samples(server.ws_url, good[1], FS, 700))
    assert_offline(again.messages[-1], offline.recognize(good[1]))


def test_segments_end_with_the_offline_decoding_of_their_samples(
    model, offline, tmp_path
):
    saved = tmp_path / "heard"
    args = ["--chunk_size", str(CHUNK), "--endpoint_seconds", "0.4"]
    args += ["--max_segment_seconds", "0.8", "--save_audio_dir", str(saved)]
    args += ["--max_clients", "1"]
    x = waveform(30000, 50)  # 3.75 s: at least 4 segments of <= 0.8 s
    with live_server(model, *args, env=env_without_torch(tmp_path)) as srv:
        session = run(send_samples(srv.ws_url, x, FS, 700))

        async def two_at_once():
            from websockets.asyncio.client import connect

            async with connect(srv.ws_url) as first:
                await first.send(_piece(800))
                await first.recv()
                return await _bad_client(srv.ws_url, [])

        full = run(two_at_once())
    assert session.error is None and session.close_code == 1000
    finals = session.finals
    assert len(finals) >= 5
    assert [m["segment"] for m in finals] == list(range(len(finals)))
    # each segment's messages in a row, its final one last
    messages = session.messages
    for m, after in zip(messages, messages[1:]):
        assert after["segment"] == m["segment"] + m["is_final"]
    assert messages[-1]["is_final"]
    heard = [np.load(saved / f"0-{k}.npy") for k in range(len(finals))]
    np.testing.assert_array_equal(np.concatenate(heard), x)
    min_samples = offline.model.info.min_samples
    for m, samples in zip(finals, heard):
        assert m["samples"] == samples.size
        if samples.size >= min_samples:
            assert_offline(m, offline.recognize(samples))
        else:  # too short for the encoder: an empty final result
            assert m["tokens"] == [] and m["num_frames"] == 0
    assert full[1] == 1013 and "the server is full (1 clients)" in full[0][0]["error"]


def test_a_beam_search_server_ends_with_the_offline_beam(model, tmp_path):
    args = ["--chunk_size", str(CHUNK), "--search", "beam", "--endpoint_seconds", "0"]
    x = waveform(9000, 45)
    with live_server(model, *args, env=env_without_torch(tmp_path)) as srv:
        session = run(send_samples(srv.ws_url, x, FS, 1000))
    want = Recognizer(model, search="beam", chunk_size=CHUNK).recognize(x)
    final = session.messages[-1]
    assert want.tokens and final["is_final"] and final["tokens"] == want.tokens
    assert final["timestamps"] == pytest.approx(want.timestamps)
    assert final["frames_skipped"] == want.frames_skipped
    assert final["skips"] == [] and final["decided"] == want.num_frames


def test_the_command_line_refuses_what_it_cannot_serve(tmp_path, capsys):
    from espnet_multiblank.runtime import serve

    assert serve.main(["--model_dir", str(tmp_path)]) == 2
    assert "not an exported model" in capsys.readouterr().err


@pytest.mark.skipif(bool(browser.missing()), reason=browser.missing() or "-")
@pytest.mark.parametrize("resample", ["browser", "page"])
def test_the_page_in_chromium_shows_the_offline_decoding(
    model, offline, tmp_path, resample
):
    """The page records a wav through Chromium's fake microphone for exactly
    ``seconds``, shows the server's results; its final text is the offline decoding
    of what the server heard, and that is the wav. Resampled to the model's rate by
    the browser's AudioContext, or by the page's worklet (``?resample=page``: what
    a browser gets whose AudioContext cannot run at the model's rate)."""
    wav = tmp_path / "mic.wav"
    x = waveform(12000, 2)  # a 700 Hz chirp and noise: far from Nyquist
    soundfile.write(str(wav), x, FS, subtype="PCM_16")
    x, _ = read_wav(wav)
    seconds = 1.8
    heard = tmp_path / "heard"
    args = ["--chunk_size", str(CHUNK), "--save_audio_dir", str(heard)]
    with live_server(model, *args, env=env_without_torch(tmp_path)) as srv:
        with browser.Browser(wav) as b:
            live = b.record(srv.url + f"?seconds={seconds}&resample={resample}")
            b.screenshot(tmp_path / "page.png")
    assert live["state"] == "done" and live["error"] is None, live
    assert live["samplesSent"] == round(seconds * FS)
    finals = [m for m in live["messages"] if m["is_final"]]
    segments = sorted(heard.glob("0-*.npy"))
    assert len(finals) == len(segments) >= 1
    said = []
    for k, m in enumerate(finals):
        samples = np.load(heard / f"0-{k}.npy")
        want = offline.recognize(samples)
        assert_offline(m, want)
        said += [want.text] if want.text else []
    # (the page shows the texts as HTML does: spaces collapsed)
    assert live["transcript"].split() == " ".join(said).split()
    assert live["partial"] == ""
    assert any(m["tokens"] for m in finals)  # words were shown
    # what the server heard is the wav (resampled twice, so not to the bit):
    # aligned, its difference is a small part of the wav's energy (about 4% with
    # Chromium's resampler, 2% with the page's: the noise near 4 kHz)
    y = np.concatenate([np.load(p) for p in segments])
    assert y.size == live["samplesSent"]
    lag, error = _aligned_error(x, y)
    assert abs(lag) < 0.25 * FS and error < 0.1, (lag, error)
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _aligned_error(x, y):
    """The lag of y (heard) against x (sent) by cross-correlation (y[lag + i] is
    about x[i]; negative: y lacks x's start), and the energy of their difference
    where they overlap (a resampler's fractional delay taken out, the overlap's ends
    left out) over x's energy there."""
    n = 2 * (x.size + y.size)
    corr = np.fft.irfft(np.fft.rfft(y, n) * np.conj(np.fft.rfft(x, n)), n)
    lag = int(np.argmax(corr[: y.size]))
    if corr[n - x.size + 1 :].max() > corr[lag]:
        lag = int(np.argmax(corr[n - x.size + 1 :])) - x.size + 1
    a, b, c = corr[lag - 1], corr[lag], corr[(lag + 1) % n]
    frac = 0.5 * (a - c) / (a - 2 * b + c)  # the peak between samples
    start, stop = max(0, -lag), min(x.size, y.size - lag)
    sent, heard = x[start:stop], y[start + lag : stop + lag]
    f = np.fft.rfftfreq(heard.size)
    heard = np.fft.irfft(np.fft.rfft(heard) * np.exp(2j * np.pi * f * frac), heard.size)
    sent, heard = sent[100:-100], heard[100:-100]
    return lag + frac, float(np.sum((heard - sent) ** 2) / np.sum(sent**2))


def test_sixteen_clients_at_once_get_the_offline_results(server, offline):
    """The load test: 16 clients, each a 2 s waveform in 100 ms pieces sent as fast
    as the server reads them; each final result is the offline one."""
    waves = [waveform(16000 + 97 * i, 70 + i) for i in range(16)]

    async def load():
        return await asyncio.gather(
            *(send_samples(server.ws_url, w, FS, 800) for w in waves)
        )

    sessions = run(load())
    rtf = []
    for w, session in zip(waves, sessions):
        assert session.error is None
        assert_offline(session.messages[-1], offline.recognize(w))
        rtf.append((session.ended - session.started) / (w.size / FS))
    print("real-time factor per stream:", " ".join(f"{r:.3f}" for r in rtf))
