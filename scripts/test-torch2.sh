#!/usr/bin/env bash
# The second build: the whole test suite against LibTorch 2.x with CUDA (the pinned torch wheel's,
# scripts/setup-pypi.sh), run on the CPU. Needs what scripts/test.sh installs (Debian's packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build-torch2}"
if [ "${CURV_SKIP_SETUP:-0}" != 1 ]; then "$root/scripts/setup-pypi.sh"; fi
# The benchmarks have no tests: CI leaves them out of this build. Every public header compiled
# alone checks its includes, which do not depend on the LibTorch: the Debian stage does it.
CURV_BUILD_DIR="$build" "$root/scripts/build-torch2.sh" -DCURV_BUILD_BENCH=OFF \
  -DCURV_HEADERS_ALONE=OFF
"$root/scripts/check-torch-runtime.sh" "$build"
echo "== the test suite against LibTorch $(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")"
# The notebooks' test trains and probes a small run with the tools, then runs the notebooks with
# Debian's Python on its file: the tools are covered by the rest of the suite here, and the
# notebooks by the Debian stage (scripts/test.sh). Here it would be this stage's critical path,
# 8.6 minutes of its 18.
(cd "$build" && ctest --output-on-failure -j "$(nproc)" -E '^every notebook executes headless')
echo "all checks passed against LibTorch 2.x"
