#!/usr/bin/env bash
# The oldest LibTorch 2.x the docs promise (docs/building.md#tested-versions), checked without the
# whole suite: installs torch VERSION (default 2.11.0, CURV_SMOKE_TORCH) into .venv-torch-VERSION,
# configures with the by-hand command of docs/building.md (the wheel's CMake folder alone on the
# prefix path), builds ndsprobe and compiles the [.cuda] tests, then runs ndsprobe on a nanoGPT
# run in float64 and compares it with torch.autograd of the same wheel
# (tests/python/make_torch_fixtures.py, tests/python/check_nanogpt_reference.py). Then installs
# the Python package against that torch from the same build folder and runs its tests that need
# no transformers (a CNN against torch.autograd). Needs what scripts/test.sh installs (Debian's
# packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="${1:-${CURV_SMOKE_TORCH:-2.11.0}}"
venv="$root/.venv-torch-$version"
build="${CURV_BUILD_DIR:-$root/build-torch-$version}"
jobs="${CURV_JOBS:-$(nproc)}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
python="${CURV_VENV_PYTHON:-python3}"
if [ ! -x "$venv/bin/python3" ]; then "$python" -m venv "$venv"; fi
"$venv/bin/python3" -m pip install -q --disable-pip-version-check "torch==$version" \
  "$(grep '^numpy==' "$root/scripts/requirements-pypi.txt")"
cmake_dir=$("$venv/bin/python3" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$cmake_dir" \
  -DCURV_BUILD_BENCH=OFF -DCURV_PYTHON=ON "-DCURV_PACKAGE_PYTHON=$venv/bin/python3" >/dev/null
targets=(ndsprobe _curv)
# The [.cuda] tests compile (they run on a GPU machine: bench/gpu_check.sh).
for object in cuda_test fused_kernels_cuda_test; do
  targets+=("tests/CMakeFiles/curv_tests.dir/$object.cpp.o")
done
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
"$root/scripts/check-torch-runtime.sh" "$build"
work="$build/smoke"
rm -rf "$work"
mkdir -p "$work"
"$venv/bin/python3" "$root/tests/python/make_torch_fixtures.py" "$work/fixtures" >/dev/null
"$build/tools/ndsprobe/ndsprobe" "$work/fixtures/nanogpt" --data "$work/fixtures/probe.safetensors" \
  --batch-size 4 --dtype float64 --no-realized --directions delta,gradient,adamw \
  -o "$work/nanogpt.h5" --quiet
/usr/bin/python3 "$root/tests/python/check_nanogpt_reference.py" "$work/nanogpt.h5" nanogpt 2 \
  "$work/fixtures/reference.json"
pins=()
for package in scikit-build-core pathspec packaging pandas python-dateutil tzdata pytest \
  iniconfig pluggy Pygments; do
  pins+=("$(grep -i "^$package==" "$root/scripts/requirements-pypi.txt")")
done
"$venv/bin/python3" -m pip install -q --disable-pip-version-check "${pins[@]}"
"$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -C "build-dir=$build" "$root"
(cd "$root/tests/python/package" &&
  "$venv/bin/python3" -m pytest -q -p no:cacheprovider test_audit.py -k cnn)
echo "torch $version: ndsprobe and the Python package build, link and match torch.autograd"
