#!/usr/bin/env bash
# One prepared GPU check of the CUDA backend: the real-GPU tests, then the benchmark.
# Made to fit a lent H200 (no network there) in well under 10 minutes.
#
# 1. HERE (network, PyPI), once: fetch the pure-Python wheels the GPU machine lacks
#    (typeguard, espnet 202511 without its dependencies: only its loss module is used)
#    into bench/out/wheels (ignored by git, ~5 MB):
#        bash bench/gpu_check.sh --fetch-wheels
# 2. THERE: the device tool's `run`, with carry ["bench/out/wheels"]:
#        bash bench/gpu_check.sh
#    It uses the machine's own python3 / torch / numba / numba-cuda / pytest, installs
#    the carried wheels into /tmp/site (falls back to `pip install -e '.[cuda]'` where
#    pip can reach an index), and writes everything to $OUT (default bench/out/gpu):
#        env.txt  pytest_gpu.log  bench.log  bench.jsonl
# Budgets (seconds) can be changed with PYTEST_BUDGET / BENCH_BUDGET.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=bench/out/wheels
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p "$WHEELS"
    PIP=${PIP:-.venv/bin/pip}
    [[ -x "$PIP" ]] || PIP="python3 -m pip"
    $PIP download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp -d "$WHEELS" "typeguard>=4" "espnet==202511" || exit 1
    ls -la "$WHEELS"
    exit 0
fi

OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || echo "WARNING: wheel install failed"
    export PYTHONPATH=/tmp/site
else
    # a machine that reaches an index: the package with its CUDA extra
    $PY -m pip install -q -e ".[cuda]" || echo "WARNING: pip install -e .[cuda] failed"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

{
    date -u
    nvidia-smi -L 2>&1
    $PY - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("torch", "numba", "numba_cuda", "typeguard", "espnet", "pytest"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "MISSING", e)
import torch
print("cuda", torch.version.cuda, torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
from numba import cuda
print("numba.cuda available:", cuda.is_available())

@cuda.jit
def _k(x):
    x[cuda.grid(1)] += 1.0

x = torch.zeros(64, device="cuda")
_k[2, 32](cuda.as_cuda_array(x, sync=False))
torch.cuda.synchronize()
print("numba kernel on a torch tensor:", float(x.sum()), "(want 64.0)")
EOF
} 2>&1 | tee "$OUT/env.txt"

echo "=== pytest (real-GPU tests of the CUDA backend) ==="
timeout "${PYTEST_BUDGET:-300}" $PY -m pytest -q -rs -p no:cacheprovider \
    --timeout 150 test/test_loss_cuda_sim.py -k "gpu" 2>&1 | tee "$OUT/pytest_gpu.log"
rc_test=${PIPESTATUS[0]}

echo "=== benchmark ==="
timeout "${BENCH_BUDGET:-270}" $PY bench/loss_gpu.py --out "$OUT/bench.jsonl" \
    2>&1 | tee "$OUT/bench.log"
rc_bench=${PIPESTATUS[0]}

echo "pytest rc=$rc_test  bench rc=$rc_bench  (124 = ran out of its budget)"
exit $(( rc_test != 0 || rc_bench != 0 ))
