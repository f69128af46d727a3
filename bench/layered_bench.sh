#!/usr/bin/env bash
# Layer-wise recomputation (--recompute-layers) against the whole graph, side by side in one
# invocation on one machine: the same delta audit (--coupling none, and full coupling) of a
# built-in LLaMA of 8 layers × 256 at context 512 (8 probe sequences in micro-batches of 2),
# trained 2 AdamW steps with curvtrain first, run with kept graphs (the default), with
# --recompute-graphs and with --recompute-layers, in float32 and bfloat16. For each: the plan's
# total (--plan), the measured peak (the run's peak resident memory less that of its --plan
# process, which loads the same libraries and allocates nothing the plan counts, as
# bench/plan_check.sh measures it), the unit's engine seconds and HVP count, and its NDS.
#
# usage: bench/layered_bench.sh BUILD_DIR WORK_DIR
#   Environment: THREADS (2), PYTHON (/usr/bin/python3, with h5py).
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
build=$1 work=$2
threads=${THREADS:-2}
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$work"
cat > "$work/llama.json" <<'EOF'
{"arch": "llama", "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 688,
 "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
 "max_position_embeddings": 512, "tie_word_embeddings": false}
EOF
run=$work/run
if [ ! -d "$run" ]; then
  "$build/tools/curvtrain/curvtrain" --model "$work/llama.json" -o "$run" --optimizer adamw \
    --steps 2 --save-every 1 --batch-size 2 --probe-sequences 8 --threads "$threads" --quiet \
    > /dev/null
fi
peak_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }
planned_mib() {
  awk '$1 == "total" { u = $3; m = u == "KiB" ? 1 / 1024 : u == "MiB" ? 1 : u == "GiB" ? 1024 : 1
                       printf "%.0f", $2 * m }' "$1"
}
printf '| dtype | coupling | graphs | planned | measured | engine s | HVPs | NDS (delta) |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for dtype in float32 bfloat16; do
  for coupling in none full; do
    for mode in kept --recompute-graphs --recompute-layers; do
      args=("$run" --data "$run/probe.safetensors" --steps 0:0 --directions delta
        --coupling "$coupling" --dtype "$dtype" --micro-batch 2 --threads "$threads" --quiet)
      [ "$mode" != kept ] && args+=("$mode")
      /usr/bin/time -v "$build/tools/ndsprobe/ndsprobe" "${args[@]}" --plan \
        > "$work/plan.txt" 2> "$work/plan.time"
      rm -f "$work/out.h5"
      /usr/bin/time -v "$build/tools/ndsprobe/ndsprobe" "${args[@]}" -o "$work/out.h5" \
        > /dev/null 2> "$work/run.time"
      measured=$(( ($(peak_kib "$work/run.time") - $(peak_kib "$work/plan.time")) / 1024 ))
      "$py" - "$work/out.h5" "$dtype" "$coupling" "$mode" "$(planned_mib "$work/plan.txt")" \
        "$measured" <<'PY'
import sys
import h5py
path, dtype, coupling, mode, planned, measured = sys.argv[1:]
with h5py.File(path) as f:
    units = []
    f.visititems(lambda name, g: units.append(g) if "nds" in g.attrs else None)
    a = units[0].attrs
    print(f"| {dtype} | {coupling} | {mode.lstrip('-')} | {planned} MiB | {measured} MiB "
          f"| {a['seconds']:.1f} | {a['hvps']} | {a['nds']:.9g} |")
PY
    done
  done
done
