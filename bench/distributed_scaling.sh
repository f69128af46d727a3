#!/usr/bin/env bash
# Data parallelism against threads, side by side in one invocation: the same ndsprobe audit
# (bench/audit_vs_python.sh's nanoGPT-shaped run: --directions delta, layer blocks, full coupling,
# realized change) as 1 process × 1 thread, 1 process × 2 threads and 2 processes × 1 thread
# (ranks on 127.0.0.1, c10d Gloo). Checks that the two-rank file equals the one-process file
# (compare_h5.py) and prints wall time and peak RSS per process as Markdown, then the all-reduce
# cost at model-sized buffers (allreduce_bench).
#
# usage: bench/distributed_scaling.sh [BUILD_DIR] [WORK_DIR]
#   LAYERS (6), WIDTH (256), HEADS (8), CONTEXT (128), VOCAB (1024), PROBE (64 sequences),
#   BATCH (16), DTYPE (float32) size the run, as in audit_vs_python.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
work=${2:-/tmp/curv_distributed_bench}
layers=${LAYERS:-6} width=${WIDTH:-256} heads=${HEADS:-8} context=${CONTEXT:-128}
vocab=${VOCAB:-1024} probe=${PROBE:-64} batch=${BATCH:-16} dtype=${DTYPE:-float32}
python=/usr/bin/python3
mkdir -p "$work"
source "$here/measure.sh"

cat > "$work/model.json" <<JSON
{"arch": "gpt", "vocab_size": $vocab, "block_size": $context, "n_layer": $layers,
 "n_head": $heads, "n_embd": $width, "bias": true, "tied": true}
JSON
run="$work/run"
if [ ! -f "$run/step_20/model.safetensors" ]; then
  rm -rf "$run"
  "$build/tools/curvtrain/curvtrain" --model "$work/model.json" -o "$run" --steps 20 \
    --save-every 10 --eval-every 20 --eval-sequences 16 --batch-size 8 --warmup 2 \
    --optimizer adamw:lr=3e-3 --probe-sequences "$probe" --train-tokens 262144 \
    --dtype "$dtype" --threads 2 --quiet > "$work/curvtrain.log"
fi
ndsprobe="$build/tools/ndsprobe/ndsprobe"
args=("$run" --data "$run/probe.safetensors" --directions delta --batch-size "$batch"
      --dtype "$dtype" --quiet)

read -r one1_s one1_rss _ < <(measure "$work/one_x1" "$ndsprobe" "${args[@]}" --threads 1 \
  -o "$work/one_x1.h5")
read -r one2_s one2_rss _ < <(measure "$work/one_x2" "$ndsprobe" "${args[@]}" --threads 2 \
  -o "$work/one_x2.h5")
port=$((29500 + RANDOM % 1000))
start=$(date +%s.%N)
for rank in 0 1; do
  WORLD_SIZE=2 RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=lo \
    OMP_NUM_THREADS=1 measure "$work/two_rank$rank" "$ndsprobe" "${args[@]}" --threads 1 \
    -o "$work/two_x1.h5" > "$work/two_rank$rank.measure" &
done
wait
two_s=$(echo "$(date +%s.%N) - $start" | bc)
read -r _ rss0 _ < "$work/two_rank0.measure"
read -r _ rss1 _ < "$work/two_rank1.measure"
tolerance=$([ "$dtype" = float64 ] && echo 1e-12 || echo 1e-5)
agreement=$($python "$here/../tests/python/compare_h5.py" "$work/one_x1.h5" "$work/two_x1.h5" \
  "$tolerance")
params=$($python -c "import h5py, sys; print(h5py.File(sys.argv[1]).attrs['model'])" \
  "$work/one_x1.h5")

printf '%s\n\n' "$params; $probe probe sequences in batches of $batch, $dtype"
printf '| processes × threads | wall time (s) | peak RSS per process (GiB) | speed-up vs 1 × 1 |\n'
printf '|---|---|---|---|\n'
gib() { printf '%.2f' "$(echo "scale=4; $1 / 1048576" | bc)"; }
printf '| 1 × 1 | %.1f | %s | 1.00x |\n' "$one1_s" "$(gib "$one1_rss")"
printf '| 1 × 2 | %.1f | %s | %.2fx |\n' "$one2_s" "$(gib "$one2_rss")" \
  "$(echo "$one1_s / $one2_s" | bc -l)"
printf '| 2 × 1 | %.1f | %s, %s | %.2fx |\n' "$two_s" "$(gib "$rss0")" "$(gib "$rss1")" \
  "$(echo "$one1_s / $two_s" | bc -l)"
printf '\nTwo ranks against one process: %s\n\n' "$agreement"

port=$((port + 1))
for rank in 0 1; do
  WORLD_SIZE=2 RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=lo \
    "$build/bench/allreduce_bench" --repeats 5 &
done
wait
