#!/usr/bin/env bash
# Set-up to result: installs the Debian dependencies, builds, trains the 4-layer LLaMA of the
# reproduction study (examples/configs/llama-tiny.json) with AdamW and with Muon on Zipf-PCFG data
# at s = 0 and s = 1, at the learning rates the study's sweep chose (docs/reproduction.md), probes
# every run with ndsprobe, and writes one HDF5 file per probe, PNG plots and a summary into
# out/demo/; then trains and probes the two model problems (associative memory at the same
# exponents, structured quadratic) into out/demo/model_problems/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build}"
out="${CURV_DEMO_DIR:-$root/out/demo}"
steps="${CURV_DEMO_STEPS:-1000}"
exponents="${CURV_DEMO_EXPONENTS:-0 1}"
model="$root/examples/configs/llama-tiny.json"
if [ "${CURV_SKIP_SETUP:-0}" != 1 ]; then "$root/scripts/setup-debian.sh"; fi
# The two tools the demo runs, not the tests and benchmarks.
"$root/scripts/build.sh" --target curvtrain ndsprobe

start=$(date +%s)
rm -rf "$out"
mkdir -p "$out/runs"
# The reproduction study's choices (scripts/reproduce.sh, out/reproduce/sweep.csv): per optimizer
# and s, the learning rate with the lowest validation loss after 1000 updates (other exponents
# given in CURV_DEMO_EXPONENTS take those of s = 1).
declare -A optimizers=(
  [adamw_s0]="adamw:lr=1e-3,weight_decay=0"
  [adamw_s1]="adamw:lr=3e-3,weight_decay=0"
  [muon_s0]="muon:lr=0.01,adam_lr=3e-3,weight_decay=0"
  [muon_s1]="muon:lr=0.01,adam_lr=3e-3,weight_decay=0"
)
for s in $exponents; do
  for name in adamw muon; do
    run="${name}_s${s}"
    spec="${optimizers[$run]:-${optimizers[${name}_s1]}}"
    echo "== training $run ($spec, Zipf exponent s = $s)"
    "$build/tools/curvtrain/curvtrain" -o "$out/runs/$run" --model "$model" --optimizer "$spec" \
      --zipf-s "$s" --steps "$steps" --batch-size 32 --warmup 50 --save-every 100 \
      --eval-every 100 --probe-sequences 128 --probe-every 100 --probe-output "$out/train_probe.h5" \
      --run-name "$run" --quiet
  done
done

echo "== ndsprobe on every run (balanced probe set from the same grammar)"
runs=() compare=()
for s in $exponents; do
  for name in adamw muon; do runs+=("$out/runs/${name}_s${s}"); done
  compare+=(--compare "adamw_s$s/update:muon_s$s/update")
done
# The update at every checkpoint with head/tail tokens and the paired Adam/Muon comparison; at
# every other checkpoint (--stride 2) also the within-layer breakdown of the attention output and
# MLP down projections (the matrices the tail-end paper names: VO and FFN, two singular modes
# each), which costs 32 HVPs per batch beside the 6 of the layer blocks. The invocations share
# the file: each later one (--resume) adds only the units still missing, the last the
# checkpoint deltas.
probe=("$build/tools/ndsprobe/ndsprobe" "${runs[@]}" --data "$out/runs/adamw_s${exponents%% *}/probe.safetensors"
  --batch-size 32 --token-buckets head -o "$out/ndsprobe.h5")
"${probe[@]}" --directions update --stride 2 --within --modes 2 \
  --within-params '(self_attn\.o_proj|mlp\.down_proj)\.weight'
"${probe[@]}" --directions update "${compare[@]}" --resume
"${probe[@]}" --directions delta --resume

echo "== model problems: linear associative memory (tail classes) and structured quadratic"
mp="$out/model_problems"
declare -A memory_optimizers=([adamw]="adamw:lr=1e-2" [muon]="muon:lr=0.05")
for s in $exponents; do
  for name in adamw muon; do
    "$build/tools/curvtrain/curvtrain" -o "$mp/memory_${name}_s${s}" --model "$root/examples/configs/memory.json" \
      --optimizer "${memory_optimizers[$name]}" --zipf-s "$s" --steps 300 --batch-size 128 \
      --eval-every 100 --save-every 50 --quiet
  done
done
declare -A quadratic_optimizers=(
  [adamw]="adamw:lr=1e-2,weight_decay=0"
  [muon]="muon:lr=0.02,weight_decay=0"
  [muon_exact]="muon:lr=0.02,weight_decay=0,exact_polar=1"
)
for name in adamw muon muon_exact; do
  "$build/tools/curvtrain/curvtrain" -o "$mp/quadratic_${name}" --model "$root/examples/configs/quadratic.json" \
    --optimizer "${quadratic_optimizers[$name]}" --steps 100 --save-every 20 --clip 0 --quiet
done
"$build/tools/ndsprobe/ndsprobe" "$mp"/quadratic_* --data "$mp/quadratic_muon/probe.safetensors" \
  --directions update,gradient -o "$mp/quadratic.h5" --quiet

/usr/bin/python3 "$root/tools/python/plot_demo.py" "$out"
echo "demo finished in $(( $(date +%s) - start )) s (after the build)"
