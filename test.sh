#!/usr/bin/env bash
# Set up the virtual environment (tools/setup_env.sh) and run the whole test suite on
# CPU. Extra arguments go to pytest, e.g.  bash test.sh -k loss -x  (with paths under
# test/, e.g. bash test.sh test/test_loss.py, only those run)
# ESPNET_VERSION=202611 bash test.sh  runs it against ESPnet 202611 (its own venv).
set -euo pipefail
cd "$(dirname "$0")"
bash tools/setup_env.sh
source tools/venv_path.sh
# test files or folders among the arguments: those only, else the whole of test/
for arg in "$@"; do
  case $arg in test/*) exec "$VENV/bin/python" -m pytest "$@" ;; esac
done
exec "$VENV/bin/python" -m pytest test "$@"
