"""Debian's headless Chromium driven by selenium, with a wav file as the microphone:
the live page's browser test and ``bench/serve_page.py`` (the screenshot in
docs/deploy.md).

Chromium's fake capture device plays the file once (``%noloop``) at the device's
rate and then silence; the page resamples it to the model's rate, so what the server
hears is close to the file but not equal to it (the server saves what it heard:
``--save_audio_dir``).
"""

import shutil
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

#: Chromium's flags: headless, no sandbox (root in CI), and no background
#: connections (they fail on a closed network and slow the start)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--no-first-run",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--window-size=1000,800",
]


def missing() -> str:
    """Why the browser cannot run here ("" when it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (requirements/test.txt)"
    return ""


class Browser:
    """A headless Chromium whose microphone plays ``wav`` once (a context
    manager)."""

    def __init__(self, wav):
        self.wav = Path(wav)

    def __enter__(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS + [
            f"--use-file-for-fake-audio-capture={self.wav}%noloop",
            f"--user-data-dir={self.profile}",
        ]:
            options.add_argument(flag)
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        return self

    def __exit__(self, *exc):
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)

    def record(self, url: str, timeout: float = 60.0) -> dict:
        """Open the page, press Start, wait until it is done (or failed); returns
        ``window.live`` and the transcript's text."""
        from selenium.webdriver.common.by import By

        d = self.driver
        d.get(url)
        start = d.find_element(By.ID, "start")
        deadline = time.monotonic() + timeout
        while not start.is_enabled():
            if time.monotonic() > deadline:
                raise TimeoutError("the page did not load the model's description")
            time.sleep(0.1)
        start.click()
        while True:
            live = d.execute_script("return window.live")
            if live["state"] in ("done", "error"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page is still {live['state']!r}")
            time.sleep(0.2)
        live["transcript"] = d.find_element(By.ID, "finals").text
        live["partial"] = d.find_element(By.ID, "partial").text
        live["console"] = [e["message"] for e in d.get_log("browser")]
        return live

    def screenshot(self, path) -> None:
        self.driver.save_screenshot(str(path))
