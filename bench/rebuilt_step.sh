#!/usr/bin/env bash
# The memory a rebuilt AdamW step holds beyond the parameters and the gradient, with its saved
# state read by parameter (streamed: Optimizer::step_from_saved, ndsprobe's way) or whole first
# (whole: load_state, then step), side by side in one invocation: REPEATS alternating runs of
# bench/rebuilt_step_bench, each in its own process, on one optimizer.safetensors written first
# (PARAMS float32 parameters, 2^28 by default: 2.1 GB of state).
#
# usage: bench/rebuilt_step.sh BUILD_DIR WORK_DIR
#   Environment: PARAMS (268435456), REPEATS (3), THREADS (2). The state is kept in WORK_DIR.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
bench=$1/bench/rebuilt_step_bench work=$2
mkdir -p "$work"
if [ ! -f "$work/optimizer.safetensors" ]; then
  "$bench" write "$work" --params "${PARAMS:-268435456}"
fi
for _ in $(seq "${REPEATS:-3}"); do
  for mode in streamed whole; do
    "$bench" run "$work" "$mode" --threads "${THREADS:-2}"
  done
done | awk '/^RESULT/ {
  for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
  m = f["mode"]; n[m]++; t[m, n[m]] = f["seconds"]; p[m, n[m]] = f["peak_extra"]
  bytes = f["state_bytes"]; norm[m] = f["u_norm"]; print
}
END {
  printf "\nstate %.2f GB; median of %d runs each\n", bytes / 1e9, n["streamed"]
  printf "%-9s %10s %18s %s\n", "mode", "seconds", "peak extra (GB)", "|u|"
  for (k = 0; k < 2; ++k) {
    m = k == 0 ? "streamed" : "whole"
    # medians by sorting the n values (n is small)
    for (i = 1; i <= n[m]; ++i) { a[i] = t[m, i]; b[i] = p[m, i] }
    for (i = 1; i <= n[m]; ++i) for (j = i + 1; j <= n[m]; ++j) {
      if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
      if (b[j] < b[i]) { x = b[i]; b[i] = b[j]; b[j] = x }
    }
    mid = int((n[m] + 1) / 2)
    printf "%-9s %10.3f %18.3f %s\n", m, a[mid], b[mid] / 1e9, norm[m]
  }
}'
