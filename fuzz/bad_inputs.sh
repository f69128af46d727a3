#!/usr/bin/env bash
# Runs ndsprobe on damaged inputs and prints, per case, the exit status and the message: the
# table of docs/reliability.md#bad-inputs. Usage: fuzz/bad_inputs.sh BUILD_DIR [WORK_DIR]
set -uo pipefail
build="$(cd "${1:?usage: bad_inputs.sh BUILD_DIR [WORK_DIR]}" && pwd)"
work="${2:-$(mktemp -d)}"
nds="$build/tools/ndsprobe/ndsprobe"
here="$(cd "$(dirname "$0")/.." && pwd)"
export OMP_NUM_THREADS=1 ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
mkdir -p "$work" && cd "$work" || exit 1
# A good run to damage: the native two-checkpoint run of the interop tests and its probe set.
/usr/bin/python3 "$here/tests/python/make_torch_fixtures.py" fx >/dev/null || exit 1
rm -rf good && cp -r fx/native good && cp fx/probe.safetensors probe.safetensors
probe=(--data probe.safetensors --directions delta --quiet)
"$nds" good "${probe[@]}" -o good.h5 >/dev/null 2>&1 || { echo "good run failed"; exit 1; }

case_run() {  # NAME, then ndsprobe's arguments
  local name="$1"; shift
  local out; out="$("$nds" "$@" 2>&1 >/dev/null)"; local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(printf '%s' "$out" | grep -v '^==' | tail -1)"
}
copy() { rm -rf "$1"; cp -r good "$1"; }

case_run "no such directory" missing "${probe[@]}" -o o.h5
mkdir -p empty; case_run "no checkpoint in the directory" empty "${probe[@]}" -o o.h5
copy trunc; truncate -s 100 trunc/step_2/model.safetensors
case_run "model.safetensors cut short" trunc "${probe[@]}" -o o.h5
copy hdr; printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of=hdr/step_2/model.safetensors bs=1 conv=notrunc status=none
case_run "safetensors header length past the end" hdr "${probe[@]}" -o o.h5
copy offs; /usr/bin/python3 - offs/step_2/model.safetensors <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); k = next(k for k in h if k != "__metadata__")
h[k]["data_offsets"][1] += 4
t = json.dumps(h).encode(); t += b" " * (-len(t) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
case_run "safetensors tensor bytes do not match its shape" offs "${probe[@]}" -o o.h5
copy meta; echo '{"step": 2,' > meta/step_2/meta.json
case_run "meta.json not valid JSON" meta "${probe[@]}" -o o.h5
copy metatype; /usr/bin/python3 -c "import json,sys; p='metatype/step_2/meta.json'; d=json.load(open(p)); d['step']='two'; json.dump(d,open(p,'w'))"
case_run "meta.json step of the wrong type" metatype "${probe[@]}" -o o.h5
mkdir -p nano && echo 'not a zip' > nano/ckpt.pt
case_run "ckpt.pt not a torch.save zip" nano "${probe[@]}" -o o.h5
mkdir -p legacy && /usr/bin/python3 -c "import torch; torch.save({'iter_num': 1}, 'legacy/ckpt.pt', _use_new_zipfile_serialization=False)"
case_run "ckpt.pt in the legacy (pre-1.6) format" legacy "${probe[@]}" -o o.h5
mkdir -p evil && /usr/bin/python3 -c "
import os, torch
class E:
    def __reduce__(self): return (os.system, ('echo pwned',))
torch.save({'iter_num': E()}, 'evil/ckpt.pt')"
case_run "ckpt.pt whose pickle calls os.system" evil "${probe[@]}" -o o.h5
mkdir -p crc && /usr/bin/python3 -c "
import torch; torch.save({'iter_num': 1, 'model': {'w': torch.ones(64)}}, 'crc/ckpt.pt')
b = bytearray(open('crc/ckpt.pt','rb').read()); i = b.find(b'\x00\x00\x80\x3f'); b[i+3] ^= 1
open('crc/ckpt.pt','wb').write(b)"
case_run "ckpt.pt with a changed byte in a tensor record" crc "${probe[@]}" -o o.h5
mkdir -p hf/checkpoint-2 && cp good/step_2/model.safetensors hf/checkpoint-2/ && echo '[1, 2]' > hf/checkpoint-2/config.json
case_run "Hugging Face config.json not an object" hf "${probe[@]}" -o o.h5
mkdir -p hfi/checkpoint-2 && echo '{"weight_map": []}' > hfi/checkpoint-2/model.safetensors.index.json
case_run "model.safetensors.index.json without a weight_map object" hfi "${probe[@]}" -o o.h5
mkdir -p hft/checkpoint-2 && cp good/step_2/model.safetensors hft/checkpoint-2/ && echo '{"global_step": 3}' > hft/checkpoint-2/trainer_state.json
case_run "trainer_state.json global_step differs from the folder" hft "${probe[@]}" -o o.h5
printf 'abc' > odd.bin
case_run "token file with an odd number of bytes" good --data odd.bin --block-size 4 --examples 2 --directions delta --quiet -o o.h5
printf 'abcd' > short.bin
case_run "token file shorter than one window" good --data short.bin --block-size 4 --examples 2 --directions delta --quiet -o o.h5
/usr/bin/python3 -c "
import torch, struct, json
h = json.dumps({'inputs': {'dtype': 'I64', 'shape': [2, 3], 'data_offsets': [0, 48]}}).encode(); h += b' ' * (-len(h) % 8)
open('notargets.safetensors','wb').write(struct.pack('<Q', len(h)) + h + bytes(48))"
case_run "probe data without targets" good --data notargets.safetensors --directions delta --quiet -o o.h5
echo 'not hdf5' > noth5.h5
case_run "--resume on a file that is not HDF5" good "${probe[@]}" --resume -o noth5.h5
cp good.h5 other.h5 && /usr/bin/python3 -c "import h5py; f = h5py.File('other.h5', 'a'); f.attrs['dtype'] = 'float64'"
case_run "--resume on results of another dtype" good "${probe[@]}" --resume -o other.h5
cp "$here/tests/fuzz_regressions/h5/global_heap_loop.h5" heap.h5
case_run "--resume on a file with a corrupt global heap" good "${probe[@]}" --resume -o heap.h5
cp good.h5 cut.h5 && truncate -s 2000 cut.h5
case_run "--resume on a results file cut short" good "${probe[@]}" --resume -o cut.h5
# The run keeps its name (the folder's), so the resumed file's digest of step_2 applies.
rm -rf c && mkdir c && cp -r good c/good && cp good.h5 changed.h5 && /usr/bin/python3 -c "
b = bytearray(open('c/good/step_2/model.safetensors','rb').read()); b[-1] ^= 1
open('c/good/step_2/model.safetensors','wb').write(b)"
case_run "--resume after a checkpoint changed" c/good "${probe[@]}" --resume -o changed.h5
