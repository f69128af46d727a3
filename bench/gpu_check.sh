#!/usr/bin/env bash
# What needs a GPU, on a machine with one and a build against a CUDA LibTorch (scripts/
# build-torch2.sh, or an official archive): the hidden [.cuda] tests (the engine and ndsprobe on
# CUDA against the CPU in float64, the device memory budget, a real CUDA out-of-memory), then
# GPT-2 small's audit side by side: a 124M-parameter built-in GPT (12 x 768, vocabulary 50304,
# context 256), 64 probe sequences of 256 tokens in 16 batches of 4, --directions delta
# --coupling none, float32, by ndsprobe as it is (twice, then once with --no-prefetch and once
# with TF32 products, --matmul-precision high), by
# ndsprobe within an 8 GiB device budget (--max-memory 8G --micro-batch 2) and by plain PyTorch
# (bench/python/plain_torch_audit.py, explicit attention), each twice; last, the CUDA kernels of
# the fused second derivatives against ATen's operations and the composite formulas at the same
# shape (hvp_bench --compare-fused-ops 1). Then the LLaMA family at the same size: a LLaMA of
# hidden 768, 12 layers of 12 heads, SwiGLU 2048, vocabulary 50257, on 16 probe sequences of 1024
# tokens in float32: ndsprobe's default audit (delta, layer blocks, full coupling, realized change)
# against plain PyTorch's (plain_torch_audit.py --coupling full) in batches of 4, each twice, and
# hvp_bench's ATen / composite / CUDA-kernel comparison of its RMSNorm, SwiGLU and rotary product
# at that shape (a gradient, a first and a reused HVP).
#
# usage: bench/gpu_check.sh BUILD_DIR [WORK_DIR] [all|gpt2|llama]
#        PYTHON: a python3 with a CUDA torch
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
work=${2:-/tmp/curv_gpu_check}
parts=${3:-all}
py=${PYTHON:-python3}
mkdir -p "$work"
# Wall time and host peak RSS of a command (GNU time where the machine has it).
timed() {
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "wall %e s, host peak RSS %M KiB" "$@"
  else
    local start
    start=$(date +%s%N)
    "$@"
    echo "wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
  fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$py" -c 'import torch; print("python torch", torch.__version__, torch.cuda.get_device_name(0))'

# The NDS, audit time and peak memory of a plain_torch_audit.py result file.
plain_summary() {
  "$py" - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["checkpoints"][0]
print(f"plain: audit {r['audit_seconds']:.2f} s, total {r['seconds']:.2f} s, peak "
      f"{r['peak_memory'] / 2**30:.2f} GiB, loss {c['loss']:.6f}, NDS {c['curvature'] / c['sq_norm']:.6f}")
PY
}

if [ "$parts" != llama ]; then
echo "== the [.cuda] tests"
"$build/tests/curv_tests" "[.cuda]"
echo "cuda tests exit code $?"

echo "== GPT-2 small's shape: the run (curvtrain, one AdamW step on the GPU)"
cat > "$work/gpt2.json" <<'JSON'
{"arch": "gpt", "vocab_size": 50304, "block_size": 256, "n_layer": 12, "n_head": 12,
 "n_embd": 768, "bias": true, "tied": true}
JSON
run="$work/run"
rm -rf "$run"
"$build/tools/curvtrain/curvtrain" --model "$work/gpt2.json" -o "$run" --steps 1 --save-every 1 \
  --eval-every 1 --eval-sequences 1 --batch-size 1 --probe-sequences 64 --train-tokens 65536 \
  --optimizer adamw:lr=1e-4 --dtype float32 --device cuda --quiet > "$work/curvtrain.log" 2>&1
echo "curvtrain exit code $?"; tail -3 "$work/curvtrain.log"
args=("$run" --data "$run/probe.safetensors" --directions delta --coupling none --batch-size 4
      --dtype float32 --device cuda --quiet)
for i in 1 2; do
  echo "== ndsprobe, run $i"
  timed "$build/tools/ndsprobe/ndsprobe" "${args[@]}" -o "$work/ndsprobe_$i.h5" 2>&1 |
    grep -E "wall|wrote|^run |delta|rror"
done
echo "== ndsprobe --no-prefetch (each checkpoint read at its turn)"
timed "$build/tools/ndsprobe/ndsprobe" "${args[@]}" --no-prefetch -o "$work/no_prefetch.h5" 2>&1 |
  grep -E "wall|wrote|^run |delta|rror"
echo "== ndsprobe --matmul-precision high (TF32 products; the errors it measured on batch 0)"
timed "$build/tools/ndsprobe/ndsprobe" "${args[@]}" --matmul-precision high -o "$work/tf32.h5" \
  2>&1 | grep -E "wall|wrote|^run |delta|rror"
"$py" - "$work/tf32.h5" "$work/ndsprobe_1.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f, h5py.File(sys.argv[2], "r") as g:
    a = f["runs/run/step_0"].attrs
    print("tf32 errors:", {k: float(a[k]) for k in a if k.startswith("matmul_precision_")})
    u, v = f["runs/run/step_0/delta"].attrs, g["runs/run/step_0/delta"].attrs
    print(f"tf32 NDS {u['nds']:.6f} vs highest {v['nds']:.6f}, curvature {u['curvature']:.6g} vs "
          f"{v['curvature']:.6g}, audit seconds {u['seconds']:.2f} vs {v['seconds']:.2f}")
PY
for i in 1 2; do
  echo "== ndsprobe --max-memory 8G --micro-batch 2, run $i"
  timed "$build/tools/ndsprobe/ndsprobe" "${args[@]}" --max-memory 8G --micro-batch 2 \
    -o "$work/budget_$i.h5" 2>&1 | grep -E "wall|wrote|^run |delta|rror"
done
for i in 1 2; do
  echo "== plain PyTorch, run $i"
  timed "$py" "$here/python/plain_torch_audit.py" \
    "$run" --data "$run/probe.safetensors" --batch-size 4 --device cuda --coupling none \
    -o "$work/plain_$i.json" 2>&1 | grep -E "wall|Error|error"
  plain_summary "$work/plain_$i.json"
done
echo "== the fused second derivatives: ATen, composite formulas, CUDA kernels (hvp_bench)"
"$build/bench/hvp_bench" --compare-fused-ops 1 --device cuda --shape gpt2 --dtype float32 \
  --repeats 5 --threads "$(nproc)"
fi

if [ "$parts" != gpt2 ]; then
echo "== a LLaMA of GPT-2 small's size: the run (curvtrain, one AdamW step on the GPU)"
cat > "$work/llama.json" <<'JSON'
{"arch": "llama", "vocab_size": 50257, "hidden_size": 768, "intermediate_size": 2048,
 "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 1024}
JSON
lrun="$work/llama_run"
rm -rf "$lrun"
"$build/tools/curvtrain/curvtrain" --model "$work/llama.json" -o "$lrun" --steps 1 \
  --save-every 1 --eval-every 1 --eval-sequences 1 --batch-size 1 --probe-sequences 16 \
  --train-tokens 65536 --optimizer adamw:lr=1e-4 --dtype float32 --device cuda --quiet \
  > "$work/llama_curvtrain.log" 2>&1
echo "curvtrain exit code $?"; tail -3 "$work/llama_curvtrain.log"
for i in 1 2; do
  echo "== LLaMA: ndsprobe's default audit, run $i"
  timed "$build/tools/ndsprobe/ndsprobe" "$lrun" --data "$lrun/probe.safetensors" \
    --directions delta --batch-size 4 --dtype float32 --device cuda --quiet \
    -o "$work/llama_ndsprobe_$i.h5" 2>&1 | grep -E "wall|wrote|^run |delta|rror"
  echo "== LLaMA: plain PyTorch, run $i"
  timed "$py" "$here/python/plain_torch_audit.py" "$lrun" --data "$lrun/probe.safetensors" \
    --batch-size 4 --device cuda --coupling full -o "$work/llama_plain_$i.json" 2>&1 |
    grep -E "wall|Error|error"
  plain_summary "$work/llama_plain_$i.json"
done
echo "== LLaMA: RMSNorm, SwiGLU, rotary: ATen, composite formulas, CUDA kernels (hvp_bench)"
"$build/bench/hvp_bench" --compare-fused-ops 1 --device cuda --shape llama_gpt2 \
  --dtype float32 --repeats 3 --threads "$(nproc)"
fi
