#!/usr/bin/env bash
# The second build: the whole test suite against LibTorch 2.x with CUDA (the pinned torch wheel's,
# scripts/setup-pypi.sh), run on the CPU. Needs what scripts/test.sh installs (Debian's packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build-torch2}"
if [ "${CURV_SKIP_SETUP:-0}" != 1 ]; then "$root/scripts/setup-pypi.sh"; fi
# The benchmarks have no tests: CI leaves them out of this build.
CURV_BUILD_DIR="$build" "$root/scripts/build-torch2.sh" -DCURV_BUILD_BENCH=OFF
"$root/scripts/check-torch-runtime.sh" "$build"
echo "== the test suite against LibTorch $(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")"
(cd "$build" && ctest --output-on-failure -j "$(nproc)")
echo "all checks passed against LibTorch 2.x"
