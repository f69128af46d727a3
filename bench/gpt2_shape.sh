#!/usr/bin/env bash
# One audit at GPT-2 small's shape: time and peak memory of ndsprobe on a 124M-parameter built-in
# GPT (12 layers x 768, 12 heads, vocabulary 50304, context 256, tied head).
#
# curvtrain takes one AdamW step (so the checkpoint holds AdamW's state), then ndsprobe audits
# that checkpoint's rebuilt AdamW update (--directions update --coupling none) on 4 sequences of
# 256 tokens: one gradient, one HVP and one L(θ + u), as it is and within a memory budget
# (--micro-batch 1 --max-memory 3G). Prints wall time and peak RSS as Markdown.
#
# usage: bench/gpt2_shape.sh [BUILD_DIR] [WORK_DIR]
#   BEFORE=/path/to/other/ndsprobe also runs that binary; THREADS (2), DTYPE (float32).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
work=${2:-/tmp/curv_gpt2_bench}
threads=${THREADS:-2}
dtype=${DTYPE:-float32}
mkdir -p "$work"
cat > "$work/gpt2.json" <<'EOF'
{"arch": "gpt", "vocab_size": 50304, "block_size": 256, "n_layer": 12, "n_head": 12,
 "n_embd": 768, "bias": true, "tied": true}
EOF
run="$work/run"
if [ ! -f "$run/step_1/model.safetensors" ]; then
  rm -rf "$run"
  "$build/tools/curvtrain/curvtrain" --model "$work/gpt2.json" -o "$run" --steps 1 \
    --save-every 1 --eval-every 1 --eval-sequences 1 --batch-size 1 --probe-sequences 4 \
    --train-tokens 65536 --optimizer adamw:lr=1e-4 --dtype "$dtype" --threads "$threads" \
    --quiet > "$work/curvtrain.log"
fi

source "$here/measure.sh"
row() { awk -v n="$1" -v s="$2" -v r="$3" 'BEGIN {printf "| %s | %.1f | %.2f |\n", n, s, r / 1048576}'; }
args=("$run" --steps 0:0 --data "$run/probe.safetensors" --directions update --coupling none
      --batch-size 4 --dtype "$dtype" --threads "$threads" --quiet)

echo "| program | wall time (s) | peak RSS (GiB) |"
echo "|---|---|---|"
read -r s rss _ < <(measure "$work/ndsprobe" "$build/tools/ndsprobe/ndsprobe" "${args[@]}" \
  -o "$work/ndsprobe.h5")
row "ndsprobe" "$s" "$rss"
# The same audit within a memory budget: the batch in slices of one sequence, no graph kept past
# 3 GiB of resident memory, free heap pages returned (docs/performance.md).
read -r s rss _ < <(measure "$work/ndsprobe_budget" "$build/tools/ndsprobe/ndsprobe" "${args[@]}" \
  --micro-batch 1 --max-memory 3G -o "$work/ndsprobe_budget.h5")
row "ndsprobe --micro-batch 1 --max-memory 3G" "$s" "$rss"
if [ -n "${BEFORE:-}" ]; then
  read -r s rss _ < <(measure "$work/before" "$BEFORE" "${args[@]}" -o "$work/before.h5")
  row "ndsprobe before" "$s" "$rss"
fi
echo
echo "$threads threads, $dtype; 4 x 256 tokens; one gradient, one HVP, one L(θ + u)"
