#!/usr/bin/env bash
# libcurv (ndsprobe's engine) against its peers, curvlinops-for-pytorch and hessian-eigenthings,
# on the same models, checkpoints and probe batches, in one invocation.
#
# Makes a nanoGPT-shaped GPT and a LLaMA-shaped model (bench/python/peer_models.py: a few AdamW
# steps on a synthetic token stream, saved as native checkpoints with their probe sets), then,
# each measurement in its own process under /usr/bin/time -v, one side after the other:
#   (a) one HVP of a fixed vector (first product, and a second one at the same parameters),
#   (b) the EIG_TOP largest eigenvalues to relative tolerance EIG_TOL, judged against a reference
#       (libcurv's Lanczos with the residual bound at tolerance 1e-10),
#   (c) the trace by Hutchinson and by Hutch++ at TRACE_HVPS HVPs (estimate, standard error),
#   (d) a spectral density by Lanczos quadrature, SLQ_RUNS x SLQ_STEPS,
# plus a memory baseline per side (model, data and operator built, no pass). Every HVP is
# counted on every side. Prints a Markdown report (also WORK/report.md) with the HVPs, seconds,
# peak RSS and the accuracy of each number. 17 minutes on 1 thread per process on the 2-core
# reference machine while it was shared (load average 3 to 6), with the default sizes (each model
# 0.43M parameters; 16 probe sequences of 32 tokens in 2 batches; float64).
#
# usage: bench/peers.sh [BUILD_DIR] [WORK_DIR]
#   BUILD_DIR: a build of scripts/build-torch2.sh (default build-torch2: the LibTorch of the torch
#   wheel that the peers run on, so both sides run the same kernels); WORK_DIR default out/peers.
#   Needs .venv-bench (scripts/setup-bench.sh). Environment: THREADS (1), DTYPE (float64),
#   DEVICE (cpu; cuda works), MODELS ("gpt llama"), PROBE (16 sequences), BATCH (8),
#   TRAIN_STEPS (30), EIG_TOP (3), EIG_TOL (1e-6), TRACE_HVPS (99), SLQ_RUNS (5), SLQ_STEPS (40),
#   PYTHON (.venv-bench/bin/python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build-torch2}" && pwd)
work=${2:-$root/out/peers}
python=${PYTHON:-$root/.venv-bench/bin/python3}
threads=${THREADS:-1} dtype=${DTYPE:-float64} device=${DEVICE:-cpu}
models=${MODELS:-gpt llama} probe=${PROBE:-16} batch=${BATCH:-8} train_steps=${TRAIN_STEPS:-30}
eig_top=${EIG_TOP:-3} eig_tol=${EIG_TOL:-1e-6} trace_hvps=${TRACE_HVPS:-99}
slq_runs=${SLQ_RUNS:-5} slq_steps=${SLQ_STEPS:-40}
if [ ! -x "$python" ]; then
  echo "peers.sh: no $python; run scripts/setup-bench.sh" >&2
  exit 1
fi
ours="$build/bench/peer_bench"
peer="$here/python/peer_bench.py"
# The same threads everywhere: ATen's intra-op pool, OpenMP and MKL.
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
mkdir -p "$work"
source "$here/measure.sh"

"$python" - "$here/python" "$work" "$models" "$probe" "$train_steps" <<'EOF'
import os, sys
import torch
sys.path.insert(0, sys.argv[1])
import peer_models
from safetensors.torch import save_file
work, models, probe, steps = sys.argv[2], sys.argv[3].split(), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
for name in models:
    d = os.path.join(work, name)
    if os.path.exists(os.path.join(d, "v.safetensors")):
        continue
    config = {"gpt": peer_models.GPT_CONFIG, "llama": peer_models.LLAMA_CONFIG}[name]
    n, loss = peer_models.make(config, os.path.join(d, "run"), os.path.join(d, "probe.safetensors"),
                               probe, steps)
    print(f"{name}: {n} parameters, probe loss {loss:.4f} after {steps} AdamW steps",
          file=sys.stderr)
    model, _ = peer_models.load(os.path.join(d, "run"), torch.float64, "cpu")
    g = torch.Generator().manual_seed(7)
    save_file({k: torch.randn(p.shape, generator=g, dtype=torch.float64)
               for k, p in model.named_parameters()}, os.path.join(d, "v.safetensors"))
EOF

# run NAME SIDE ARGS...: one measurement; WORK/MODEL/NAME.json (the program's) and NAME.mem
# ("wall_seconds peak_rss_kib minor_faults").
run() {
  local name=$1 side=$2
  shift 2
  local common=(--run "$dir/run" --data "$dir/probe.safetensors" --batch-size "$batch"
                --dtype "$dtype" --threads "$threads" --device "$device" --out "$dir/$name.json")
  echo "  $name" >&2
  if [ "$side" = libcurv ]; then
    measure "$dir/$name" "$ours" "${common[@]}" "$@" > "$dir/$name.mem"
  else
    measure "$dir/$name" "$python" "$peer" --side "$side" "${common[@]}" "$@" > "$dir/$name.mem"
  fi
}

sides=(libcurv curvlinops eigenthings)
for model in $models; do
  dir="$work/$model"
  echo "$model:" >&2
  if [ ! -f "$dir/reference.json" ]; then
    run reference libcurv --op eig --eig-top "$eig_top" --eig-tol 1e-10 --eig-bound residual \
      --eig-max-hvps 600 --seed 1000
  fi
  for side in "${sides[@]}"; do
    run "setup_$side" "$side" --op setup
  done
  for side in "${sides[@]}"; do
    run "hvp_$side" "$side" --op hvp --vector "$dir/v.safetensors" \
      --hvp-out "$dir/hv_$side.safetensors"
  done
  for side in "${sides[@]}"; do
    run "eig_$side" "$side" --op eig --eig-top "$eig_top" --eig-tol "$eig_tol"
  done
  run eig_libcurv_residual libcurv --op eig --eig-top "$eig_top" --eig-tol "$eig_tol" \
    --eig-bound residual
  if [ "$model" = gpt ]; then
    # curvlinops' forward-over-reverse HVP is inexact through nn.LayerNorm (peer_models.py):
    # the same model with LayerNorm written out, for the accuracy curvlinops gets then.
    run hvp_curvlinops_ln curvlinops --op hvp --vector "$dir/v.safetensors" \
      --hvp-out "$dir/hv_curvlinops_ln.safetensors" --explicit-layer-norm
    run eig_curvlinops_ln curvlinops --op eig --eig-top "$eig_top" --eig-tol "$eig_tol" \
      --explicit-layer-norm
  fi
  for method in hutchinson hutchpp; do
    for side in "${sides[@]}"; do
      run "trace_${method}_$side" "$side" --op trace --trace-method "$method" \
        --trace-hvps "$trace_hvps"
    done
  done
  for side in "${sides[@]}"; do
    run "density_$side" "$side" --op density --slq-runs "$slq_runs" --slq-steps "$slq_steps"
  done
done

EIG_TOL=$eig_tol "$python" "$here/python/peer_report.py" "$work" $models | tee "$work/report.md"
