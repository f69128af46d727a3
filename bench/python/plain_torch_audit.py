#!/usr/bin/python3
"""The Taylor audit of ndsprobe's `--directions delta` (layer blocks, full coupling, realized
change), written the plain way in Python torch: the yardstick of bench/audit_vs_python.sh.

For each saved checkpoint θ_k with a successor, u = θ_{k+1} − θ_k. Each probe batch's
create_graph gradient is kept; the HVP of each block's part of u is one second backward per
batch through all the gradient outputs, with u zero-padded outside the block (how a torch user
writes H v); the coupling matrix C[l, m] = u_lᵀ (H u_m)_l and the realized change
L(θ + u) − L(θ) follow. The model is nanoGPT's GPT or Hugging Face's LLaMA (RMSNorm, rotary,
SwiGLU, grouped-query heads; the built-in `gpt` and `llama` of libcurv are the same functions), as
the checkpoints' meta.json says, read from their model.safetensors.

With --coupling none (ndsprobe's --coupling none) each batch takes one second backward along the
whole u, and only uᵀHu is computed. --dtype bfloat16 runs the model as transformers runs a
bfloat16 one (RMSNorm's normalisation, the attention softmax and the loss in float32, u and the
sums of the products in float32: ndsprobe's rule for 16-bit models). --recompute keeps no graph:
each batch's graph is rebuilt for every product (ndsprobe's --recompute-graphs). --device runs it on a GPU (explicit softmax attention: torch's
fused attention kernels have no double backward).

Writes a JSON file: per checkpoint the loss, g·u, uᵀHu, the block curvatures and the realized
change, plus the seconds spent (in total and in the audit itself, after the checkpoints are read)
and, on a GPU, the peak memory its tensors held.
"""
import argparse
import json
import math
import os
import re
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "U16": np.uint16, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[entry["dtype"]])
        out[name] = torch.from_numpy(array.reshape(entry["shape"]).copy())
    return out


def gpt_loss(p, cfg, x, y):
    B, T = x.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    bias = cfg.get("bias", True)

    def lin(h, name):
        return F.linear(h, p[name + ".weight"], p[name + ".bias"] if bias else None)

    def ln(h, name):
        return F.layer_norm(h, (C,), p[name + ".weight"], p[name + ".bias"] if bias else None,
                            1e-5)

    h = F.embedding(x, p["transformer.wte.weight"]) + \
        F.embedding(torch.arange(T, device=x.device), p["transformer.wpe.weight"])
    mask = torch.full((T, T), -math.inf, dtype=h.dtype, device=x.device).triu(1)
    for layer in range(cfg["n_layer"]):
        pre = f"transformer.h.{layer}."
        q, k, v = lin(ln(h, pre + "ln_1"), pre + "attn.c_attn").split(C, -1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(C // H) + mask, -1)
        y_att = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + lin(y_att, pre + "attn.c_proj")
        h = h + lin(F.gelu(lin(ln(h, pre + "ln_2"), pre + "mlp.c_fc")), pre + "mlp.c_proj")
    h = ln(h, "transformer.ln_f")
    head = p["transformer.wte.weight"] if cfg.get("tied", True) else p["lm_head.weight"]
    logits = F.linear(h, head)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def llama_loss(p, cfg, x, y):
    B, T = x.shape
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    eps = cfg.get("rms_norm_eps", 1e-6)

    def norm(h, name):
        if h.dtype in (torch.bfloat16, torch.float16):
            w = h.float()
            return p[name] * (w * torch.rsqrt(w.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
        return p[name] * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / cfg.get("rope_theta", 10000.0) ** (
        torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=x.device), inv)
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().to(p["model.norm.weight"].dtype), emb.sin().to(p["model.norm.weight"].dtype)

    def rotary(t):
        return t * cos + torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1) * sin

    h = F.embedding(x, p["model.embed_tokens.weight"])
    mask = torch.full((T, T), -math.inf, dtype=h.dtype, device=x.device).triu(1)
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        a = norm(h, pre + "input_layernorm.weight")
        q = F.linear(a, p[pre + "self_attn.q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
        k = F.linear(a, p[pre + "self_attn.k_proj.weight"]).view(B, T, KV, D).transpose(1, 2)
        v = F.linear(a, p[pre + "self_attn.v_proj.weight"]).view(B, T, KV, D).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        k, v = (t.repeat_interleave(H // KV, 1) for t in (k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
        att = torch.softmax(scores.float() + mask.float(), -1).to(scores.dtype)
        h = h + F.linear((att @ v).transpose(1, 2).reshape(B, T, H * D),
                         p[pre + "self_attn.o_proj.weight"])
        m = norm(h, pre + "post_attention_layernorm.weight")
        h = h + F.linear(F.silu(F.linear(m, p[pre + "mlp.gate_proj.weight"])) *
                         F.linear(m, p[pre + "mlp.up_proj.weight"]), p[pre + "mlp.down_proj.weight"])
    h = norm(h, "model.norm.weight")
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    logits = F.linear(h, head).float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def layer_block(name):
    # libcurv's layer rule: the first numeric path component names the layer.
    m = re.match(r"^(.*?\.\d+)(\.|$)", name)
    if m:
        return m.group(1)
    return "embeddings" if re.search(r"(^|\.)(wte|wpe|embed)", name) else "head"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    ap.add_argument("--recompute", action="store_true",
                    help="keep no graph: rebuild each batch's graph for every product")
    ap.add_argument("--tf32", action="store_true", help="TF32 float32 matrix products")
    ap.add_argument("--step", type=int, default=None,
                    help="audit only the delta from this saved step to the next")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--coupling", default="full", choices=["full", "none"])
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    device = torch.device(a.device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    torch.set_num_threads(a.threads)
    dtype = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[a.dtype]
    # Directions and HVP sums: float32 for a 16-bit model.
    vdtype = torch.float32 if dtype == torch.bfloat16 else dtype
    if a.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    start = time.perf_counter()

    steps = sorted(int(d[5:]) for d in os.listdir(a.run) if re.fullmatch(r"step_\d+", d))
    with open(os.path.join(a.run, f"step_{steps[0]}", "meta.json")) as f:
        cfg = json.load(f)["model"]
    if cfg.get("arch", "gpt") not in ("gpt", "llama"):
        raise SystemExit(f"plain_torch_audit: architecture {cfg.get('arch')!r}: gpt or llama")
    extras = any(cfg.get(key) for key in ("attention_bias", "qkv_bias", "mlp_bias", "qk_norm"))
    if cfg.get("arch") == "llama" and (extras or cfg.get("rope_type", "default") != "default"):
        raise SystemExit("plain_torch_audit: the LLaMA here has no biases, q/k norms or rope "
                         "scaling")
    model_loss = llama_loss if cfg.get("arch") == "llama" else gpt_loss
    probe = read_safetensors(a.data)
    xs, ys = probe["inputs"].long().to(device), probe["targets"].long().to(device)
    batches = [(xs[i:i + a.batch_size], ys[i:i + a.batch_size])
               for i in range(0, xs.shape[0], a.batch_size)]
    weights = [b[0].shape[0] / xs.shape[0] for b in batches]

    def load(step):
        t = read_safetensors(os.path.join(a.run, f"step_{step}", "model.safetensors"))
        return {k: v.to(device=device, dtype=dtype) for k, v in t.items()}

    results = []
    audit_seconds = 0.0
    for k in range(len(steps) - 1):
        if a.step is not None and steps[k] != a.step:
            continue
        theta, nxt = load(steps[k]), load(steps[k + 1])
        sync()
        audit_start = time.perf_counter()
        names = list(theta.keys())
        params = [theta[n].clone().requires_grad_(True) for n in names]
        p = dict(zip(names, params))
        u = [nxt[n].to(vdtype) - theta[n].to(vdtype) for n in names]
        blocks = {}
        for i, n in enumerate(names):
            blocks.setdefault(layer_block(n), []).append(i)
        block_names = list(blocks)

        loss, grad, kept = 0.0, [torch.zeros_like(t, dtype=vdtype) for t in params], []
        for (x, y), w in zip(batches, weights):
            lb = model_loss(p, cfg, x, y)
            g = torch.autograd.grad(lb, params, create_graph=not a.recompute)
            kept.append(None if a.recompute else g)
            loss += w * lb.item()
            for acc, gi in zip(grad, g):
                acc.add_(gi.detach(), alpha=w)
        first_order = sum(float((g.double() * ui.double()).sum()) for g, ui in zip(grad, u))

        L = len(block_names)
        coupling = np.zeros((L, L))
        # --coupling none: one HVP along the whole u, its total put in the first entry.
        for m, bm in enumerate(block_names if a.coupling == "full" else [None]):
            v = [(u[i] if bm is None or i in blocks[bm] else torch.zeros_like(u[i])).to(dtype)
                 for i in range(len(u))]
            hv = [torch.zeros_like(t, dtype=vdtype) for t in params]
            for g, w, (x, y) in zip(kept, weights, batches):
                if g is None:
                    g = torch.autograd.grad(model_loss(p, cfg, x, y), params, create_graph=True)
                parts = torch.autograd.grad(g, params, grad_outputs=v, retain_graph=not a.recompute)
                for acc, h in zip(hv, parts):
                    acc.add_(h, alpha=w)
            for l, bl in enumerate(block_names):
                coupling[l, m] = sum(float((u[i].double() * hv[i].double()).sum())
                                     for i in blocks[bl])
            hv = None
        del kept

        with torch.no_grad():
            shifted = {n: nxt[n] for n in names}
            loss_after = sum(w * model_loss(shifted, cfg, x, y).item()
                             for (x, y), w in zip(batches, weights))
        sync()
        audit_seconds += time.perf_counter() - audit_start
        results.append({
            "step": steps[k], "loss": loss, "first_order": first_order,
            "curvature": float(coupling.sum()),
            "sq_norm": sum(float((ui.double() ** 2).sum()) for ui in u),
            "blocks": (dict(zip(block_names, np.diag(coupling).tolist()))
                       if a.coupling == "full" else {}),
            "realized": loss_after - loss,
        })

    with open(a.out, "w") as f:
        json.dump({"seconds": time.perf_counter() - start, "audit_seconds": audit_seconds,
                   "device": str(device),
                   "peak_memory": (torch.cuda.max_memory_allocated(device)
                                   if device.type == "cuda" else None),
                   "checkpoints": results}, f, indent=1)


if __name__ == "__main__":
    main()
