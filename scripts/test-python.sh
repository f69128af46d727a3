#!/usr/bin/env bash
# The Python package (docs/python.md, python/): `pip install --no-build-isolation .` into the
# virtual environment, reusing the LibTorch 2.x build folder of scripts/test-torch2.sh (only the
# extension module is compiled, and that folder already built it), then its tests (pytest)
# against torch.autograd, the optimizers' own steps and a real transformers Trainer.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build-torch2}"
venv="${CURV_VENV:-$root/.venv}"
"$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -C "build-dir=$build" "$root"
cd "$root/tests/python/package"
CURV_NDSPROBE="$build/tools/ndsprobe/ndsprobe" CURV_CURVTRAIN="$build/tools/curvtrain/curvtrain" \
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
  "$venv/bin/python3" -m pytest -q -p no:cacheprovider
