#!/usr/bin/env bash
# The second build: the whole test suite against LibTorch 2.x with CUDA (the pinned torch wheel's,
# scripts/setup-pypi.sh), run on the CPU, then the Python package built from the same folder and
# its tests (scripts/test-python.sh). Needs what scripts/test.sh installs (Debian's packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build-torch2}"
if [ "${CURV_SKIP_SETUP:-0}" != 1 ]; then "$root/scripts/setup-pypi.sh"; fi
# The benchmarks have no tests: CI leaves them out of this build. Every public header compiled
# alone checks its includes, which do not depend on the LibTorch: the Debian stage does it.
CURV_BUILD_DIR="$build" "$root/scripts/build-torch2.sh" -DCURV_BUILD_BENCH=OFF \
  -DCURV_HEADERS_ALONE=OFF -DCURV_PYTHON=ON
"$root/scripts/check-torch-runtime.sh" "$build"
echo "== the test suite against LibTorch $(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")"
# Left to the Debian stage (scripts/test.sh), which runs them against the same tools' code: the
# notebooks (Debian's Python on a small probe file) and the tests of the tools as processes
# (signals, kill -9 at random moments, the reproduction and optimizer studies' scripts), which
# exercise file commits, resumption and scripts rather than LibTorch.
skip='^(every notebook executes headless|kill -9 at 20 random moments|ndsprobe stops cleanly on SIGINT|reproduce.sh sweeps|optimizers.sh trains)'
(cd "$build" && ctest --output-on-failure -j "$(nproc)" -E "$skip")
echo "== the Python package (docs/python.md)"
CURV_BUILD_DIR="$build" "$root/scripts/test-python.sh"
echo "all checks passed against LibTorch 2.x"
