#!/usr/bin/env bash
# Installs every dependency of libcurv / ndsprobe from Debian 12's packages.
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libeigen3-dev libspectra-dev libhdf5-dev libfmt-dev catch2
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  # gloo's headers, for c10d's ProcessGroupGloo (data parallelism under torchrun)
  libgloo-dev
  # the ctest clang_format checks every source against .clang-format
  clang-format
  # the ASan + UBSan stage and the libFuzzer harnesses (scripts/sanitize.sh, scripts/fuzz.sh)
  clang libclang-rt-14-dev
  # torch must not run on the netlib reference BLAS (~5 GFLOP/s); the OpenMP build of OpenBLAS
  # shares ATen's OpenMP threads, the pthread build fights them (~2.5x slower on 2 cores).
  libopenblas0-openmp
  # a virtual environment for the pinned PyPI packages (scripts/setup-pypi.sh)
  python3-venv
  python3-torch python3-h5py python3-matplotlib python3-pandas python3-numpy
  jupyter-nbconvert python3-ipykernel python3-nbformat
)

sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
# Make sure BLAS resolves to OpenBLAS's OpenMP build even if another provider was installed.
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
  lib=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-openmp || true)
  if [ -n "$lib" ]; then $sudo update-alternatives --set "$alt" "$lib" >/dev/null; fi
done
