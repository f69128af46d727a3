#!/usr/bin/env bash
# ndsprobe against the same audit in plain Python torch, side by side in one invocation.
#
# Trains a nanoGPT-shaped built-in GPT for a few steps (curvtrain; the built-in GPT is nanoGPT's
# model), then runs ndsprobe --directions delta (layer blocks, full coupling, realized change)
# and bench/python/plain_torch_audit.py on the same checkpoints and probe set, one after the
# other, with the same threads and each in its default environment; checks that their numbers
# agree and prints wall time, peak RSS and page faults of each, with the ratios, as Markdown.
# When ndsprobe chose OpenBLAS kernels itself, the Python script runs a second time with the same
# kernels forced, so the table shows what the kernels account for and what the engine does.
#
# usage: bench/audit_vs_python.sh [BUILD_DIR] [WORK_DIR]
#   BEFORE=/path/to/other/ndsprobe  also runs that binary (e.g. a build of an older commit)
#   THREADS (2), LAYERS (6), WIDTH (256), HEADS (8), CONTEXT (128), VOCAB (1024),
#   PROBE (64 sequences), BATCH (16), DTYPE (float32) size the run.
#   REPEATS (1): runs of each program, taking turns; the table gives medians and ranges.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
work=${2:-/tmp/curv_audit_bench}
threads=${THREADS:-2}
layers=${LAYERS:-6} width=${WIDTH:-256} heads=${HEADS:-8} context=${CONTEXT:-128}
vocab=${VOCAB:-1024} probe=${PROBE:-64} batch=${BATCH:-16} dtype=${DTYPE:-float32}
python=/usr/bin/python3
mkdir -p "$work"

cat > "$work/model.json" <<EOF
{"arch": "gpt", "vocab_size": $vocab, "block_size": $context, "n_layer": $layers,
 "n_head": $heads, "n_embd": $width, "bias": true, "tied": true}
EOF
run="$work/run"
if [ ! -f "$run/step_20/model.safetensors" ]; then
  rm -rf "$run"
  "$build/tools/curvtrain/curvtrain" --model "$work/model.json" -o "$run" --steps 20 \
    --save-every 10 --eval-every 20 --eval-sequences 16 --batch-size 8 --warmup 2 \
    --optimizer adamw:lr=3e-3 --probe-sequences "$probe" --train-tokens 262144 \
    --dtype "$dtype" --threads "$threads" --quiet > "$work/curvtrain.log"
fi

source "$here/measure.sh"

probe_args=("$run" --data "$run/probe.safetensors" --directions delta --batch-size "$batch"
            --dtype "$dtype" --threads "$threads" --quiet)
# Each program runs REPEATS times, the programs taking turns, so that drifts of the machine (a
# virtual CPU's steal time, the host backing fresh pages) fall on all of them alike; the table
# gives the median wall time with the range, and the largest peak RSS.
repeats=${REPEATS:-1}
python_audit=($python "$here/python/plain_torch_audit.py" "$run" --data "$run/probe.safetensors"
              --batch-size "$batch" --threads "$threads" --dtype "$dtype")
ours="" py="" plain="" forced="" before="" core=""
for ((r = 1; r <= repeats; r++)); do
  ours+="$(measure "$work/ndsprobe" "$build/tools/ndsprobe/ndsprobe" "${probe_args[@]}" \
    -o "$work/ndsprobe.h5"),"
  py+="$(measure "$work/python" "${python_audit[@]}" -o "$work/python.json"),"
  # The same with glibc malloc's defaults: a malloc tunable in GLIBC_TUNABLES (here tcache_count
  # at its default value) makes init_runtime leave the allocator alone.
  plain+="$(GLIBC_TUNABLES=glibc.malloc.tcache_count=7 measure "$work/ndsprobe_malloc_defaults" \
    "$build/tools/ndsprobe/ndsprobe" "${probe_args[@]}" -o "$work/ndsprobe_malloc_defaults.h5"),"
  # ndsprobe picks OpenBLAS's vector kernels itself where OpenBLAS falls back to generic ones
  # (curv::reexec_for_blas_kernels); Python torch does not. The same script with that core forced
  # separates the kernels from the rest.
  core=$($python -c "import h5py, sys; r = h5py.File(sys.argv[1]).attrs['runtime']
print(r.split('OpenBLAS ')[1].split(',')[0] if 'OpenBLAS ' in r else '')" "$work/ndsprobe.h5")
  if [ -n "$core" ]; then
    forced+="$(OPENBLAS_CORETYPE=$core measure "$work/python_forced" "${python_audit[@]}" \
      -o "$work/python_forced.json"),"
  fi
  if [ -n "${BEFORE:-}" ]; then
    before+="$(measure "$work/before" "$BEFORE" "${probe_args[@]}" -o "$work/before.h5"),"
  fi
done

$python - "$work" "$ours" "$py" "$before" "$threads" "$dtype" "$forced" "$core" "$plain" \
  "$repeats" <<'EOF'
import json, statistics, sys
import h5py
work, ours, py, before, threads, dtype, forced, core, plain, repeats = sys.argv[1:11]
ref = json.load(open(f"{work}/python.json"))
t = h5py.File(f"{work}/ndsprobe.h5")["taylor"]
dec = lambda xs: [x.decode() if isinstance(x, bytes) else x for x in xs]
rows = {(int(s), b): i for i, (s, b) in enumerate(zip(t["step"][:], dec(t["block"][:])))}
worst = 0.0
for c in ref["checkpoints"]:
    i = rows[(c["step"], "total")]
    for key in ("loss", "first_order", "curvature", "realized"):
        ours_v, ref_v = float(t[key][i]), c[key]
        worst = max(worst, abs(ours_v - ref_v) / max(abs(ref_v), 1e-30))
    for block, value in c["blocks"].items():
        ours_v = float(t["curvature"][rows[(c["step"], block)]])
        worst = max(worst, abs(ours_v - value) / max(abs(c["curvature"]), 1e-30))
tol = 1e-4 if dtype == "float32" else 1e-9
print(f"Numbers agree: worst relative difference {worst:.2e} (tolerance {tol:g}; block "
      f"curvatures relative to the total)")
if worst > tol:
    sys.exit("ndsprobe and the Python audit disagree")
print()
print("| program | wall time (s) | peak RSS (GiB) | minor page faults | time vs Python | RSS vs Python |")
print("|---|---|---|---|---|---|")
# Per program: the median wall time and page faults over the repeats, its range, the largest RSS.
def summary(runs):
    triples = [[float(x) for x in r.split()] for r in runs.split(",") if r.strip()]
    walls = [t[0] for t in triples]
    return (statistics.median(walls), min(walls), max(walls), max(t[1] for t in triples),
            statistics.median(t[2] for t in triples))
ps, _, _, prss, _ = summary(py)
entries = [("ndsprobe", ours), ("ndsprobe, glibc malloc defaults", plain)] + \
          ([("ndsprobe before", before)] if before else []) + \
          [("plain Python torch", py)] + \
          ([(f"plain Python torch, OPENBLAS_CORETYPE={core}", forced)] if forced else [])
for name, runs in entries:
    s, lo, hi, rss, faults = summary(runs)
    wall = f"{s:.1f}" if int(repeats) == 1 else f"{s:.1f} ({lo:.1f}–{hi:.1f})"
    print(f"| {name} | {wall} | {rss / 2**20:.2f} | {faults / 1e6:.2f}M | {s / ps:.2f}x | "
          f"{rss / prss:.2f}x |")
print()
if int(repeats) > 1:
    print(f"Each program {repeats} times, taking turns: median wall time (range), largest peak RSS.")
print(f"{threads} threads, {dtype}; ndsprobe's BLAS: OpenBLAS {core or '(as loaded)'}; "
      f"Python's own timer: {ref['seconds']:.1f} s")
EOF
