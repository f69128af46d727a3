"""Writes PyTorch checkpoints with Debian's torch for the interop tests, and the curvature numbers
torch.autograd computes on them.

Usage: make_torch_fixtures.py OUT_DIR

OUT_DIR receives
  reader/values.pt          an OrderedDict of every storage dtype, views with offsets and strides,
                            tensors sharing one storage, a Parameter, nested containers, scalars
  reader/expected.safetensors  the same tensors, contiguous, written by hand (bfloat16 as bits)
  reader/values_p4.pt       the same saved with pickle protocol 4
  reader/damaged/*.pt       values.pt with its pickle cut short or one byte changed
  reader/deep.pt, cyclic.pt a tuple nested 10^6 deep; a self-containing list as a storage id
  reader/legacy.pt, evil.pt, evil_p4.pt, corrupt.pt, short_storage.pt, big_endian.pt   bad inputs
  probe.safetensors         inputs/targets (int64) of the probe set
  native/step_{2,3}/        the run below in libcurv's layout
  nanogpt/ckpt_{2,3}.pt     the same run as nanoGPT saves it (model, optimizer, model_args, ...)
  compiled/ckpt.pt, ckpt_3.pt   the same with torch.compile's "_orig_mod." prefix
  hf/checkpoint-{2,3}/      Hugging Face Trainer folders (pytorch_model.bin / model.safetensors,
                            optimizer.pt, trainer_state.json)
  hf_sharded/checkpoint-{2,3}/  the weights in two safetensors shards with their index
  pt/step_{2,3}.pt          bare OrderedDict state dicts
  pt_half/, native_half/    the weights rounded to bfloat16 (matrices) and float16 (vectors)
  other_optimizer/ckpt.pt   the model with the optimizer state of a wider model
  misnamed/step_2.pt        a state dict with one parameter name misspelt
  named_optimizer/step_1.pt an optimizer over the parameters in reverse order with param_names,
                            and named_optimizer_expected.safetensors, its state by name
  ambiguous/step_1.pt       optimizer state whose shapes fit two parameter orders
  reference.json            loss, g.u, u'Hu and NDS at step 2 for u = delta, the AdamW step, -g
  nanogpt_nobias/ckpt.pt, reference_nobias.json   the same for a nanoGPT without biases
  muon/ckpt.pt, reference_muon.json   a nanoGPT trained with MuonWithAuxAdam; its rebuilt step
  hvp_delta.safetensors     u = delta ("u.<param>") and H u ("hu.<param>") at step 2
"""
import collections
import copy
import json
import math
import os
import struct
import sys
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(n_layer=2, n_head=2, n_embd=8, block_size=6, bias=True, vocab_size=11, dropout=0.0)
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


# --- a compact nanoGPT (same module structure, names and numerics as karpathy/nanoGPT model.py,
# --- with the non-flash attention path, so the causal mask is a buffer named attn.bias)

class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]
        T = c["block_size"]
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(c["dropout"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], c["bias"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        for n, p in self.named_parameters():
            # Small random values everywhere (gains and biases too), so no term is trivially 0.
            nn.init.normal_(p, mean=1.0 if n.endswith("ln_1.weight") or n.endswith("ln_2.weight")
                            or n.endswith("ln_f.weight") else 0.0, std=0.2)

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self):
        params = {pn: p for pn, p in self.named_parameters()}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": HYPER["weight_decay"]},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"])


# --- Keller Jordan's MuonWithAuxAdam (github.com/KellerJordan/Muon), with Newton-Schulz in the
# --- parameters' dtype (the original runs it in bfloat16) so that float64 runs compare exactly

def newton_schulz(g, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    transposed = g.size(-2) > g.size(-1)
    if transposed:
        x = x.mT
    for _ in range(steps):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    return x.mT if transposed else x


class MuonWithAuxAdam(torch.optim.Optimizer):
    def __init__(self, groups):
        for g in groups:
            if g["use_muon"]:
                g.setdefault("lr", 0.02)
                g.setdefault("momentum", 0.95)
                g.setdefault("weight_decay", 0)
            else:
                g.setdefault("lr", 3e-4)
                g.setdefault("betas", (0.9, 0.95))
                g.setdefault("eps", 1e-10)
                g.setdefault("weight_decay", 0)
        super().__init__(groups, dict())

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if group["use_muon"]:
                    if not state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buf = state["momentum_buffer"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    update = p.grad.lerp(buf, group["momentum"])
                    update = newton_schulz(update) * max(1, p.size(-2) / p.size(-1)) ** 0.5
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(update, alpha=-group["lr"])
                else:
                    if not state:
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                        state["step"] = 0
                    state["step"] += 1
                    b1, b2 = group["betas"]
                    state["exp_avg"].lerp_(p.grad, 1 - b1)
                    state["exp_avg_sq"].lerp_(p.grad.square(), 1 - b2)
                    m = state["exp_avg"] / (1 - b1 ** state["step"])
                    v = state["exp_avg_sq"] / (1 - b2 ** state["step"])
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(m / (v.sqrt() + group["eps"]), alpha=-group["lr"])


def muon_groups(model):
    hidden = [p for n, p in model.named_parameters() if p.ndim >= 2 and ".h." in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and ".h." in n)]
    return [{"params": hidden, "use_muon": True, "lr": 0.05, "weight_decay": 0.01},
            {"params": rest, "use_muon": False, "lr": 3e-3, "betas": (0.9, 0.95),
             "weight_decay": 0.02}]


# --- files

ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
             torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
             torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def native_step(folder, model, optimizer, step):
    os.makedirs(folder, exist_ok=True)
    names = {id(p): n for n, p in model.named_parameters()}
    opt_tensors, groups = {}, []
    for group in optimizer.param_groups:
        groups.append({"params": [names[id(p)] for p in group["params"]],
                       "hyper": hyper_of(group)})
        for p in group["params"]:
            for key in ("exp_avg", "exp_avg_sq"):
                opt_tensors[f"{names[id(p)]}.{key}"] = optimizer.state[p][key]
    step_count = int(optimizer.state[next(iter(model.parameters()))]["step"])
    meta = {"step": step,
            "optimizer": {"name": "adamw", "hyper": groups[0]["hyper"], "step_count": step_count,
                          "param_groups": groups},
            "model": {"arch": "gpt", "tied": True,
                      **{k: CONFIG[k] for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                "bias", "vocab_size")}}}
    save_safetensors(f"{folder}/optimizer.safetensors", opt_tensors)
    with open(f"{folder}/meta.json", "w") as f:
        json.dump(meta, f)
    save_safetensors(f"{folder}/model.safetensors", dict(model.named_parameters()))


def hyper_of(group):
    return {"lr": group["lr"], "beta1": group["betas"][0], "beta2": group["betas"][1],
            "eps": group["eps"], "weight_decay": group["weight_decay"]}


def nanogpt_ckpt(model, optimizer, step, prefix=""):
    sd = collections.OrderedDict((prefix + k, v) for k, v in model.state_dict().items())
    return {"model": sd, "optimizer": optimizer.state_dict(), "model_args": dict(CONFIG),
            "iter_num": step, "best_val_loss": torch.tensor(3.25),
            "config": {"batch_size": 4, "dtype": "float64", "compile": bool(prefix)}}


def rewrite_zip(src, dst, edit):
    """Copies a torch.save archive entry by entry (stored, uncompressed), edit(name, bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, edit(info.filename, zin.read(info.filename)))


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def reader_fixtures(out):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    base = torch.randn(24, generator=g, dtype=torch.float64)
    values = collections.OrderedDict()
    values["f64"] = torch.randn(2, 3, generator=g, dtype=torch.float64)
    values["f32"] = torch.randn(3, generator=g)
    values["f16"] = torch.randn(2, 2, generator=g).half()
    values["bf16"] = torch.randn(5, generator=g).bfloat16()
    values["i64"] = torch.tensor([-(2 ** 40), 7, 0])
    values["i32"] = torch.tensor([-5, 6], dtype=torch.int32)
    values["i16"] = torch.tensor([-300, 301], dtype=torch.int16)
    values["i8"] = torch.tensor([-7, 8], dtype=torch.int8)
    values["u8"] = torch.tensor([0, 255], dtype=torch.uint8)
    values["bool"] = torch.tensor([True, False, True])
    values["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    # Views of one storage: an offset slice, a transpose (strides), a single element.
    values["shared_slice"] = base[2:8].view(2, 3)
    values["shared_t"] = base.view(4, 6).t()
    values["shared_elem"] = base[17]
    values["param"] = nn.Parameter(torch.randn(2, 2, generator=g, dtype=torch.float64))
    values["empty"] = torch.zeros(0, 3)
    expected = {k: v.detach().clone() for k, v in values.items()}
    nested = {"tensors": values, "ints": [1, -2, 2 ** 40, -(2 ** 62)], "float": 0.1, "text": "ünï",
              "none": None, "flags": (True, False), "deep": {"a": [{"b": torch.ones(2)}]}}
    torch.save(nested, f"{out}/values.pt")
    save_safetensors(f"{out}/expected.safetensors", expected)
    torch.save(values, f"{out}/legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({"payload": Evil(f"{out}/pwned")}, f"{out}/evil.pt")
    data = open(f"{out}/values.pt", "rb").read()
    open(f"{out}/corrupt.pt", "wb").write(data[: len(data) // 2])
    rewrite_zip(f"{out}/values.pt", f"{out}/short_storage.pt",
                lambda name, b: b[: len(b) // 2] if "/data/" in name else b)
    # Damaged pickles: cut short at many points, or with one byte changed.
    os.makedirs(f"{out}/damaged", exist_ok=True)
    pickle_bytes = zipfile.ZipFile(f"{out}/values.pt").read("values/data.pkl")
    rng = torch.Generator().manual_seed(11)
    for k in range(60):
        cut = (k * len(pickle_bytes)) // 60
        rewrite_zip(f"{out}/values.pt", f"{out}/damaged/cut_{k}.pt",
                    lambda name, b: b[:cut] if name.endswith("data.pkl") else b)
        at = int(torch.randint(0, len(pickle_bytes), (1,), generator=rng))
        value = int(torch.randint(0, 256, (1,), generator=rng))
        flipped = pickle_bytes[:at] + bytes([value]) + pickle_bytes[at + 1:]
        rewrite_zip(f"{out}/values.pt", f"{out}/damaged/flip_{k}.pt",
                    lambda name, b: flipped if name.endswith("data.pkl") else b)

    # A tuple nested a million levels deep (NONE, then TUPLE1 again and again), and a list that
    # holds itself, given as a malformed storage reference so that the error message renders it.
    deep = b"\x80\x02N" + b"\x85" * 1_000_000 + b"."
    rewrite_zip(f"{out}/values.pt", f"{out}/deep.pt",
                lambda name, b: deep if name.endswith("data.pkl") else b)
    cyclic = b"\x80\x02]q\x00h\x00a" + b"Q."  # L = []; L.append(L); persistent id L
    rewrite_zip(f"{out}/values.pt", f"{out}/cyclic.pt",
                lambda name, b: cyclic if name.endswith("data.pkl") else b)

    # Protocol 4 (FRAME, MEMOIZE, STACK_GLOBAL, SHORT_BINUNICODE) reads the same.
    torch.save(nested, f"{out}/values_p4.pt", pickle_protocol=4)
    torch.save({"payload": Evil(f"{out}/pwned")}, f"{out}/evil_p4.pt", pickle_protocol=4)
    # A big-endian archive (as torch >= 2.1 marks it in a byteorder record).
    with zipfile.ZipFile(f"{out}/values.pt") as zin, \
            zipfile.ZipFile(f"{out}/big_endian.pt", "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        zout.writestr("values/byteorder", b"big")


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    reader_fixtures(f"{out}/reader")

    model = GPT(CONFIG).double()
    optimizer = model.configure_optimizers()
    g = torch.Generator().manual_seed(1)
    train = torch.randint(0, CONFIG["vocab_size"], (8, CONFIG["block_size"] + 1), generator=g)
    tx, ty = train[:, :-1].contiguous(), train[:, 1:].contiguous()
    probe = torch.randint(0, CONFIG["vocab_size"], (4, CONFIG["block_size"] + 1), generator=g)
    x, y = probe[:, :-1].contiguous(), probe[:, 1:].contiguous()
    save_safetensors(f"{out}/probe.safetensors", {"inputs": x, "targets": y})
    saved = {}
    for step in range(1, 4):
        optimizer.zero_grad()
        model(tx, ty).backward()
        optimizer.step()
        if step < 2:
            continue
        saved[step] = ({k: v.clone() for k, v in model.state_dict().items()},
                       optimizer.state_dict())
        native_step(f"{out}/native/step_{step}", model, optimizer, step)
        os.makedirs(f"{out}/nanogpt", exist_ok=True)
        torch.save(nanogpt_ckpt(model, optimizer, step), f"{out}/nanogpt/ckpt_{step}.pt")
        os.makedirs(f"{out}/compiled", exist_ok=True)
        torch.save(nanogpt_ckpt(model, optimizer, step, "_orig_mod."),
                   f"{out}/compiled/" + ("ckpt.pt" if step == 2 else f"ckpt_{step}.pt"))
        hf = f"{out}/hf/checkpoint-{step}"
        os.makedirs(hf, exist_ok=True)
        if step == 2:
            torch.save(model.state_dict(), f"{hf}/pytorch_model.bin")
        else:
            # Hugging Face's safetensors files keep one of two tied tensors (buffers stay).
            save_safetensors(f"{hf}/model.safetensors",
                             {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})
        torch.save(optimizer.state_dict(), f"{hf}/optimizer.pt")
        # A sharded save: two safetensors files and the index naming each tensor's shard.
        sharded = f"{out}/hf_sharded/checkpoint-{step}"
        os.makedirs(sharded, exist_ok=True)
        items = [(k, v) for k, v in model.state_dict().items() if k != "lm_head.weight"]
        weight_map = {}
        for shard, part in enumerate((items[: len(items) // 2], items[len(items) // 2:])):
            name = f"model-0000{shard + 1}-of-00002.safetensors"
            save_safetensors(f"{sharded}/{name}", dict(part))
            weight_map.update({k: name for k, _ in part})
        with open(f"{sharded}/model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        torch.save(optimizer.state_dict(), f"{sharded}/optimizer.pt")
        with open(f"{hf}/trainer_state.json", "w") as f:
            json.dump({"global_step": step, "log_history": []}, f)
        os.makedirs(f"{out}/pt", exist_ok=True)
        torch.save(collections.OrderedDict(model.state_dict()), f"{out}/pt/step_{step}.pt")
        # Half precision: the same weights rounded to float16 / bfloat16, in both layouts.
        half = collections.OrderedDict(
            (k, v.to(torch.bfloat16 if v.dim() >= 2 else torch.float16))
            for k, v in model.state_dict().items() if not k.endswith(".attn.bias"))
        os.makedirs(f"{out}/pt_half", exist_ok=True)
        torch.save(half, f"{out}/pt_half/step_{step}.pt")
        os.makedirs(f"{out}/native_half/step_{step}", exist_ok=True)
        save_safetensors(f"{out}/native_half/step_{step}/model.safetensors",
                         {k: v for k, v in half.items() if k != "lm_head.weight"})

    # Bad inputs built from the run.
    wide = GPT(dict(CONFIG, n_embd=12)).double()
    wide_opt = wide.configure_optimizers()
    wide(tx, ty).backward()
    wide_opt.step()
    bad = nanogpt_ckpt(model, optimizer, 3)
    bad["optimizer"] = wide_opt.state_dict()
    os.makedirs(f"{out}/other_optimizer", exist_ok=True)
    torch.save(bad, f"{out}/other_optimizer/ckpt.pt")
    sd = collections.OrderedDict(model.state_dict())
    sd["transformer.h.0.attn.c_atn.weight"] = sd.pop("transformer.h.0.attn.c_attn.weight")
    os.makedirs(f"{out}/misnamed", exist_ok=True)
    torch.save(sd, f"{out}/misnamed/step_2.pt")

    # An optimizer over the parameters in reverse order, which records their names (as
    # param_names, like PyTorch >= 2.6, here with torch.compile's prefix): no rule is needed.
    rev = copy.deepcopy(model)
    named = list(rev.named_parameters())[::-1]
    rev_opt = torch.optim.AdamW([p for _, p in named], lr=1e-3)
    rev(tx, ty).backward()
    rev_opt.step()
    osd = rev_opt.state_dict()
    osd["param_groups"][0]["param_names"] = ["_orig_mod." + n for n, _ in named]
    os.makedirs(f"{out}/named_optimizer", exist_ok=True)
    torch.save({"model": rev.state_dict(), "optimizer": osd}, f"{out}/named_optimizer/step_1.pt")
    save_safetensors(f"{out}/named_optimizer_expected.safetensors",
                     {f"{n}.{k}": rev_opt.state[p][k] for n, p in named
                      for k in ("exp_avg", "exp_avg_sq")})

    # An optimizer whose only state is for one matrix: its shapes cannot tell nanoGPT's grouping
    # (matrices first) from the model order.
    mlp = nn.Module()
    mlp.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]).double()
    mlp_params = {n: p for n, p in mlp.named_parameters()}
    mlp_opt = torch.optim.AdamW([{"params": [p for p in mlp_params.values() if p.dim() >= 2]},
                                 {"params": [p for p in mlp_params.values() if p.dim() < 2]}])
    mlp_params["layers.0.weight"].grad = torch.ones(4, 4, dtype=torch.float64)
    mlp_opt.step()
    os.makedirs(f"{out}/ambiguous", exist_ok=True)
    torch.save({"model": mlp.state_dict(), "optimizer": mlp_opt.state_dict()},
               f"{out}/ambiguous/step_1.pt")

    # A nanoGPT run trained with MuonWithAuxAdam.
    torch.manual_seed(4)
    model = GPT(CONFIG).double()
    optimizer = MuonWithAuxAdam(muon_groups(model))
    for _ in range(2):
        optimizer.zero_grad()
        model(tx, ty).backward()
        optimizer.step()
    os.makedirs(f"{out}/muon", exist_ok=True)
    torch.save(nanogpt_ckpt(model, optimizer, 2), f"{out}/muon/ckpt.pt")
    reference(f"{out}/muon/ckpt.pt", None, CONFIG, x, y, f"{out}/reference_muon.json",
              make_optimizer=lambda m: MuonWithAuxAdam(muon_groups(m)), step_name="muon")

    reference(f"{out}/nanogpt/ckpt_2.pt", f"{out}/nanogpt/ckpt_3.pt", CONFIG, x, y,
              f"{out}/reference.json", f"{out}/hvp_delta.safetensors")

    # nanoGPT without biases (LayerNorm without bias too), saved once as ckpt.pt.
    nobias = dict(CONFIG, bias=False)
    torch.manual_seed(3)
    model = GPT(nobias).double()
    optimizer = model.configure_optimizers()
    for _ in range(2):
        optimizer.zero_grad()
        model(tx, ty).backward()
        optimizer.step()
    os.makedirs(f"{out}/nanogpt_nobias", exist_ok=True)
    ckpt = nanogpt_ckpt(model, optimizer, 2)
    ckpt["model_args"] = dict(nobias)
    torch.save(ckpt, f"{out}/nanogpt_nobias/ckpt.pt")
    reference(f"{out}/nanogpt_nobias/ckpt.pt", None, nobias, x, y,
              f"{out}/reference_nobias.json")


def reference(path, next_path, config, x, y, json_path, hvp_path=None,
              make_optimizer=GPT.configure_optimizers, step_name="adamw"):
    """torch.autograd at the checkpoint `path` as read back from nanoGPT's file: loss, and g.u,
    u'Hu, NDS, |u| for u = delta (to next_path), the optimizer's step from the saved state (named
    step_name) and -g; optionally H u along the delta as a safetensors file."""
    ck = torch.load(path)
    ref = GPT(config).double()
    ref.load_state_dict(ck["model"])
    params = list(ref.parameters())
    names = [n for n, _ in ref.named_parameters()]
    loss = ref(x, y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    directions = {"gradient": [-gr.detach() for gr in grads]}
    if next_path:
        nxt = torch.load(next_path)["model"]
        directions["delta"] = [nxt[n] - p.detach() for n, p in zip(names, params)]
    # The AdamW step PyTorch would take from the saved state with the probe-set gradient.
    stepper = GPT(config).double()
    stepper.load_state_dict(ck["model"])
    opt = make_optimizer(stepper)
    opt.load_state_dict(ck["optimizer"])
    stepper(x, y).backward()
    before = [p.detach().clone() for p in stepper.parameters()]
    opt.step()
    directions[step_name] = [p.detach() - b for p, b in zip(stepper.parameters(), before)]

    result = {"loss": loss.item()}
    for name, u in directions.items():
        gu = sum((gr * v).sum() for gr, v in zip(grads, u))
        hu = torch.autograd.grad(gu, params, retain_graph=True)
        if name == "delta" and hvp_path:
            save_safetensors(hvp_path, {**{f"u.{n}": v for n, v in zip(names, u)},
                                        **{f"hu.{n}": h for n, h in zip(names, hu)}})
        uhu = sum((h * v).sum() for h, v in zip(hu, u)).item()
        norm2 = sum((v * v).sum() for v in u).item()
        result[name] = {"first_order": gu.item(), "curvature": uhu, "nds": uhu / norm2,
                        "update_norm": math.sqrt(norm2)}
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
