#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, ASan + UBSan, into build-fuzz/) if needed and runs each
# for SECONDS_PER_HARNESS (default 60) on its seeds (fuzz/make_seeds.py) and the corpus kept in
# build-fuzz/fuzz-corpus/. Prints executions and crashes per harness; exits non-zero when any
# harness crashed (a sanitizer report, a signal, an exception other than curv::Error, a timeout
# or running out of memory). Crash inputs are left in build-fuzz/fuzz-artifacts/<harness>/.
# Usage: scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]   (default: every harness but
# fuzz_h5_resume). CURV_FUZZ_RUNS=N also stops each harness after N executions; CURV_FUZZ_FLAGS
# adds libFuzzer flags. The long runs of docs/reliability.md:
#   CURV_FUZZ_RUNS=1000000 CURV_FUZZ_FLAGS=-detect_leaks=0 scripts/fuzz.sh 36000 fuzz_torch_file
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${CURV_JOBS:-$(nproc)}"
seconds="${1:-60}"
shift || true
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"

# fuzz_h5_resume runs only when named: on raw HDF5 bytes it mostly finds crashes inside libhdf5
# 1.10's own parser, which libcurv cannot fix (docs/reliability.md#crashes-found-and-fixed).
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for src in "$root"/fuzz/fuzz_*.cpp; do
    name="$(basename "$src" .cpp)"
    case "$name" in fuzz_support | fuzz_h5_resume) ;; *) harnesses+=("$name") ;; esac
  done
fi

"$root/scripts/configure-fuzz.sh" "$build"
cmake --build "$build" -j "$jobs" --target fuzzers

seeds="$build/fuzz-seeds"
if [ ! -f "$seeds/.done" ] || [ "$root/fuzz/make_seeds.py" -nt "$seeds/.done" ]; then
  rm -rf "$seeds"
  /usr/bin/python3 "$root/fuzz/make_seeds.py" "$seeds"
  touch "$seeds/.done"
fi

# One thread per harness: the fuzzers measure coverage, not speed, and CI has 2 cores.
export OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0:abort_on_error=1:strict_string_checks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

extra=()
if [ -n "${CURV_FUZZ_RUNS:-}" ]; then extra=(-runs="$CURV_FUZZ_RUNS"); fi
read -r -a flags <<<"${CURV_FUZZ_FLAGS:-}"
extra+=("${flags[@]}")

failed=0
printf '%-24s %12s %8s %8s %8s\n' harness executions seconds corpus crashes
for h in "${harnesses[@]}"; do
  kind="${h#fuzz_}"
  corpus="$build/fuzz-corpus/$kind"
  artifacts="$build/fuzz-artifacts/$kind"
  log="$build/fuzz-logs/$h.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")" "$seeds/$kind"
  rc=0
  start=$(date +%s)
  "$build/fuzz/$h" -max_total_time="$seconds" "${extra[@]}" -timeout=25 -rss_limit_mb=3072 -max_len=262144 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "$seeds/$kind" \
    >"$log" 2>&1 &
  pid=$!
  wait "$pid" || rc=$?
  # A crashed harness leaves its scratch folder (fuzz/fuzz_support.cpp) behind.
  rm -rf "/dev/shm/curv_fuzz_$pid"
  elapsed=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  if [ -z "$execs" ]; then
    execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
  fi
  crashes=$(find "$artifacts" -type f -newermt "@$start" | wc -l)
  if [ "$rc" != 0 ] && [ "$crashes" = 0 ]; then crashes=1; fi
  printf '%-24s %12s %8s %8s %8s\n' "$h" "${execs:-?}" "$elapsed" "$(ls "$corpus" | wc -l)" \
    "$crashes"
  if [ "$crashes" != 0 ]; then
    failed=1
    echo "  $h crashed (exit $rc); log: $log"
    grep -m5 -E 'ERROR: |runtime error|CRASH:|SUMMARY' "$log" | sed 's/^/    /' || true
    find "$artifacts" -type f -newermt "@$start" | sed 's/^/    input: /'
  fi
done
exit "$failed"
