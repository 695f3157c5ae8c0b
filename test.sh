#!/usr/bin/env bash
# Set up .venv (tools/setup_env.sh) and run the whole test suite on CPU.
# Extra arguments go to pytest, e.g.  bash test.sh -k loss -x
set -euo pipefail
cd "$(dirname "$0")"
bash tools/setup_env.sh
exec .venv/bin/python -m pytest test "$@"
