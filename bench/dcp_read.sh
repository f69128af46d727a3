#!/usr/bin/env bash
# Reading a ≥ 1B-parameter torch.distributed.checkpoint save onto a model's tensors: libcurv
# (bench/dcp_read_bench: curv::DcpReader, chunk by chunk into the destinations) against
# torch.distributed.checkpoint.load into tensors of the same shapes, side by side in one
# invocation (bench/python/dcp_read.py). The save is written first by dcp.save itself on RANKS
# CPU ranks (FSDP2's Shard(0) sharding, random float32 weights, 1.07B parameters, 4.3 GB).
#
# usage: bench/dcp_read.sh BUILD_DIR WORK_DIR
#   Environment: PYTHON (.venv/bin/python3: the pinned torch), RANKS (2), REPEATS (3),
#   THREADS (2). The save is kept in WORK_DIR/step-0 and reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
build=$1 work=$2
python=${PYTHON:-$here/../.venv/bin/python3}
mkdir -p "$work"
if [ ! -f "$work/step-0/.metadata" ]; then
  OMP_NUM_THREADS=1 "$python" -m torch.distributed.run --standalone \
    --nproc_per_node "${RANKS:-2}" "$here/python/dcp_read.py" save "$work"
fi
"$python" "$here/python/dcp_read.py" compare "$work" "$build/bench/dcp_read_bench" \
  "${REPEATS:-3}" "${THREADS:-2}"
