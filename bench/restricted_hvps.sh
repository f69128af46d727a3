#!/usr/bin/env bash
# The analyses whose HVPs are restricted to parameters: the within-block breakdown (one tensor's
# modes and groups) and, with ANALYSIS=spectrum-blocks, each block's eigenvalues (H_ll). Runs
# ndsprobe on the run bench/audit_vs_python.sh trains (run that first), this build and, with
# BEFORE, another ndsprobe, alternating, in one invocation; checks that both write the same numbers
# and prints wall time and peak RSS of each run as Markdown.
#
# usage: bench/restricted_hvps.sh [BUILD_DIR] [WORK_DIR]
#   BEFORE=/path/to/other/ndsprobe  the other build (e.g. a wrapper that loads an older libcurv)
#   ANALYSIS (within | spectrum-blocks), PARAMS ('mlp\.c_fc\.weight', for within),
#   REPEATS (2), THREADS (2), BATCH (16), DTYPE (float32)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
work=${2:-/tmp/curv_audit_bench}
run="$work/run"
params=${PARAMS:-'mlp\.c_fc\.weight'} repeats=${REPEATS:-2} analysis=${ANALYSIS:-within}
threads=${THREADS:-2} batch=${BATCH:-16} dtype=${DTYPE:-float32}
if [ ! -f "$run/step_20/model.safetensors" ]; then
  echo "restricted_hvps.sh: no run in $run; run bench/audit_vs_python.sh first" >&2
  exit 2
fi
source "$here/measure.sh"
case "$analysis" in
  within) flags=(--within --within-params "$params") ;;
  # One checkpoint, a loose tolerance and a budget: each solve's HVP count is its cost.
  spectrum-blocks) flags=(--steps 10 --spectrum --spectrum-blocks --eig-tol 1e-3 --eig-max-hvps 40) ;;
  *) echo "restricted_hvps.sh: ANALYSIS '$analysis': expected within or spectrum-blocks" >&2; exit 2 ;;
esac

programs=("this build=$build/tools/ndsprobe/ndsprobe")
[ -n "${BEFORE:-}" ] && programs+=("before=$BEFORE")
results=()
for ((r = 1; r <= repeats; r++)); do
  for entry in "${programs[@]}"; do
    name=${entry%%=*} binary=${entry#*=}
    out="$work/restricted_${name// /_}.h5"
    rm -f "$out"
    read -r s rss _ < <(measure "$work/restricted_${name// /_}" "$binary" "$run" \
      --data "$run/probe.safetensors" --directions delta --batch-size "$batch" --dtype "$dtype" \
      --threads "$threads" --quiet --coupling none "${flags[@]}" -o "$out")
    results+=("$name|$s|$rss")
  done
done

/usr/bin/python3 - "$work" "${flags[*]}" "$threads" "$dtype" "${results[@]}" <<'EOF'
import sys
import h5py
import numpy as np
work, flags, threads, dtype, *results = sys.argv[1:]
names = sorted({r.split("|")[0] for r in results})
files = {n: h5py.File(f"{work}/restricted_{n.replace(' ', '_')}.h5") for n in names}
if len(names) == 2:
    a, b = files.values()
    worst, count = 0.0, 0
    def compare(name, obj):
        global worst, count
        # Every number but the timings.
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f" and "seconds" not in name:
            x, y = obj[()], b[name][()]
            finite = np.isfinite(y)
            if x.shape != y.shape or not np.array_equal(np.isfinite(x), finite):
                sys.exit(f"{name}: the two builds disagree on shape or finiteness")
            if finite.any():
                worst = max(worst, float(np.max(np.abs(x[finite] - y[finite]) /
                                                np.maximum(np.abs(y[finite]), 1e-30))))
            count += 1
    a.visititems(compare)
    if count == 0:
        sys.exit("no datasets written")
    print(f"Numbers of the two builds: {count} datasets, worst relative "
          f"difference {worst:.2e}")
    if worst > (1e-4 if dtype == "float32" else 1e-9):
        sys.exit("the two builds disagree")
    print()
print("| program | wall time (s) | peak RSS (GiB) |")
print("|---|---|---|")
for r in results:
    name, s, rss = r.split("|")
    print(f"| ndsprobe, {name} | {float(s):.1f} | {float(rss) / 2**20:.2f} |")
print()
print(f"{flags} --coupling none; {threads} threads, {dtype}")
EOF
