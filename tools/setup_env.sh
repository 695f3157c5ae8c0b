#!/usr/bin/env bash
# Create (or update) a virtual environment at the repository root with a torch /
# torchaudio / ESPnet combination that works together, then install espnet-multiblank
# in editable mode.
#
#   bash tools/setup_env.sh                        # ESPnet 202511 in .venv
#   ESPNET_VERSION=202611 bash tools/setup_env.sh  # ESPnet 202611 in .venv-espnet202611
#   (VENV=DIR chooses another folder; PYTHON=python3.11 another Python)
#
# Why not `pip install espnet`: ESPnet 202511 pins setuptools<74 while torch 2.14 needs
# setuptools>=77, so pip either swaps torch for another build or backtracks to an old
# ESPnet; ESPnet 202611 requires Python >= 3.12 (so pip on 3.11 picks 202511) and its
# espnet-model-zoo requirement pulls in another ESPnet (see "Installation" in
# README.md). We therefore install a pinned torch/torchaudio pair, the chosen ESPnet's
# own requirements (requirements/espnet.txt or espnet202611.txt) and ESPnet itself
# with --no-deps (202611's pure-Python wheel with --ignore-requires-python on Python
# 3.11, where its code runs); then we check that the result imports.
#
# Idempotent: a stamp holding the hash of the requirement files skips the installs when
# nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# shellcheck source=tools/venv_path.sh
source tools/venv_path.sh
PY=${PYTHON:-python3}
STAMP="$VENV/.espnet-multiblank-setup"
if [ "$ESPNET_VERSION" = 202511 ]; then
  ESPNET_REQS=requirements/espnet.txt
else
  ESPNET_REQS=requirements/espnet$ESPNET_VERSION.txt
fi
HASH=$( (echo "$ESPNET_VERSION"; cat requirements/*.txt pyproject.toml setup.py \
  tools/setup_env.sh tools/venv_path.sh) | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version 2>&1)"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# This machine's pip config lists local find-links folders for packages it does not
# have; pip warns about each one. Keep those lines out of the log.
export PIP_NO_INPUT=1
pip_quiet() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

if [ "$(cat "$STAMP" 2>/dev/null)" != "$HASH" ]; then
  rm -f "$STAMP"
  echo "[setup] installing torch/torchaudio (pinned), ESPnet's requirements, ESPnet" \
    "$ESPNET_VERSION into $VENV"
  pip_quiet install -q "setuptools>=77,<82" wheel
  pip_quiet install -q -r requirements/torch.txt
  pip_quiet install -q -r "$ESPNET_REQS" -r requirements/test.txt \
    -r requirements/lint.txt -c requirements/torch.txt "setuptools>=77,<82"
  if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    pip_quiet install -q --no-deps "espnet==$ESPNET_VERSION"
  else
    # ESPnet >= 202609 says Python >= 3.12; its pure-Python wheel runs on 3.11
    WHEELS="$VENV/espnet-wheel"
    pip_quiet download -q --no-deps --only-binary=:all: --python-version 3.12 \
      -d "$WHEELS" "espnet==$ESPNET_VERSION"
    pip_quiet install -q --no-deps --ignore-requires-python \
      "$WHEELS/espnet-$ESPNET_VERSION-py3-none-any.whl"
  fi
  pip_quiet install -q --no-deps -e .
  echo "$HASH" > "$STAMP"
else
  echo "[setup] $VENV is up to date"
fi
# start-up hook: ESPnet's stock espnet2.bin.asr_train / asr_inference see the plug-in
# (rewritten whenever this checkout's hook differs from the installed one)
"$VENV/bin/python" -m espnet_multiblank.espnet.autoregister status >/dev/null \
  || "$VENV/bin/python" -m espnet_multiblank.espnet.autoregister install

# Verify the environment: the pinned versions and ESPnet's ASR task import.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import os
import sys

want = {}
for line in open("requirements/torch.txt"):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, ver = line.split("==")
        want[name] = ver
for name, ver in want.items():
    got = md.version(name)
    if got.split("+")[0] != ver:
        sys.exit(f"[setup] {name} is {got}, expected {ver}: the environment was altered")
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (no nltk noise)
import numba
import espnet2.tasks.asr  # noqa: F401
import torch

from espnet_multiblank.espnet.compat import check_espnet

if md.version("espnet") != os.environ["ESPNET_VERSION"]:
    sys.exit(
        f"[setup] espnet is {md.version('espnet')}, expected "
        f"{os.environ['ESPNET_VERSION']}: the environment was altered"
    )
check_espnet()
print(
    f"[setup] ok: python {sys.version.split()[0]}, torch {torch.__version__}, "
    f"torchaudio {md.version('torchaudio')}, espnet {md.version('espnet')}, "
    f"numba {numba.__version__}"
)
PY
