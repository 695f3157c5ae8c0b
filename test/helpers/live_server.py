"""``python -m espnet_multiblank.runtime.serve`` in a subprocess on a free port of
127.0.0.1, for the live server's tests and ``bench/serve_load.py``."""

import contextlib
import re
import subprocess
import sys
import threading
import time


class ServerProcess:
    """A running server: ``url`` (http://127.0.0.1:PORT/), ``ws_url``
    (ws://127.0.0.1:PORT/ws), ``proc`` and its ``log`` lines so far."""

    def __init__(self, proc, port: int, log: list):
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}/"
        self.ws_url = f"ws://127.0.0.1:{port}/ws"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def live_server(model_dir, *args: str, env=None, timeout: float = 120.0):
    """Start the server (extra command-line ``args``), wait until it listens, yield a
    :class:`ServerProcess`; stop it with SIGTERM at the end (it must exit with 0)."""
    cmd = [sys.executable, "-m", "espnet_multiblank.runtime.serve"]
    cmd += ["--model_dir", str(model_dir), "--port", "0", *args]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log, ready = [], threading.Event()
    port = []

    def read():
        for line in proc.stdout:
            log.append(line.rstrip("\n"))
            m = re.match(r"serving http://[^:]+:(\d+)/", line)
            if m:
                port.append(int(m.group(1)))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(timeout)
    if not port:
        proc.kill()
        raise RuntimeError("the server did not start:\n" + "\n".join(log[-30:]))
    server = ServerProcess(proc, port[0], log)
    try:
        yield server
    finally:
        proc.terminate()
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError("the server did not stop on SIGTERM") from None
        time.sleep(0.1)  # the reader thread takes the last lines
        if code != 0:
            raise RuntimeError(
                f"the server exited with {code}:\n" + "\n".join(log[-30:])
            )
