#!/usr/bin/env bash
# ASan + UBSan stage: builds libcurv and the parser/file tests (curv_io_tests) with clang's
# AddressSanitizer and UndefinedBehaviorSanitizer into build-fuzz/ (the same instrumented library
# the fuzz harnesses link, so CI builds it once) and runs the subset below. LibTorch, HDF5 and the
# other libraries are not instrumented. docs/reliability.md#sanitizers says why this subset.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${CURV_JOBS:-$(nproc)}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
# The parser and file tests: safetensors, torch.save files, HDF5 files, native checkpoints and the
# replayed fuzz crashes.
tags="${CURV_SANITIZE_TAGS:-[safetensors],[torch_file],[h5],[checkpoint],[fuzz]}"

"$root/scripts/configure-fuzz.sh" "$build"
cmake --build "$build" -j "$jobs" --target curv_io_tests

# Leaks inside LibTorch's and OpenMP's uninstrumented globals are suppressed by name
# (fuzz/lsan.supp); anything from libcurv is reported.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0:abort_on_error=1:strict_string_checks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "== ASan+UBSan: curv_io_tests \"$tags\""
"$build/tests/curv_io_tests" "$tags"
