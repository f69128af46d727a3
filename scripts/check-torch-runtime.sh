#!/usr/bin/env bash
# Checks that every program of a LibTorch 2.x build loads LibTorch's libraries and their own
# dependencies (NCCL, cuBLAS, cuDNN, the CUDA runtime, ...) from the LibTorch install it was built
# against (the wheel's torch/lib and nvidia/*/lib), never another copy on the machine (Debian's
# libc10.so.1.13, the CUDA toolkit's libnccl.so.2). Usage: check-torch-runtime.sh BUILD_DIR
# (docs/building.md#which-libtorch). Prints one line per program; exits non-zero naming the
# program, the library and where it was found.
set -euo pipefail
build="$1"
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
root=$(realpath "$torch_dir/../../..")
site=$(dirname "$root")
status=0
checked=0
while IFS= read -r program; do
  if [ "$(head -c 4 "$program" | tr -d '\0')" != $'\x7fELF' ]; then continue; fi
  checked=$((checked + 1))
  # "libnccl.so.2 => /path/libnccl.so.2 (0x...)": LibTorch's libraries and NVIDIA's.
  while read -r name path; do
    real=$(realpath "$path")
    case "$real" in
      "$root"/* | "$site"/nvidia/*) ;;
      *)
        echo "$program: $name loads from $real, outside $root and $site/nvidia" >&2
        status=1
        ;;
    esac
  done < <(ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
    grep -E '^lib(torch|c10|nccl|cublas|cudnn|cusparse|cufft|curand|cusolver|nvrtc|nvshmem|cufile|cudart)')
done < <(find "$build/tools" "$build/tests" "$build/bench" -maxdepth 2 -type f -perm -u+x \
  ! -name '*.so*' ! -name '*.sh' 2>/dev/null | sort)
if [ "$checked" -eq 0 ]; then
  echo "no programs found in $build" >&2
  exit 1
fi
if [ "$status" -eq 0 ]; then
  echo "$checked programs load LibTorch and its dependencies from $root and $site/nvidia"
fi
exit "$status"
