#!/usr/bin/env bash
# ndsprobe --plan's estimate against the memory the same run measures, side by side in one
# invocation, on 16 runs: the built-in GPT and LLaMA at 4 layers × 128 and context 64 (a delta
# and AdamW audit with full coupling, 32 probe sequences), a GPT of context 256 (delta, full
# coupling, 32 sequences) and a LLaMA of context 512 (delta, --coupling none, 16 sequences), each
# in float32 and bfloat16, in whole batches and in micro-batches. Each model trains 2-4 AdamW
# steps with curvtrain first. The measured figure is the run's peak resident memory
# (/usr/bin/time -v) less that of its --plan process, which loads the same libraries and
# allocates nothing the plan counts. On the CPU the resident memory is the device's; on a GPU
# ndsprobe's peak_memory is what to compare (bench/scale_gpu.sh).
#
# usage: bench/plan_check.sh BUILD_DIR WORK_DIR
#   Environment: THREADS (2).
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
build=$1 work=$2
mkdir -p "$work"
threads=${THREADS:-2}
cat > "$work/gpt64.json" <<'EOF'
{"arch": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 512, "block_size": 64,
 "tied": true}
EOF
cat > "$work/llama64.json" <<'EOF'
{"arch": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 512,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 64, "tie_word_embeddings": true}
EOF
cat > "$work/gpt256.json" <<'EOF'
{"arch": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 2048, "block_size": 256,
 "tied": true}
EOF
cat > "$work/llama512.json" <<'EOF'
{"arch": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
 "max_position_embeddings": 512, "tie_word_embeddings": true}
EOF
peak_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }
in_bytes() {
  awk '$1 == "total" { u = $3; m = u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1
                       printf "%.0f", $2 * m }' "$1"
}
# model, probe sequences, audit options, micro-batch
configs=(
  "gpt64 32 --directions=delta,adamw --coupling=full 8"
  "llama64 32 --directions=delta,adamw --coupling=full 8"
  "gpt256 32 --directions=delta --coupling=full 8"
  "llama512 16 --directions=delta --coupling=none 4"
)
printf '| model | dtype | micro-batch | planned | measured | measured / planned |\n'
printf '|---|---|---|---|---|---|\n'
for config in "${configs[@]}"; do
  read -r model sequences directions coupling micro <<< "$config"
  run=$work/run_$model
  if [ ! -d "$run" ]; then
    "$build/tools/curvtrain/curvtrain" --model "$work/$model.json" -o "$run" --optimizer adamw \
      --steps 2 --save-every 1 --probe-sequences "$sequences" --threads "$threads" --quiet \
      > /dev/null
  fi
  for dtype in float32 bfloat16; do
    for m in 0 "$micro"; do
      args=("$run" --data "$run/probe.safetensors" --steps 0:0 "$directions" "$coupling"
        --dtype "$dtype" --micro-batch "$m" --threads "$threads" --quiet)
      /usr/bin/time -v "$build/tools/ndsprobe/ndsprobe" "${args[@]}" --plan \
        > "$work/plan.txt" 2> "$work/plan.time"
      /usr/bin/time -v "$build/tools/ndsprobe/ndsprobe" "${args[@]}" -o "$work/out.h5" \
        > /dev/null 2> "$work/run.time"
      awk -v model="$model" -v d="$dtype" -v m="$m" -v planned="$(in_bytes "$work/plan.txt")" \
        -v base="$(peak_kib "$work/plan.time")" -v peak="$(peak_kib "$work/run.time")" 'BEGIN {
          measured = (peak - base) * 1024
          printf "| %s | %s | %s | %.0f MiB | %.0f MiB | %.2f |\n", model, d, m == 0 ? "whole" : m,
                 planned / 1048576, measured / 1048576, measured / planned }'
    done
  done
done
