"""Reading a ≥ 1B-parameter torch.distributed.checkpoint save: libcurv against dcp.load.

save (under torchrun, any number of ranks): writes OUT/step-0/, a LLaMA-shaped model of random
float32 weights (hidden 2048, 20 layers, 16 heads, 8 key-value heads, MLP 5632, vocabulary 32000:
1.07B parameters, 4.3 GB) sharded over the ranks (Shard(0), as FSDP2 shards) and saved by dcp.save
itself with FileSystemWriter's default format.

compare: in one invocation, alternately, REPEATS times each:
- libcurv: BENCH (dcp_read_bench) reads every tensor of the save into preallocated float32
  tensors, chunk by chunk (curv::DcpReader::read_into);
- torch: torch.distributed.checkpoint.load (no process group) into preallocated float32 tensors of
  the same shapes.
Each side runs in its own process; the destinations are allocated and written before the clock
starts, the peak resident set is reset there (/proc/self/clear_refs), and the peak the read adds
beyond the destinations is reported with the time. The page cache is warm after the save (the
file is read from memory by both).

usage: torchrun --nproc_per_node 2 dcp_read.py save OUT
       python dcp_read.py compare OUT BENCH [REPEATS] [THREADS]
"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HIDDEN, LAYERS, HEADS, KV, MLP, VOCAB = 2048, 20, 16, 8, 5632, 32000


def shapes():
    head = HIDDEN // HEADS
    out = {"tok_embeddings.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        out.update({p + "attention.wq.weight": (HIDDEN, HIDDEN),
                    p + "attention.wk.weight": (KV * head, HIDDEN),
                    p + "attention.wv.weight": (KV * head, HIDDEN),
                    p + "attention.wo.weight": (HIDDEN, HIDDEN),
                    p + "feed_forward.w1.weight": (MLP, HIDDEN),
                    p + "feed_forward.w2.weight": (HIDDEN, MLP),
                    p + "feed_forward.w3.weight": (MLP, HIDDEN),
                    p + "attention_norm.weight": (HIDDEN,),
                    p + "ffn_norm.weight": (HIDDEN,)})
    out.update({"norm.weight": (HIDDEN,), "output.weight": (VOCAB, HIDDEN)})
    return out


def save(out):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    state = {}
    for name, shape in shapes().items():
        rows = shape[0]
        per = (rows + world - 1) // world
        local_rows = max(0, min(per, rows - rank * per))
        local = torch.randn((local_rows,) + shape[1:], generator=g) * 0.02
        stride = tuple(int(torch.Size(shape[k + 1:]).numel()) for k in range(len(shape)))
        state[name] = DTensor.from_local(local, mesh, [Shard(0)], shape=torch.Size(shape),
                                         stride=stride)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(f"{out}/step-0"))
    dist.barrier()
    dist.destroy_process_group()


def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def torch_side(folder):
    """One dcp.load into preallocated float32 tensors; prints the RESULT line."""
    import torch.distributed.checkpoint as dcp
    state = {name: torch.zeros(shape) for name, shape in shapes().items()}
    dest = sum(t.numel() * t.element_size() for t in state.values())
    before = rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = time.perf_counter()
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    seconds = time.perf_counter() - start
    print(f"RESULT seconds={seconds:.3f} dest_bytes={dest} rss_before={before} "
          f"peak_extra={rss('VmHWM') - before} tensors={len(state)}")


def parse(line):
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return {k: float(v) for k, v in fields.items()}


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return parse(next(l for l in out.stdout.splitlines() if l.startswith("RESULT")))


def compare(out, bench, repeats, threads):
    folder = f"{out}/step-0"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    results = {"libcurv": [], "torch": []}
    for _ in range(repeats):
        results["libcurv"].append(run([bench, folder, "--threads", str(threads)], env))
        results["torch"].append(run([sys.executable, __file__, "torch-side", folder], env))
    summary = {"torch_version": torch.__version__, "threads": threads, "repeats": repeats,
               "parameters": sum(torch.Size(s).numel() for s in shapes().values())}
    for side, rows in results.items():
        dest = rows[0]["dest_bytes"]
        summary[side] = {
            "seconds_median": statistics.median(r["seconds"] for r in rows),
            "seconds_all": [r["seconds"] for r in rows],
            "dest_gb": dest / 1e9,
            "peak_extra_gb_max": max(r["peak_extra"] for r in rows) / 1e9,
            "peak_extra_over_dest": max(r["peak_extra"] for r in rows) / dest,
        }
    print(json.dumps(summary, indent=1))


def main():
    mode = sys.argv[1]
    if mode == "save":
        save(sys.argv[2])
    elif mode == "torch-side":
        torch_side(sys.argv[2])
    elif mode == "compare":
        repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
        threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
        compare(sys.argv[2], sys.argv[3], repeats, threads)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
