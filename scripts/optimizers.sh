#!/usr/bin/env bash
# The optimizer comparison study (docs/reproduction.md#optimizers): the steps of
# scripts/reproduce.sh (sweep, seeds, ndsprobe on every run's own rebuilt update) for AdamW, Muon,
# SOAP, Shampoo, Adafactor and Schedule-Free AdamW on the demo's 4-layer LLaMA, at s = 0 and 1,
# probed with layer blocks; tools/python/optimizers_summary.py writes OUT/summary.md,
# OUT/summary.json and the plots: each optimizer's NDS over training with its standard errors,
# its validation loss and ρ_within. Resumable as reproduce.sh is.
# Settings (environment): CURV_OPTIMIZERS_DIR (out/optimizers), CURV_OPTIMIZERS_STEPS (500),
# CURV_OPTIMIZERS_SEEDS ("0 1 2"), CURV_OPTIMIZERS_EXPONENTS ("0 1"), CURV_OPTIMIZERS_LIST (the six
# above, AdamW first), and reproduce.sh's CURV_REPRO_CHECKPOINTS, CURV_REPRO_MODEL,
# CURV_REPRO_JOBS, CURV_BUILD_DIR, CURV_SKIP_BUILD.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CURV_REPRO_DIR="${CURV_OPTIMIZERS_DIR:-$root/out/optimizers}"
export CURV_REPRO_STEPS="${CURV_OPTIMIZERS_STEPS:-500}"
export CURV_REPRO_SEEDS="${CURV_OPTIMIZERS_SEEDS:-0 1 2}"
export CURV_REPRO_EXPONENTS="${CURV_OPTIMIZERS_EXPONENTS:-0 1}"
export CURV_REPRO_OPTIMIZERS="${CURV_OPTIMIZERS_LIST:-adamw muon soap shampoo adafactor adamw-schedulefree}"
export CURV_REPRO_BLOCKS=layer CURV_REPRO_CONTROL=0
export CURV_REPRO_SUMMARY="$root/tools/python/optimizers_summary.py"
exec "$root/scripts/reproduce.sh"
