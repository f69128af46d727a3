#!/usr/bin/env bash
# Configures and builds libcurv, its tools, tests and benchmarks against LibTorch 2.x, the one
# inside the pinned torch wheel of scripts/setup-pypi.sh (with CUDA: its CUDA code paths compile
# and link here without a GPU), into build-torch2/ (Release, Ninja). Every other dependency is
# Debian's, as in scripts/build.sh. CURV_TORCH_PREFIX builds against another LibTorch instead
# (an official archive's folder, for example).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build-torch2}"
jobs="${CURV_JOBS:-$(nproc)}"
venv="${CURV_VENV:-$root/.venv}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
if [ -n "${CURV_TORCH_PREFIX:-}" ]; then
  prefix="$CURV_TORCH_PREFIX"
else
  # The wheel's CMake folder (torch/share/cmake) and the wheel's torch folder itself: TorchConfig
  # looks its libraries up with find_library, which searches the system's folders before the
  # wheel's, so with Debian's libtorch-dev installed it would otherwise pick Debian's libc10.so
  # and libtorch.so. A prefix's lib/ comes before the system's.
  cmake_dir=$("$venv/bin/python3" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  prefix="$cmake_dir;$(dirname "$(dirname "$cmake_dir")")"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix" \
  "-DCURV_TRANSFORMERS_PYTHON=$venv/bin/python3" "-DCURV_TORCHRUN=$venv/bin/torchrun" >/dev/null
cmake --build "$build" -j "$jobs"
