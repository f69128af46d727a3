#!/usr/bin/env bash
# The scale checks of one GPU, each within 8 minutes of device time and 60 GB of disk (its files
# removed at the end). Every ndsprobe run is planned first (--plan) and refused by
# --memory-budget (the device's memory) when the plan does not fit, so what does not fit is
# reported with the plan's estimate instead of an out-of-memory.
#
#   1b: a LLaMA of Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads / 8 KV, SwiGLU 8192,
#       vocabulary 128256, tied head), context 1024, trained 2 AdamW steps in float32 by
#       curvtrain on the GPU (checkpoints 0, 1, 2 as safetensors with their AdamW state) with 64
#       probe sequences. ndsprobe's default audit (delta and AdamW update, layer blocks, full
#       coupling) of checkpoint 1 in bfloat16 (float32 vectors, then bfloat16 vectors: the plan
#       under 40 GB) and in float32 with TF32 products, micro-batches of
#       one sequence with graphs recomputed (at vocabulary 128256 the float32 logits of 64 × 1024
#       tokens alone take 34 GB); plain PyTorch's audit of the delta under the same rule
#       (bench/python/plain_torch_audit.py --recompute --batch-size 1), bfloat16; then the top 3
#       eigenvalues in bfloat16 with bfloat16 solver vectors (24 Lanczos steps, the basis in
#       host memory: on the device it would take 24 parameter-sized vectors). Engine time
#       (ndsprobe's summary line), peak device memory (each unit's peak_memory) and the plans.
#   7b: a LLaMA of Llama-2-7B's shape in bfloat16, written by bench/python/
#       write_scale_checkpoints.py (a random init and the init plus ±2e-4 per entry: AdamW's
#       state does not fit beside the model), 16 probe sequences of 1024 tokens: the delta's
#       audit (--coupling none) and λ_max alone (--eig-bottom 0) by Lanczos without a basis (two
#       vectors, three while the recurrence runs again for the Ritz vector's residual), bfloat16
#       vectors, micro-batches of one sequence, one layer's graph at a time (--recompute-layers:
#       planned at 52.6 GiB, within an 80 GB card).
#   Both keep θ's saved copy and the next checkpoint in host memory (--host-copies).
#
# usage: bench/scale_gpu.sh 1b|7b BUILD_DIR [WORK_DIR]
#        PYTHON: a python3 with a CUDA torch
set -uo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
size=$1
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$2" && pwd)
work=${3:-/tmp/curv_scale_$size}
py=${PYTHON:-python3}
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
budget=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)M
nds=("$build/tools/ndsprobe/ndsprobe")
# Prints the plan, then runs when it fits; the unit peaks and the summary line after.
planned_run() {
  local out=$1
  shift
  echo "== ndsprobe $*"
  "${nds[@]}" "$@" --plan --memory-budget "$budget" || return 0
  /usr/bin/time -f "wall %e s" "${nds[@]}" "$@" --memory-budget "$budget" -o "$out" 2>&1 |
    grep -E "wall|wrote|^run |rror"
  "$py" - "$out" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1]) as f:
    def show(name, g):
        if isinstance(g, h5py.Group) and "peak_memory" in g.attrs:
            a = g.attrs
            extra = f", NDS {a['nds']:.6g}, hvps {a['hvps']}, {a['seconds']:.1f} s" if "nds" in a else ""
            print(f"{name}: peak {a['peak_memory'] / 2**30:.2f} GiB{extra}")
    f.visititems(show)
PY
}

if [ "$size" = 1b ]; then
  cat > "$work/1b.json" <<'JSON'
{"arch": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 1024, "rope_theta": 500000.0, "tie_word_embeddings": true}
JSON
  run=$work/run
  /usr/bin/time -f "curvtrain wall %e s" "$build/tools/curvtrain/curvtrain" --model "$work/1b.json" \
    -o "$run" --steps 2 --save-every 1 --eval-every 2 --eval-sequences 1 --batch-size 1 \
    --probe-sequences 64 --train-tokens 200000 --optimizer adamw:lr=1e-4 --dtype float32 \
    --device cuda --quiet 2>&1 | tail -2
  common=("$run" --data "$run/probe.safetensors" --steps 1:1 --device cuda --micro-batch 1
    --recompute-graphs --host-copies --quiet)
  planned_run "$work/bf16.h5" "${common[@]}" --directions delta,adamw --dtype bfloat16
  planned_run "$work/bf16v.h5" "${common[@]}" --directions delta,adamw --dtype bfloat16 \
    --vector-dtype bfloat16
  planned_run "$work/tf32.h5" "${common[@]}" --directions delta,adamw --dtype float32 \
    --matmul-precision high
  echo "== plain PyTorch, bfloat16, the delta's audit under the same rule"
  /usr/bin/time -f "wall %e s" "$py" "$here/python/plain_torch_audit.py" "$run" \
    --data "$run/probe.safetensors" --batch-size 1 --dtype bfloat16 --recompute --device cuda \
    --step 1 -o "$work/plain.json"
  "$py" - "$work/plain.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["checkpoints"][0]
print("plain: audit %.1f s, peak %.2f GiB, NDS %.6g"
      % (r["audit_seconds"], r["peak_memory"] / 2**30, c["curvature"] / c["sq_norm"]))
PY
  planned_run "$work/eig.h5" "${common[@]}" --directions delta --dtype bfloat16 \
    --vector-dtype bfloat16 --spectrum --eig-top 3 --eig-max-hvps 24 --krylov-basis host
elif [ "$size" = 7b ]; then
  cat > "$work/7b.json" <<'JSON'
{"arch": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
 "max_position_embeddings": 1024, "tie_word_embeddings": false}
JSON
  run=$work/run
  /usr/bin/time -f "writing wall %e s" "$py" "$here/python/write_scale_checkpoints.py" \
    "$work/7b.json" "$run" --sequences 16 --device cuda
  planned_run "$work/7b.h5" "$run" --data "$run/probe.safetensors" --device cuda \
    --micro-batch 1 --recompute-layers --host-copies --quiet --directions delta --coupling none \
    --dtype bfloat16 --vector-dtype bfloat16 --spectrum --eig-top 1 --eig-bottom 0 \
    --krylov-basis none
else
  echo "scale_gpu.sh: size '$size': expected 1b or 7b" >&2
  exit 2
fi
