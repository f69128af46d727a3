#!/usr/bin/env bash
# Checkpoint read time, libcurv against PyTorch on the same files, one after the other:
#   read    the files into host tensors: checkpoint_read_bench (curv::load_checkpoint, model
#           only, as ndsprobe) against bench/python/read_checkpoint.py (safetensors.torch.load_file
#           for .safetensors, torch.load for .pt/.bin; a nanoGPT file's 'model' taken out), as the
#           loader returns them: load_file's tensors lie on a lazily read mapping of the file;
#   owned   the same, torch's tensors then cloned: tensors owning their memory, as libcurv's are
#           (libcurv's row repeats its read);
#   onto the device, per device in DEVICES: libcurv reads, builds the model from the checkpoint's
#           config, converts and copies the weights into it (ndsprobe's way; the build, which
#           allocates the parameters without drawing them, is also given alone); Python reads
#           and copies every tensor to the device (Tensor.to(copy=True), no model); both until
#           the device finished.
# Each timing of each side runs in its own process, REPEATS times. Before the first repeat the
# checkpoint's files are dropped from the page cache (fdatasync + posix_fadvise DONTNEED; each
# program prints how much of the weights was still cached, "first_resident"), so the first repeat
# reads from the disk and every later one from a warm page cache: the table gives the first and
# the median of all repeats. Both sides get THREADS threads (--threads, OMP_NUM_THREADS).
#
# usage: bench/checkpoint_read.sh BUILD_DIR RUN_DIR
#   BUILD_DIR: holds bench/checkpoint_read_bench; RUN_DIR: a run directory or one checkpoint
#   (step_<N>/, checkpoint-<N>/, a .pt file's folder). Environment: DEVICES ("cpu"; "cpu cuda" on
#   a GPU), DTYPE (float32), REPEATS (5), THREADS (2), STEP (the last), LAYOUT (auto), MODEL (a
#   model config for checkpoints that record none), EVICT (first; none or each), PYTHON (python3:
#   torch, and safetensors for native checkpoints), BENCH (the program; default
#   BUILD_DIR/bench/checkpoint_read_bench), LOG_DIR (default RUN_DIR/../checkpoint_read).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 2 ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
build=$1 run=$2
bench=${BENCH:-$build/bench/checkpoint_read_bench}
python=${PYTHON:-python3}
devices=${DEVICES:-cpu} dtype=${DTYPE:-float32} repeats=${REPEATS:-5} threads=${THREADS:-2}
evict=${EVICT:-first}
logs=${LOG_DIR:-$(dirname "$run")/checkpoint_read}
mkdir -p "$logs"
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
ours=("$bench" "$run" --dtype "$dtype" --repeats "$repeats" --threads "$threads" --evict "$evict"
      --layout "${LAYOUT:-auto}")
[ -n "${STEP:-}" ] && ours+=(--step "$STEP")
[ -n "${MODEL:-}" ] && ours+=(--model "$MODEL")
theirs=("$python" "$here/python/read_checkpoint.py" --dtype "$dtype" --repeats "$repeats"
        --threads "$threads" --evict "$evict")

echo "== $(date -u +%FT%TZ) $(uname -n), $(getconf _NPROCESSORS_ONLN) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
# side NAME COMMAND...: runs one process, its output to the terminal and LOG_DIR/NAME.log.
side() {
  local name=$1
  shift
  echo "-- $name: $*"
  "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "-- $name: exit code $rc"
  return "$rc"
}

side libcurv_read "${ours[@]}" --mode read --device cpu
# The checkpoint libcurv chose, so that Python reads the same files.
ckpt=$(sed -n 's/^checkpoint \(.*\) (step .*/\1/p' "$logs/libcurv_read.log" | head -1)
if [ -z "$ckpt" ]; then
  echo "checkpoint_read.sh: checkpoint_read_bench named no checkpoint" >&2
  exit 1
fi
side torch_read "${theirs[@]}" "$ckpt" --mode read --device cpu
side torch_owned "${theirs[@]}" "$ckpt" --mode owned --device cpu
for device in $devices; do
  side "libcurv_model_$device" "${ours[@]}" --mode model --device "$device"
  side "torch_device_$device" "${theirs[@]}" "$ckpt" --mode device --device "$device"
done

# The table: RESULT key=value lines of both sides, paired by timing and device.
echo
echo "checkpoint $ckpt, $dtype, $threads thread(s), $repeats repeats; first: after the files were"
echo "dropped from the page cache (cached before it: libcurv / torch); median: of all repeats"
echo
{
  printf '| %s ' timing device MB "libcurv first (s)" "libcurv median (s)" \
    "of which model build (s)" "torch first (s)" "torch median (s)" "median libcurv / torch" \
    "GB/s median libcurv, torch" "cached before first"
  echo "|"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} | tee "$logs/table.md"
order=("$logs/libcurv_read.log" "$logs/torch_read.log" "$logs/torch_owned.log")
for device in $devices; do
  order+=("$logs/libcurv_model_$device.log" "$logs/torch_device_$device.log")
done
cat "${order[@]}" 2>/dev/null | grep '^RESULT ' | awk '
  { delete f; for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    w = f["what"] == "read" ? "read" : f["what"] == "owned" ? "read, owned" : "onto the device"
    d = (w == "onto the device") ? f["device"] : "host"
    put(w SUBSEP d, f)
    if (f["side"] == "libcurv" && w == "read") put("read, owned" SUBSEP d, f) }
  function put(k, f) {
    if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    first[k, f["side"]] = f["first_s"]; mid[k, f["side"]] = f["median_s"]
    if (f["side"] == "libcurv") build[k] = f["build_median_s"] + 0
    res[k, f["side"]] = f["first_resident"]; mb[k] = f["file_bytes"] / 1e6 }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, p, SUBSEP)
      lm = mid[k, "libcurv"]; tm = mid[k, "torch"]
      printf "| %s | %s | %.1f | %.4f | %.4f | %s | %.4f | %.4f | %s | %s | %s |\n", p[1], p[2],
        mb[k], first[k, "libcurv"], lm, (build[k] > 0 ? sprintf("%.4f", build[k]) : "-"),
        first[k, "torch"], tm,
        (lm > 0 && tm > 0) ? sprintf("%.2f", lm / tm) : "-",
        (lm > 0 && tm > 0) ? sprintf("%.2f, %.2f", mb[k] / 1e3 / lm, mb[k] / 1e3 / tm) : "-",
        res[k, "libcurv"] " / " res[k, "torch"]
    }
  }' | tee -a "$logs/table.md"
echo
echo "libcurv's onto-the-device time in phases (read + build the model + convert + copy)," \
  "median repeat:"
for device in $devices; do
  grep '^model repeat' "$logs/libcurv_model_$device.log" 2>/dev/null |
    sort -t: -k2 -g | awk -v d="$device" '{a[NR] = $0} END {if (NR) print "  " d ": " a[int((NR + 1) / 2)]}'
done
