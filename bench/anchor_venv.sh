#!/usr/bin/env bash
# Side virtual environment for the benchmarks' anchors (standard RNN-T only, both from
# k2-fsa): optimized_transducer 1.4, the fastest compiled CPU RNN-T loss we know of, and
# fast_rnnt 1.3, k2's pruned RNN-T loss (the memory-lean approximate anchor of the
# joint + loss benchmark).
#
#   bash bench/anchor_venv.sh [DIR]          # default DIR: .anchors (repository root)
#   DIR/bin/python bench/loss_cpu.py ...     # optimized_transducer then runs side by side
#   bench/joint_loss.py --anchor-python DIR/bin/python   # fast_rnnt, optimized_transducer
#
# Why a separate environment: optimized_transducer ships no wheels, only a source
# distribution whose CMake build needs a CPU build of torch (the project's .venv holds
# a CUDA build, which the build refuses on a machine without the CUDA toolkit).
# What it does: a venv with torch 2.13.0 (CPU build: on a machine whose pip does not
# find one by default, set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu),
# numba and numpy; optimized_transducer compiled from its sdist with three adjustments
# (C++17, which torch >= 2.1 headers need; CUDA off; pybind11 given as a local sdist
# instead of the download its CMake would attempt); fast_rnnt compiled from its sdist
# the same way (C++17, CUDA off, pybind11 local, its googletest download turned off
# with FT_BUILD_TESTS=OFF); this repository installed in editable mode without
# dependencies. Needs python3 (3.10+), a C++ compiler, about four minutes and ~1 GB.
# The directory ignores itself in git (DIR/.gitignore).
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
    "optimized_transducer==1.4" "fast_rnnt==1.3" "pybind11==3.1.0"
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

# fast_rnnt: CUDA off explicitly (a machine with nvcc would otherwise build it), no
# tests (their CMake downloads googletest), C++17 through the cache variable
tar -xzf "$tmp"/fast_rnnt-1.3.tar.gz -C "$tmp"
export FT_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DFT_BUILD_TESTS=OFF -DFT_WITH_CUDA=OFF \
-DCMAKE_CXX_STANDARD=17 -DFETCHCONTENT_SOURCE_DIR_PYBIND11=$tmp/pybind11-3.1.0 \
-DCMAKE_CXX_FLAGS=-I$pyinc"
export FT_MAKE_ARGS="-j$(nproc)"
(cd "$tmp/fast_rnnt-1.3" && "${pip[@]}" install -q --no-build-isolation --no-deps .)

"${pip[@]}" install -q --no-deps -e "$repo"
(cd / && "$dir/bin/python" -c "
import torch, numba, optimized_transducer, fast_rnnt, espnet_multiblank
print('anchor venv ready:', torch.__version__, 'numba', numba.__version__,
      'optimized_transducer', getattr(optimized_transducer, '__version__', '1.4'),
      'fast_rnnt', getattr(fast_rnnt, '__version__', '1.3'))")
