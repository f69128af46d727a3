#!/usr/bin/env bash
# Configures and builds libcurv, its tools, tests and benchmarks into build/ (Release, Ninja);
# arguments go to the build (`--target ndsprobe` builds that tool alone).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build}"
jobs="${CURV_JOBS:-$(nproc)}"
# Paths relative to the source tree in the compiler cache: clones in other folders share it.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$jobs" "$@"
