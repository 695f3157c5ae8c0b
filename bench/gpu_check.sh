#!/usr/bin/env bash
# One prepared GPU check of the CUDA backend: the real-GPU tests, the loss benchmark,
# the fused joint + loss (its real-GPU tests and bench/joint_loss.py), ESPnet training
# steps of the recipe's multi-blank and TDT models (bench/gpu_train.py), then (when
# bench/decode_gpu.py exists) the decoding benchmark. Made for a lent GPU
# machine without network, in at most TOTAL_BUDGET seconds (default 570: a 10-minute
# command with room to spare). The stages' budgets add up to more than that (935 s,
# and more than a session's 15 minutes of device time with the machine's start-up):
# run issue 40's stages first, in one command (the Triton tile kernels against the
# dense step and the torch tile operations, then training with the fused joint + loss;
# about 560 s), and the others in what is left, or in a later session:
#     STAGES="fused_test fused_bench train" bash bench/gpu_check.sh
#     STAGES="test ll bench beam decode" bash bench/gpu_check.sh
#
# 1. HERE (network, PyPI), once: fetch the wheels the GPU machine lacks into
#    bench/out/wheels and build the training stage's data file in
#    bench/out/train_data (both ignored by git, ~17 + ~5 MB; bench/gpu_wheels.sh says
#    which wheels and why; --data needs a digits recipe run, RECIPE_DIR):
#        RECIPE_DIR=egs/digits/asr1 bash bench/gpu_check.sh --fetch-wheels --data
#    pytest-timeout (per-test time limit), pytest-xdist + execnet (the tests in
#    parallel processes: kernel compilation is per process and single-threaded, so
#    this is what makes the compile-heavy test matrix fit), espnet 202511 without
#    its dependencies (its CUDA loss module: the oracle test and the benchmark's
#    `espnet` rows; its ASR task: the training stage and the test modules that build
#    ESPnet's decoder), and what ESPnet's ASR task imports beyond the machine's
#    packages (typeguard, configargparse, humanfriendly, librosa, h5py, nltk, ...).
# 2. THERE: the device tool's `run`, with carry ["bench/out/wheels",
#    "bench/out/train_data"]:
#        bash bench/gpu_check.sh
#    It uses the machine's own python3 / torch / numba / numba-cuda / pytest, unpacks
#    the carried wheels into /tmp/site (no pip or index needed: a wheel is a zip of
#    importable files; the few binary ones are built for CPython 3.12), and writes
#    everything to $OUT (default bench/out/gpu):
#        env.txt  failures.txt  pytest_gpu.log  pytest_label_looping.log  bench.log
#        bench.jsonl  pytest_fused.log  joint_loss.log  joint_loss.jsonl  train.log
#        train.jsonl  pytest_batched_beam.log  decode_beam.log  decode_beam.jsonl
#        [decode.log]
#
# Stage budgets (seconds; each also capped by what is left of TOTAL_BUDGET, and each
# stage keeps the budgets of the chosen later stages in reserve). STAGES (default
# all: "test ll bench fused_test fused_bench train beam decode") chooses stages, for a
# rerun in what is left of a session's device time:
#   PYTEST_BUDGET=200  LL_BUDGET=30  BENCH_BUDGET=70  FUSED_TEST_BUDGET=150
#   FUSED_BENCH_BUDGET=240  TRAIN_BUDGET=150  BEAM_BUDGET=50  DECODE_BUDGET=45
# The train stage runs TRAIN_STEPS (default 300) steps of each of its four runs
# (multi-blank and TDT, dense and fused joint + loss) and stops each run early
# when its share of the budget is spent (a row says steps_done and cut_by_budget).
# Each failing test's report is appended to $OUT/failures.txt as it fails (a stage
# cut by its budget prints no summary). The device tool returns at most 8 files:
# pack the logs (tar) in the command that runs this script.
# The tests the GPU stages run: the "cuda" device of test_loss.py and
# test_loss_kernels.py, the GPU tests of test_loss_cuda.py, and the "cuda" device
# and GPU tests of test_fused_loss.py, test_fused_memory.py, test_fused_validation.py,
# test_fused_triton.py and test_loss_stages.py (the simulator's and the CPU's are
# deselected there: CI runs them). At the end $OUT/gpu_results.json gathers what
# the stages measured (bench/gpu_results.py; COMMIT=<hash> in the environment
# records the commit, the device machine has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=${WHEELS:-bench/out/wheels}
PY=${PYTHON:-python3}
T0=$(date +%s)
TOTAL_BUDGET=${TOTAL_BUDGET:-570}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    WHEELS=$WHEELS exec bash bench/gpu_wheels.sh "${@:2}"
fi

left() { echo $((TOTAL_BUDGET - ($(date +%s) - T0))); }
# The stages in order, each with its budget (seconds); STAGES picks some of them
# (say STAGES="test fused_test" to rerun two), each stage keeping the budgets of the
# chosen stages after it in reserve.
ORDER=(test ll bench fused_test fused_bench train beam decode)
declare -A BUDGET=(
    [test]=${PYTEST_BUDGET:-200} [ll]=${LL_BUDGET:-30} [bench]=${BENCH_BUDGET:-70}
    [fused_test]=${FUSED_TEST_BUDGET:-150} [fused_bench]=${FUSED_BENCH_BUDGET:-240}
    [train]=${TRAIN_BUDGET:-150} [beam]=${BEAM_BUDGET:-50} [decode]=${DECODE_BUDGET:-45}
)
STAGES=${STAGES:-${ORDER[*]}}
chosen() { [[ " $STAGES " == *" $1 "* ]]; }
budget() {  # budget STAGE: min(its budget, time left - later chosen stages'), >= 10
    local want=${BUDGET[$1]} reserve=0 later=0 st
    for st in "${ORDER[@]}"; do
        if ((later)) && chosen "$st"; then reserve=$((reserve + BUDGET[$st])); fi
        [[ "$st" == "$1" ]] && later=1
    done
    local rest=$(($(left) - reserve))
    ((rest < want)) && want=$rest
    ((want < 10)) && want=10
    echo "$want"
}

OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export ESPNET_MULTIBLANK_FAILURES_TO="$(cd "$OUT" && pwd)/failures.txt"

SITE=${SITE:-/tmp/site}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    mkdir -p "$SITE"
    for w in "$WHEELS"/*.whl; do  # a wheel is a zip of importable files
        $PY -m zipfile -e "$w" "$SITE" || echo "WARNING: could not unpack $w"
    done
    export PYTHONPATH=$SITE
else
    echo "no wheels in $WHEELS (run --fetch-wheels where there is network)"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

{
    date -u
    nvidia-smi -L 2>&1
    $PY - <<'EOF' 2>&1
import importlib, os, sys
print("python", sys.version.split()[0], sys.executable, "cpus", os.cpu_count())
need = ("torch", "numba", "numba_cuda", "pytest")
optional = ("triton", "pytest_timeout", "xdist", "execnet", "typeguard",
            "espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank")
for m in need + optional:
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "ok"))
    except Exception as e:
        print(m, "MISSING" if m in need else "missing (optional)", type(e).__name__, e)
import torch
print("cuda", torch.version.cuda, torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
import numpy as np
print("numpy", np.__version__, "has row_stack:", hasattr(np, "row_stack"),
      "(numba-cuda <= 0.30.4 needs it; the CUDA backend puts it back)")
import espnet_multiblank.loss.cuda.numpy_compat  # noqa: F401
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

rc_test=0 rc_ll=0 rc_bench=0 rc_fused_test=0 rc_fused_bench=0 rc_train=0
rc_beam_test=0 rc_beam=0 rc_decode=0
echo "stages: $STAGES"

# the GPU test stages' pytest runs in parallel processes (Numba and Triton compile
# per process, single-threaded) with a per-test limit, where the carried wheels allow
PAR_ARGS=()
if $PY -c "import xdist" 2>/dev/null; then
    NPROC=$($PY -c "import os; print(max(1, min(8, (os.cpu_count() or 2) - 2)))")
    PAR_ARGS+=(-n "$NPROC")
fi
if $PY -c "import pytest_timeout" 2>/dev/null; then
    PAR_ARGS+=(--timeout 240)
fi

if chosen test; then
    echo "=== pytest (real-GPU tests of the CUDA backend), $(left) s left ==="
    PYTEST_ARGS=(-q -rs -p no:cacheprovider -k "cuda and not sim and not sm90")
    PYTEST_ARGS+=(${PAR_ARGS[@]+"${PAR_ARGS[@]}"})
    timeout "$(budget test)" $PY -m pytest "${PYTEST_ARGS[@]}" test/test_loss.py \
        test/test_loss_kernels.py test/test_loss_cuda.py 2>&1 |
        tee "$OUT/pytest_gpu.log"
    rc_test=${PIPESTATUS[0]}
fi

# The label-looping search on the GPU vs the CPU (same hypotheses), offline and as
# streams (a batch of streams on CUDA tensors, fed in random chunks, ends where the
# CPU's offline search ends). The test modules build tiny models with ESPnet's
# decoder and joint network: if ESPnet's own imports fail on this machine, the log
# says so and the stage counts as not run.
if chosen ll; then
    echo "=== pytest (label-looping search and streams, GPU vs CPU), $(left) s left ==="
    timeout "$(budget ll)" $PY -m pytest -q -rs -p no:cacheprovider \
        test/test_label_looping.py test/test_streaming_search.py -k test_cuda 2>&1 |
        tee "$OUT/pytest_label_looping.log"
    rc_ll=${PIPESTATUS[0]}
fi

if chosen bench; then
    echo "=== loss benchmark, $(left) s left ==="
    B_BENCH=$(budget bench)
    # the script stops starting new configurations 30 s before its budget
    timeout "$B_BENCH" $PY bench/loss_gpu.py --budget-s $((B_BENCH - 30)) \
        --out "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.log"
    rc_bench=${PIPESTATUS[0]}
fi

# The fused joint + loss on the GPU: its real-GPU tests (the tests the CPU and the
# simulator run, on CUDA tensors: "numba" is the Triton tile kernels with the CUDA
# lattice, "torch-tiles" the torch tile operations with it, "torch" the PyTorch
# lattice; a medium batch in float32 / bf16; the paths at the issue's widths, V =
# 1024 and 5000; peak memory; the lattice runners against enumeration), in parallel
# processes (Triton and Numba compile per process), then one training step of the
# joint + loss at the issue's two shapes for every lattice: dense vs fused (Triton
# tiles) vs fused with the torch tile operations (the path measured 5.4x dense on an
# H200): time, peak memory (torch.cuda.max_memory_allocated above the inputs), loss
# and a fingerprint of the four gradients against dense's.
if chosen fused_test; then
    echo "=== pytest (fused joint + loss, GPU), $(left) s left ==="
    FUSED_ARGS=(-q -rs -p no:cacheprovider -k "cuda or gpu")
    FUSED_ARGS+=(${PAR_ARGS[@]+"${PAR_ARGS[@]}"})
    timeout "$(budget fused_test)" $PY -m pytest "${FUSED_ARGS[@]}" \
        test/test_fused_loss.py test/test_fused_memory.py test/test_fused_validation.py \
        test/test_fused_triton.py test/test_loss_stages.py 2>&1 |
        tee "$OUT/pytest_fused.log"
    rc_fused_test=${PIPESTATUS[0]}
fi

if chosen fused_bench; then
    echo "=== fused joint + loss benchmark, $(left) s left ==="
    B_FB=$(budget fused_bench)
    # V = 1024 for the three lattices first, then V = 5000; the script starts no new
    # (shape, lattice) 40 s before its budget
    timeout "$B_FB" $PY bench/joint_loss.py --device cuda --threads 1 --runs 3 \
        --lattices standard,multiblank,tdt --no-series --shape 8,300,60,320,1024 \
        --shape 8,300,60,320,5000 --fused-tile-backends torch \
        --only fused,fused-torch-tiles --budget-s $((B_FB - 40)) \
        --out "$OUT/joint_loss.jsonl" 2>&1 | tee "$OUT/joint_loss.log"
    rc_fused_bench=${PIPESTATUS[0]}
fi

# ESPnet training steps on the GPU (issue 40): the digits recipe's multi-blank and TDT
# models (its configs: model: multiblank_espnet, built by ESPnet's ASR task, ESPnet's
# optimiser, scheduler and gradient clipping), each dense and with the fused joint +
# loss (model_conf.transducer_fused_joint), TRAIN_STEPS steps of 8 recipe utterances
# (the carried bench/out/train_data/digits.npz; without it, synthetic tone "words"):
# the loss at the start and the end beside the recipe's CPU training at the same steps,
# non-finite losses / gradient norms, the median step time and the peak GPU memory,
# one JSON line per run in $OUT/train.jsonl (bench/gpu_train.py). ~15 s of imports,
# then ~25-35 s per run with the first step's kernel compilation (an estimate; the
# runs stop at their share of the budget): 300 steps fit TRAIN_BUDGET=150. A try of
# the stage without a GPU: STAGES=train TRAIN_DEVICE=cpu TRAIN_STEPS=5.
if chosen train; then
    echo "=== ESPnet training steps (multi-blank, TDT; dense, fused), $(left) s left ==="
    B_TRAIN=$(budget train)
    # the runs share what is left after the imports; 30 s in reserve for the last
    # run's model build and the summary
    timeout "$B_TRAIN" $PY bench/gpu_train.py --device "${TRAIN_DEVICE:-cuda}" \
        --steps "${TRAIN_STEPS:-300}" --budget-s $((B_TRAIN - 30)) \
        --data bench/out/train_data/digits.npz --out "$OUT/train.jsonl" 2>&1 |
        tee "$OUT/train.log"
    rc_train=${PIPESTATUS[0]}
fi

# The batched beam searches on the GPU: their GPU == CPU tests (both pruning rules;
# the test module builds tiny models with ESPnet's decoder and joint network: if
# ESPnet's own imports fail on this machine, the log says so), then the search
# benchmark on random networks of the recipe's sizes: batched greedy, the batched beam
# of both rules and the one-utterance beam, side by side, ratios printed
# (bench/decode_beam.py; $OUT/decode_beam.jsonl).
if chosen beam; then
    echo "=== batched beam search (GPU vs CPU tests, benchmark), $(left) s left ==="
    B_BEAM=$(budget beam)
    T_BEAM=$(date +%s)
    timeout "$B_BEAM" $PY -m pytest -q -rs -p no:cacheprovider \
        test/test_batched_beam.py -k test_cuda_matches_cpu 2>&1 |
        tee "$OUT/pytest_batched_beam.log"
    rc_beam_test=${PIPESTATUS[0]}
    B_BEAM=$((B_BEAM - ($(date +%s) - T_BEAM)))
    ((B_BEAM < 10)) && B_BEAM=10
    # 32 utterances, one round: at 64 x 2 the first model's row (the one-at-a-time
    # beam is slow on a GPU: kernel launches per step) did not fit in 30 s on an H200
    OUT=$OUT timeout "$B_BEAM" $PY bench/decode_beam.py --device cuda --utts 32 \
        --rounds 1 --budget-s $((B_BEAM - 15)) 2>&1 |
        tee "$OUT/decode_beam.log"
    rc_beam=${PIPESTATUS[0]}
fi

# Slot for the decoding benchmark (written separately): run when present, with what
# is left; it gets DECODE_BUDGET_S and OUT in its environment.
if chosen decode && [[ -f bench/decode_gpu.py ]]; then
    echo "=== decoding benchmark, $(left) s left ==="
    B_DEC=$(budget decode)
    DECODE_BUDGET_S=$B_DEC OUT=$OUT timeout "$B_DEC" $PY bench/decode_gpu.py 2>&1 |
        tee "$OUT/decode.log"
    rc_decode=${PIPESTATUS[0]}
fi

echo "stages run: $STAGES (0 also for a stage not run; 124 = ran out of its budget)"
$PY bench/gpu_results.py "$OUT" --stages "$STAGES" --commit "${COMMIT:-unknown}" \
    --rc "test=$rc_test,ll=$rc_ll,bench=$rc_bench,fused_test=$rc_fused_test" \
    --rc "fused_bench=$rc_fused_bench,train=$rc_train,beam_test=$rc_beam_test" \
    --rc "beam=$rc_beam,decode=$rc_decode" > "$OUT/gpu_results.json" ||
    echo "WARNING: bench/gpu_results.py failed"
echo "pytest rc=$rc_test  label-looping rc=$rc_ll  bench rc=$rc_bench" \
    "fused pytest rc=$rc_fused_test  fused bench rc=$rc_fused_bench" \
    "train rc=$rc_train" \
    "batched beam pytest rc=$rc_beam_test  batched beam bench rc=$rc_beam" \
    "decode rc=$rc_decode; $(($(date +%s) - T0)) s in all"
exit $((rc_test != 0 || rc_ll != 0 || rc_bench != 0 || rc_fused_test != 0 ||
    rc_fused_bench != 0 || rc_train != 0 || rc_beam_test != 0 || rc_beam != 0 ||
    rc_decode != 0))
