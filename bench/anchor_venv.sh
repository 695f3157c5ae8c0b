#!/usr/bin/env bash
# Side virtual environment for the CPU loss benchmark's anchor, optimized_transducer 1.4
# (k2-fsa; the fastest compiled CPU RNN-T loss we know of; standard RNN-T only).
#
#   bash bench/anchor_venv.sh [DIR]          # default DIR: .anchors (repository root)
#   DIR/bin/python bench/loss_cpu.py ...     # optimized_transducer then runs side by side
#
# Why a separate environment: optimized_transducer ships no wheels, only a source
# distribution whose CMake build needs a CPU build of torch (the project's .venv holds
# a CUDA build, which the build refuses on a machine without the CUDA toolkit).
# What it does: a venv with torch 2.13.0 (CPU build: on a machine whose pip does not
# find one by default, set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu),
# numba and numpy; optimized_transducer compiled from its sdist with three adjustments
# (C++17, which torch >= 2.1 headers need; CUDA off; pybind11 given as a local sdist
# instead of the download its CMake would attempt); this repository installed in
# editable mode without dependencies. Needs python3 (3.10+), a C++ compiler, about a
# minute and ~1 GB. The directory ignores itself in git (DIR/.gitignore).
set -euo pipefail

dir=${1:-.anchors}
py=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ ! -x "$dir/bin/python" ]]; then
    "$py" -m venv "$dir"
fi
dir=$(cd "$dir" && pwd)
echo '*' > "$dir/.gitignore"
pip=("$dir/bin/python" -m pip)

"${pip[@]}" install -q "torch==2.13.0" numba numpy setuptools wheel cmake
if "$dir/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"; then
    echo "anchor_venv: pip installed a CUDA build of torch; set" \
        "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu and rerun" >&2
    exit 1
fi

"${pip[@]}" download -q --no-deps --no-binary :all: -d "$tmp" \
    "optimized_transducer==1.4" "pybind11==3.1.0"
tar -xzf "$tmp"/optimized_transducer-1.4.tar.gz -C "$tmp"
tar -xzf "$tmp"/pybind11-3.1.0.tar.gz -C "$tmp"
src=$tmp/optimized_transducer-1.4
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 17' "$src/CMakeLists.txt" || {
    echo "anchor_venv: could not switch optimized_transducer to C++17" >&2
    exit 1
}
pyinc=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
export OT_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DOT_WITH_CUDA=OFF \
-DFETCHCONTENT_SOURCE_DIR_PYBIND11=$tmp/pybind11-3.1.0 -DCMAKE_CXX_FLAGS=-I$pyinc"
(cd "$src" && "${pip[@]}" install -q --no-build-isolation --no-deps .)

"${pip[@]}" install -q --no-deps -e "$repo"
(cd / && "$dir/bin/python" -c "
import torch, numba, optimized_transducer, espnet_multiblank
print('anchor venv ready:', torch.__version__, 'numba', numba.__version__,
      'optimized_transducer', getattr(optimized_transducer, '__version__', '1.4'))")
