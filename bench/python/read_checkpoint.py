"""The Python side of bench/checkpoint_read.sh: the same checkpoint files as
checkpoint_read_bench reads, by torch.load (.pt, .bin) or safetensors.torch.load_file
(.safetensors), as a PyTorch user reads them.

  read_checkpoint.py PATH [--step N] [--mode all] [--device cpu] [--dtype float32]
                     [--repeats 5] [--threads 2] [--evict first]

PATH: a checkpoint (a step_<N>/ or checkpoint-<N>/ folder, a .pt file) or a run directory (then
the last native step_<N>/, else the ckpt*.pt, step_<N>.pt or checkpoint-<N>/ with the largest N;
--step N picks one). Three timings (--mode all, or one of them):
  read    the files into host tensors as the loader returns them (a nanoGPT file's 'model' dict
          taken out of it). safetensors.torch.load_file returns tensors on a private mapping of
          the file, whose pages are read only when first touched; torch.load reads every byte;
  owned   read, then every tensor cloned: host tensors that own their memory, as libcurv's
          reader returns them (it copies out of its mapping);
  device  read, then every tensor converted to --dtype (floating ones) and copied to --device
          (Tensor.to(copy=True): a copy on the CPU too), timed until torch.cuda.synchronize()
          returned. No model is built: libcurv's "model" timing builds one as well (its build time
          is printed separately).
--evict first|each|none drops the files from the page cache (fsync, then posix_fadvise
DONTNEED) before the first or every repeat of each timing; the page cache is warm after the
first repeat. One line per repeat, then the first and the median of all repeats and one "RESULT"
line per timing.

  read_checkpoint.py --export-nanogpt STEP_DIR OUT_DIR
writes a native step_<N>/ folder (model.safetensors, optimizer.safetensors of AdamW, meta.json) as
nanoGPT's OUT_DIR/ckpt.pt: 'model' (lm_head.weight tied to transformer.wte.weight), 'optimizer'
(AdamW's state_dict, nanoGPT's two groups: ndim >= 2 decayed, the rest not, each in nanoGPT's
module order), 'model_args', 'iter_num', 'best_val_loss', 'config'.
"""
import argparse
import ctypes
import json
import mmap
import os
import re
import statistics
import sys
import time

import torch


def load_safetensors(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        sys.exit(f"read_checkpoint.py: {path} needs the safetensors package "
                 f"({sys.executable} has none; use the venv's python3)")
    return load_file(path)


LOADERS = set()  # what read() used, for the report


def torch_load(path):
    # weights_only: no code runs, as libcurv's reader. torch 1.13's restricted unpickler lacks
    # opcodes nanoGPT files use (BINFLOAT): then the full unpickler, named in the output.
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        LOADERS.add("torch.load(weights_only=True)")
    except Exception as e:  # noqa: BLE001 - pickle.UnpicklingError, or RuntimeError in 2.x
        if "weights_only" not in str(e) and "Weights only" not in str(e):
            raise
        loaded = torch.load(path, map_location="cpu", weights_only=False)
        LOADERS.add("torch.load(weights_only=False)")
    return loaded


def step_of(name):
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def choose(path, step):
    """The checkpoint PATH names, or the one of run directory PATH that --step selects."""
    if os.path.isfile(path) or weight_files(path):
        return path
    entries = sorted(os.listdir(path))
    native = [e for e in entries if re.fullmatch(r"step_\d+", e)
              and os.path.isfile(os.path.join(path, e, "model.safetensors"))]
    others = [e for e in entries if re.fullmatch(r"ckpt(_.*)?\.pt|step_\d+\.pt", e)
              or (re.fullmatch(r"checkpoint-\d+", e) and weight_files(os.path.join(path, e)))]
    found = native or others
    if step is not None:
        found = [e for e in found if step_of(e) == step]
    if not found:
        sys.exit(f"read_checkpoint.py: no checkpoint in {path}"
                 + (f" at step {step}" if step is not None else ""))
    return os.path.join(path, max(found, key=step_of))


def weight_files(folder):
    """The files a model-only read takes its tensors from (as checkpoint_read_bench)."""
    if not os.path.isdir(folder):
        return [folder]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(folder, name)):
            return [os.path.join(folder, name)]
    return [os.path.join(folder, e) for e in sorted(os.listdir(folder))
            if re.fullmatch(r"model-.*\.safetensors|pytorch_model-.*\.bin", e)]


def read(checkpoint):
    """The model tensors by name, on the CPU."""
    tensors = {}
    for f in weight_files(checkpoint):
        if f.endswith(".safetensors"):
            loaded = load_safetensors(f)
            LOADERS.add("safetensors.torch.load_file")
        else:
            loaded = torch_load(f)
        if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
            loaded = loaded["model"]  # nanoGPT: the optimizer state is read and dropped
        tensors.update(loaded)
    return tensors


def to_device(tensors, device, dtype):
    out = {k: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype, copy=True)
           for k, t in tensors.items()}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def all_files(checkpoint):
    if os.path.isfile(checkpoint):
        return [checkpoint]
    return [os.path.join(checkpoint, e) for e in sorted(os.listdir(checkpoint))
            if os.path.isfile(os.path.join(checkpoint, e))]


def evict(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(files):
    """The fraction of the files' pages in the page cache (mincore), -1 if unknown."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        page = os.sysconf("SC_PAGE_SIZE")
        pages = resident = 0
        for f in files:
            size = os.path.getsize(f)
            if size == 0:
                continue
            fd = os.open(f, os.O_RDONLY)
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            os.close(fd)
            if addr in (None, ctypes.c_void_p(-1).value):
                return -1.0
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            ok = libc.mincore(addr, size, vec) == 0
            libc.munmap(addr, size)
            if not ok:
                return -1.0
            pages += len(vec.raw)
            resident += sum(b & 1 for b in vec.raw)
        return resident / pages if pages else -1.0
    except (OSError, AttributeError):
        return -1.0


def time_mode(mode, a, checkpoint, device, dtype):
    files, weights = all_files(checkpoint), weight_files(checkpoint)
    file_bytes = sum(os.path.getsize(f) for f in weights)
    times, first_resident, tensor_bytes = [], -1.0, 0
    for r in range(a.repeats):
        if a.evict == "each" or (a.evict == "first" and r == 0):
            evict(files)
        resident = resident_fraction(weights)
        if r == 0:
            first_resident = resident
        start = time.perf_counter()
        tensors = read(checkpoint)
        if mode == "owned":
            tensors = {k: t.clone() for k, t in tensors.items()}
        elif mode == "device":
            tensors = to_device(tensors, device, dtype)
        times.append(time.perf_counter() - start)
        tensor_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
        seconds = times[-1]
        print(f"{mode:<6} repeat {r + 1}: {seconds:.4f} s, {file_bytes / seconds / 1e9:.2f} GB/s "
              f"({100 * resident:.0f}% in page cache before)", flush=True)
    first, mid = times[0], statistics.median(times)
    print(f"{mode:<6} first {first:.4f} s ({file_bytes / first / 1e9:.2f} GB/s), "
          f"median {mid:.4f} s ({file_bytes / mid / 1e9:.2f} GB/s) of {len(times)} repeats")
    print(f"RESULT side=torch what={mode} device={a.device} dtype={a.dtype} repeats={len(times)} "
          f"first_s={first:.6f} median_s={mid:.6f} min_s={min(times):.6f} file_bytes={file_bytes} "
          f"tensor_bytes={tensor_bytes} first_resident={first_resident:.3f} evict={a.evict} "
          f"loader={'+'.join(sorted(LOADERS))}",
          flush=True)


NANOGPT_ORDER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def nanogpt_rank(name):
    """Position of a parameter in nanoGPT's named_parameters()."""
    head = {"transformer.wte.weight": 0, "transformer.wpe.weight": 1}
    if name in head:
        return (head[name], 0, 0)
    m = re.fullmatch(r"transformer\.h\.(\d+)\.(.*)", name)
    if m and m.group(2) in NANOGPT_ORDER:
        return (2, int(m.group(1)), NANOGPT_ORDER.index(m.group(2)))
    return (3, 0, name)


def export_nanogpt(step_dir, out_dir):
    """A native step_<N>/ folder of an AdamW run as nanoGPT's ckpt.pt."""
    meta = json.load(open(os.path.join(step_dir, "meta.json")))
    model = load_safetensors(os.path.join(step_dir, "model.safetensors"))
    state = load_safetensors(os.path.join(step_dir, "optimizer.safetensors"))
    names = sorted(model, key=nanogpt_rank)
    groups = [[n for n in names if model[n].dim() >= 2], [n for n in names if model[n].dim() < 2]]
    order = groups[0] + groups[1]
    hyper, step = meta["optimizer"]["hyper"], meta["step"]
    adam = {}
    for i, n in enumerate(order):
        adam[i] = {"step": torch.tensor(float(step)), "exp_avg": state[n + ".exp_avg"],
                   "exp_avg_sq": state[n + ".exp_avg_sq"]}
    param_groups, first = [], 0
    for g, decay in zip(groups, (hyper.get("weight_decay", 0.1), 0.0)):
        param_groups.append({"lr": hyper.get("lr", 1e-3), "betas": (hyper.get("beta1", 0.9),
                             hyper.get("beta2", 0.95)), "eps": hyper.get("eps", 1e-8),
                             "weight_decay": decay, "amsgrad": False, "maximize": False,
                             "foreach": None, "capturable": False, "differentiable": False,
                             "fused": None, "params": list(range(first, first + len(g)))})
        first += len(g)
    sd = dict((n, model[n]) for n in names)
    if "lm_head.weight" not in sd and "transformer.wte.weight" in sd:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied: one storage, as nanoGPT saves
    cfg = meta["model"]
    model_args = {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias",
                                      "vocab_size") if k in cfg}
    model_args["dropout"] = 0.0
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"model": sd, "optimizer": {"state": adam, "param_groups": param_groups},
                "model_args": model_args, "iter_num": step, "best_val_loss": torch.tensor(9.0),
                "config": {"exported_from": step_dir}}, os.path.join(out_dir, "ckpt.pt"))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?")
    p.add_argument("--step", type=int)
    p.add_argument("--mode", choices=["read", "owned", "device", "all"], default="all")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--evict", choices=["first", "each", "none"], default="first")
    p.add_argument("--export-nanogpt", nargs=2, metavar=("STEP_DIR", "OUT_DIR"))
    a = p.parse_args()
    if a.export_nanogpt:
        export_nanogpt(*a.export_nanogpt)
        return
    if not a.path:
        p.error("PATH is required")
    a.repeats = max(1, a.repeats)
    torch.set_num_threads(a.threads)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # CUDA's start-up stays outside every clock
        torch.cuda.synchronize(device)
    checkpoint = choose(a.path, a.step)
    weights = weight_files(checkpoint)
    try:
        from safetensors import __version__ as st_version
    except ImportError:
        st_version = "none"
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, safetensors {st_version}, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"checkpoint {checkpoint}: {os.path.basename(weights[0]) if weights else '?'}"
          f"{' and more' if len(weights) > 1 else ''}, "
          f"{sum(os.path.getsize(f) for f in weights) / 1e6:.1f} MB to read; to {a.dtype} on "
          f"{a.device}", flush=True)
    for mode in ("read", "owned", "device"):
        if a.mode in (mode, "all"):
            time_mode(mode, a, checkpoint, device, dtype)


if __name__ == "__main__":
    main()
