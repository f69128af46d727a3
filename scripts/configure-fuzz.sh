#!/usr/bin/env bash
# Configures the clang ASan + UBSan + libFuzzer build (CURV_SANITIZE, CURV_FUZZ) in $1
# (default build-fuzz/); scripts/sanitize.sh and scripts/fuzz.sh build their targets from it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-fuzz}"
if [ -f "$build/CMakeCache.txt" ]; then exit 0; fi
# -O1: the usual optimisation for sanitizer builds, and the fastest to compile. Static libcurv so
# that libFuzzer sees the library's coverage counters without a shared-library dance.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DBUILD_SHARED_LIBS=OFF -DCURV_SANITIZE=ON -DCURV_FUZZ=ON -DCURV_BUILD_BENCH=OFF >/dev/null
