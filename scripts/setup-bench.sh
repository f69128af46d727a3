#!/usr/bin/env bash
# Makes .venv-bench: the peers of bench/peers.sh (curvlinops-for-pytorch, hessian-eigenthings;
# scripts/requirements-bench.txt) on top of the torch of .venv (scripts/setup-pypi.sh), which a
# .pth file puts on its path, so that the peers and the LibTorch build of scripts/build-torch2.sh
# run the same torch 2.11.0 wheel. About 175 MB, under a minute with a warm pip cache. Idempotent.
# CURV_VENV (default .venv) and CURV_BENCH_VENV (default .venv-bench) override the folders.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base="${CURV_VENV:-$root/.venv}"
venv="${CURV_BENCH_VENV:-$root/.venv-bench}"
if [ ! -x "$base/bin/python3" ]; then
  echo "setup-bench.sh: no $base/bin/python3; run scripts/setup-pypi.sh first" >&2
  exit 1
fi
base_python=$(readlink -f "$base/bin/python3")
if [ ! -x "$venv/bin/python3" ]; then
  "$base_python" -m venv "$venv"
fi
# The base venv's site-packages (torch, numpy, safetensors, tqdm) after the bench venv's own.
site=$("$venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$base/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  > "$site/curv_base_venv.pth"
# --no-deps: every dependency is pinned in the file; pip's resolver would otherwise replace torch.
"$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-deps \
  -r "$root/scripts/requirements-bench.txt"
"$venv/bin/python3" -c '
from importlib.metadata import version
import torch, scipy, curvlinops, hessian_eigenthings
print(torch.__file__ + ": " + ", ".join(f"{p} {version(p)}" for p in
      ("torch", "scipy", "curvlinops-for-pytorch", "hessian-eigenthings")))'
