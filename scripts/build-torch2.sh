#!/usr/bin/env bash
# Configures and builds libcurv, its tools, tests and benchmarks against LibTorch 2.x, the one
# inside the pinned torch wheel of scripts/setup-pypi.sh (with CUDA: its CUDA code paths compile
# and link here without a GPU), into build-torch2/ (Release, Ninja). Every other dependency is
# Debian's, as in scripts/build.sh. CURV_TORCH_PREFIX builds against another LibTorch instead
# (an official archive's folder, for example). Arguments are passed to CMake's configure
# (scripts/test-torch2.sh: -DCURV_BUILD_BENCH=OFF).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build-torch2}"
jobs="${CURV_JOBS:-$(nproc)}"
venv="${CURV_VENV:-$root/.venv}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
if [ -n "${CURV_TORCH_PREFIX:-}" ]; then
  prefix="$CURV_TORCH_PREFIX"
else
  # The wheel's CMake folder, as docs/building.md's by-hand command gives it: CMakeLists.txt adds
  # the wheel's torch folder itself (cmake/TorchLinking.cmake), so that TorchConfig's
  # find_library takes the wheel's libraries even with Debian's libtorch-dev installed.
  prefix=$("$venv/bin/python3" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
fi
# The ninja the Python package's build (scikit-build-core) takes when it reuses this folder: the
# environment's own (the pinned PyPI ninja) when it has one. A folder built by two ninja versions
# would be rebuilt whole, its build log being the other version's.
ninja=()
if [ -x "$venv/bin/ninja" ]; then ninja=("-DCMAKE_MAKE_PROGRAM=$venv/bin/ninja"); fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix" \
  "-DCURV_TRANSFORMERS_PYTHON=$venv/bin/python3" "-DCURV_TORCHRUN=$venv/bin/torchrun" \
  "${ninja[@]}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
