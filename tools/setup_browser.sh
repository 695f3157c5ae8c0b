#!/usr/bin/env bash
# Debian's Chromium and its WebDriver, for the live page's browser test
# (test/test_runtime_serve.py drives /usr/bin/chromium through /usr/bin/chromedriver
# with selenium; nothing is downloaded at run time). Needs root (apt-get); CI runs
# it (.ci/run). Without them the browser test is skipped and says why.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  echo "[setup] chromium and chromium-driver are installed"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "[setup] WARNING: not root, so chromium and chromium-driver are not" \
    "installed: the live page's browser test will be skipped" >&2
  exit 0
fi
echo "[setup] installing Debian's chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
/usr/bin/chromedriver --version
