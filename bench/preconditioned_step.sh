#!/usr/bin/env bash
# Rebuilt SOAP and Kron steps against one HVP at GPT-2 small's shape (the built-in GPT, 124M
# parameters, float32), side by side in one invocation on the same device and BLAS: AdamW's,
# SOAP's and Kron's step rebuilt from their saved state (bench/preconditioned_step_bench), then
# hvp_bench's first HVP (graph built) and reused HVP on 4 sequences of 256 tokens. An HVP's cost
# grows at least linearly in the tokens, so 8 × 1024 tokens cost at least 8 times the HVP
# measured here.
#
# usage: bench/preconditioned_step.sh BUILD_DIR
#   Environment: THREADS (2).
set -euo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
build=$1 threads=${THREADS:-2}
for rule in adamw soap kron; do
  "$build/bench/preconditioned_step_bench" --rule "$rule" --threads "$threads"
done
for op in hvp_first hvp_reused; do
  "$build/bench/hvp_bench" --op "$op" --shape gpt2 --dtype float32 --repeats 1 --threads "$threads"
done
