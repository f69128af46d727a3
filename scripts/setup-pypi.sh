#!/usr/bin/env bash
# Installs the pinned PyPI packages of scripts/requirements-pypi.txt into a virtual environment
# (default: .venv in the checkout; CURV_VENV overrides): torch 2.x, whose wheel carries the
# LibTorch 2.x that scripts/build-torch2.sh builds against, and transformers, which makes the
# test suite's Hugging Face fixtures. Idempotent; about 5 GB, most of it torch's CUDA libraries.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CURV_VENV:-$root/.venv}"
python="${CURV_VENV_PYTHON:-python3}"
if [ ! -x "$venv/bin/python3" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python3" -m pip install -q --disable-pip-version-check -r "$root/scripts/requirements-pypi.txt"
"$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-deps \
  -r "$root/scripts/requirements-pypi-nodeps.txt"
"$venv/bin/python3" -c 'import torch, transformers; print(f"{torch.__file__}: torch {torch.__version__}, transformers {transformers.__version__}")'
