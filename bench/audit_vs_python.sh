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
read -r ours_s ours_rss ours_faults < <(measure "$work/ndsprobe" \
  "$build/tools/ndsprobe/ndsprobe" "${probe_args[@]}" -o "$work/ndsprobe.h5")
read -r py_s py_rss py_faults < <(measure "$work/python" \
  $python "$here/python/plain_torch_audit.py" "$run" --data "$run/probe.safetensors" \
  --batch-size "$batch" --threads "$threads" --dtype "$dtype" -o "$work/python.json")
# The same with glibc malloc's defaults: a malloc tunable in GLIBC_TUNABLES (here tcache_count at
# its default value) makes init_runtime leave the allocator alone.
read -r plain_s plain_rss plain_faults < <(GLIBC_TUNABLES=glibc.malloc.tcache_count=7 \
  measure "$work/ndsprobe_malloc_defaults" "$build/tools/ndsprobe/ndsprobe" "${probe_args[@]}" \
  -o "$work/ndsprobe_malloc_defaults.h5")
# ndsprobe picks OpenBLAS's vector kernels itself where OpenBLAS falls back to generic ones
# (curv::reexec_for_blas_kernels); Python torch does not. The same script with that core forced
# separates the kernels from the rest.
core=$($python -c "import h5py, sys; r = h5py.File(sys.argv[1]).attrs['runtime']
print(r.split('OpenBLAS ')[1].split(',')[0] if 'OpenBLAS ' in r else '')" "$work/ndsprobe.h5")
forced=""
if [ -n "$core" ]; then
  read -r forced_s forced_rss forced_faults < <(OPENBLAS_CORETYPE=$core measure "$work/python_forced" \
    $python "$here/python/plain_torch_audit.py" "$run" --data "$run/probe.safetensors" \
    --batch-size "$batch" --threads "$threads" --dtype "$dtype" -o "$work/python_forced.json")
  forced="$forced_s $forced_rss $forced_faults"
fi
before=""
if [ -n "${BEFORE:-}" ]; then
  read -r before_s before_rss before_faults < <(measure "$work/before" \
    "$BEFORE" "${probe_args[@]}" -o "$work/before.h5")
  before="$before_s $before_rss $before_faults"
fi

$python - "$work" "$ours_s $ours_rss $ours_faults" "$py_s $py_rss $py_faults" "$before" \
  "$threads" "$dtype" "$forced" "$core" "$plain_s $plain_rss $plain_faults" <<'EOF'
import json, sys
import h5py
work, ours, py, before, threads, dtype, forced, core, plain = sys.argv[1:10]
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
ps, prss, _ = (float(x) for x in py.split())
entries = [("ndsprobe", ours), ("ndsprobe, glibc malloc defaults", plain)] + \
          ([("ndsprobe before", before)] if before else []) + \
          [("plain Python torch", py)] + \
          ([(f"plain Python torch, OPENBLAS_CORETYPE={core}", forced)] if forced else [])
for name, values in entries:
    s, rss, faults = (float(x) for x in values.split())
    print(f"| {name} | {s:.1f} | {rss / 2**20:.2f} | {faults / 1e6:.2f}M | {s / ps:.2f}x | "
          f"{rss / prss:.2f}x |")
print()
print(f"{threads} threads, {dtype}; ndsprobe's BLAS: OpenBLAS {core or '(as loaded)'}; "
      f"Python's own timer: {ref['seconds']:.1f} s")
EOF
