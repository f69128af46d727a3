#!/usr/bin/env bash
# Set-up to result: installs the Debian dependencies and the pinned PyPI packages (transformers
# makes the Hugging Face fixtures), builds everything, runs the test suite, then builds and runs
# the examples against the installed library (find_package(curv)).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build}"
if [ "${CURV_SKIP_SETUP:-0}" != 1 ]; then
  "$root/scripts/setup-debian.sh"
  "$root/scripts/setup-pypi.sh"
fi
"$root/scripts/build.sh"

echo "== unit, numerical and end-to-end tests"
(cd "$build" && ctest --output-on-failure -j "$(nproc)")

echo "== examples built against the installed package"
prefix="$build/install"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$root/examples" -B "$build/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build/examples" -j "$(nproc)"
"$build/examples/custom_trainer/custom_trainer" --steps 20 --probe-every 10 \
  --output "$build/custom_trainer.h5"
/usr/bin/python3 - "$build/custom_trainer.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    rows = f["taylor"]["step"].shape[0]
    assert rows > 0, "the example's probe wrote no rows"
    print(f"example probe file: {rows} rows in /taylor")
PY
echo "all checks passed"
