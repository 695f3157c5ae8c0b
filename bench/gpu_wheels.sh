#!/usr/bin/env bash
# Fetch (HERE, with network) the wheels a lent GPU machine lacks into bench/out/wheels
# (ignored by git), for bench/gpu_check.sh to unpack THERE (no network, no index):
#
#     bash bench/gpu_wheels.sh [--data]        # or: bash bench/gpu_check.sh --fetch-wheels
#
# The machine has python3 3.12 with torch, torchaudio, numba, numba-cuda, triton, numpy,
# scipy, pyyaml, sentencepiece, onnx, onnxruntime, pytest (and their dependencies:
# packaging, filelock, setuptools, typing_extensions, protobuf, ...), but neither ESPnet
# nor ESPnet's own dependencies. The wheels, pinned to the versions the project's venv
# runs:
#   the test stages: pytest-timeout, pytest-xdist + execnet (parallel GPU tests);
#   espnet 202511 without its dependencies: ESPnet's CUDA loss module (the oracle test,
#     the benchmark) and, for the `train` stage (bench/gpu_train.py) and the test
#     modules that build ESPnet's decoder, the whole ASR task;
#   what importing espnet2.tasks.asr and training its model needs beyond the machine's
#     packages, found by importing them with only the machine's packages and these
#     (module-level imports, all of them: ESPnet imports every encoder, decoder and
#     tokenizer module of the task): typeguard, configargparse, humanfriendly, kaldiio,
#     torch-complex, h5py, soundfile + cffi, einops, opt-einsum, hydra-core +
#     omegaconf + antlr4-python3-runtime 4.9.3 (an sdist only: built into a wheel
#     here), librosa (the mel filter bank) + lazy-loader, decorator, joblib,
#     cloudpickle, msgpack, pooch, espnet-g2p-en + nltk + regex + inflect, jamo,
#     espnet-tts-frontend + unidecode + jaconv; inflect's jaraco-functools +
#     more-itertools and cffi's pycparser (a failed import of inflect is swallowed:
#     g2p_en is then imported again later, and tries to download NLTK data).
#     Requirements left out, not imported while training: editdistance (ESPnet's WER
#     in validation), librosa's audioread, scikit-learn and soxr (loading and
#     resampling audio), nltk's click, tqdm and defusedxml, pooch's platformdirs and
#     requests, g2p_en's distance, espnet-tts-frontend's pypinyin.
# Binary wheels (h5py, cffi, msgpack, regex, soundfile) are for CPython 3.12 on
# manylinux x86_64; unpacked with Python's zipfile, they need no pip there. The script
# prints the total size (the device tool carries 64 MiB in all); with --data it also
# builds the training stage's data file from a digits recipe run (RECIPE_DIR, default
# egs/digits/asr1: run.sh stages 2-5 must have run there, 6-8 for the CPU loss
# curves; bench/gpu_train.py --prepare) and counts it in. Carry both: ["bench/out/wheels", "bench/out/train_data"].
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-bench/out/wheels}
DATA=${DATA:-bench/out/train_data}
PY=${PYTHON:-.venv/bin/python}
[[ -x "$PY" ]] || PY=python3

# name==version: the test stages' first, then the training stage's
WANT=(
    pytest-timeout==2.4.0 pytest-xdist==3.8.0 execnet==2.1.2
    espnet==202511 typeguard==4.6.1 configargparse==1.9.0 humanfriendly==10.0
    kaldiio==2.18.1 torch-complex==0.4.4 h5py==3.16.0 soundfile==0.14.0 cffi==2.1.1
    einops==0.8.2 opt-einsum==3.4.0 hydra-core==1.3.8 omegaconf==2.3.1
    librosa==0.11.0 lazy-loader==0.6 decorator==5.3.1 joblib==1.6.0
    cloudpickle==3.1.3 msgpack==1.2.4 pooch==1.9.0 espnet-g2p-en==2.1.0.post1
    nltk==3.10.4 regex==2026.12.2 inflect==7.6.0 jamo==0.4.1
    espnet-tts-frontend==0.0.4 unidecode==1.4.0 jaconv==0.5.0
    jaraco-functools==4.6.0 more-itertools==11.2.1 pycparser==3.12
)
# no wheel on PyPI (omegaconf 2.3 pins it): built here from its pure-Python sdist
SDIST=(antlr4-python3-runtime==4.9.3)
mkdir -p "$WHEELS"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${WANT[@]}"
for spec in "${SDIST[@]}"; do
    n=$(echo "${spec%%==*}" | tr 'A-Z.-' 'a-z__')
    compgen -G "$WHEELS/${n}-${spec#*==}-py3-none-any.whl" >/dev/null ||
        $PY -m pip wheel -q --no-deps -w "$WHEELS" "$spec"
done
WANT+=("${SDIST[@]}")
# only the wanted versions travel (an older fetch may have left others)
for w in "$WHEELS"/*.whl; do
    base=$(basename "$w")
    dist=$(echo "${base%%-*}" | tr 'A-Z_.' 'a-z--')
    ver=$(echo "$base" | cut -d- -f2)
    keep=0
    for spec in "${WANT[@]}"; do
        n=$(echo "${spec%%==*}" | tr 'A-Z_.' 'a-z--')
        [[ "$n" == "$dist" && "${spec#*==}" == "$ver" ]] && keep=1
    done
    ((keep)) || { echo "removing $base (not in the list)"; rm -f "$w"; }
done
if [[ "${1:-}" == "--data" ]]; then
    PYTHONPATH=$PWD $PY bench/gpu_train.py --prepare "${RECIPE_DIR:-egs/digits/asr1}" \
        --data "$DATA/digits.npz"
fi
ls -la "$WHEELS"
echo "wheels: $(ls "$WHEELS"/*.whl | wc -l) files, $(du -sk "$WHEELS" | cut -f1) KiB"
[[ -d "$DATA" ]] && echo "training data: $(du -sk "$DATA" | cut -f1) KiB ($DATA)"
echo "carried in all: $(du -skc "$WHEELS" "$DATA" 2>/dev/null | tail -1 | cut -f1) KiB" \
    "(the device tool's limit: 65536 KiB)"
