#!/usr/bin/env bash
# Set up the virtual environment (tools/setup_env.sh) and run the whole test suite on
# CPU. Extra arguments go to pytest, e.g.  bash test.sh -k loss -x
# ESPNET_VERSION=202611 bash test.sh  runs it against ESPnet 202611 (its own venv).
set -euo pipefail
cd "$(dirname "$0")"
bash tools/setup_env.sh
source tools/venv_path.sh
exec "$VENV/bin/python" -m pytest test "$@"
