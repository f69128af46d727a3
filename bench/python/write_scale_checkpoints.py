#!/usr/bin/python3
"""Two checkpoints of a built-in LLaMA config for bench/scale_gpu.sh, in libcurv's native layout
(step_<N>/model.safetensors + meta.json), written where AdamW's state would not fit beside the
model: step 0 a random init (matrices N(0, 0.02²), norm gains 1), step 1 the same plus a step of
±DELTA per entry with random signs, in --dtype (bfloat16 by default: a 7B checkpoint is 13.5 GB).
A DELTA of 2e-4 is about one bfloat16 spacing of an entry of size 0.02, so the step survives the
rounding; the delta is the direction ndsprobe audits. Also probe.safetensors: --sequences random
token windows of the config's context (inputs, next-token targets). Tensors are drawn on --device
(a GPU draws 7B numbers in seconds) and written one at a time.

usage: write_scale_checkpoints.py CONFIG.json OUT_DIR [--dtype bfloat16] [--device cuda]
                                  [--sequences 16] [--delta 2e-4] [--seed 0] [--sparse]
"""
import argparse
import json
import os
import struct
import zlib

import torch

ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}


def llama_shapes(c):
    """The built-in llama's parameters and shapes, in its order (libcurv/src/models/llama.cpp)."""
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, L = c["num_attention_heads"], c["num_hidden_layers"]
    KV = c.get("num_key_value_heads") or H
    D = c.get("head_dim") or C // H
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (H * D, C)),
                (p + "self_attn.k_proj.weight", (KV * D, C)),
                (p + "self_attn.v_proj.weight", (KV * D, C)),
                (p + "self_attn.o_proj.weight", (C, H * D)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (F, C)),
                (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F))]
    out.append(("model.norm.weight", (C,)))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, C)))
    return out


def write_safetensors(path, shapes, tensor_of, dtype, sparse=False):
    """Header first, then each tensor as tensor_of(name, shape) makes it: one in memory at a time.
    sparse: the header and a hole of the tensors' size (for ndsprobe --plan, which reads no data)."""
    size = torch.tensor([], dtype=dtype).element_size()
    header, offset = {}, 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + n * size]}
        offset += n * size
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        if sparse:
            f.truncate(8 + len(text) + offset)
            return
        for name, shape in shapes:
            t = tensor_of(name, shape).to(dtype).contiguous().cpu()
            f.write(t.view(torch.uint8).numpy().tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--delta", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sparse", action="store_true",
                    help="headers only, the data a hole: checkpoints for ndsprobe --plan")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    with open(a.config) as f:
        config = json.load(f)
    shapes = llama_shapes(config)

    def init(name, shape, step):
        g = torch.Generator(device=a.device)
        g.manual_seed(a.seed * 1_000_003 + zlib.crc32(name.encode()))
        if len(shape) == 1:
            t = torch.ones(shape, device=a.device)
        else:
            t = torch.randn(shape, generator=g, device=a.device) * 0.02
        t = t.to(dtype)
        if step == 1:
            signs = torch.randint(0, 2, shape, generator=g, device=a.device) * 2 - 1
            t = (t.float() + a.delta * signs).to(dtype)
        return t

    for step in (0, 1):
        folder = os.path.join(a.out, f"step_{step}")
        os.makedirs(folder, exist_ok=True)
        write_safetensors(os.path.join(folder, "model.safetensors"), shapes,
                          lambda n, s: init(n, s, step), dtype, a.sparse)
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"step": step, "model": config}, f)
    g = torch.Generator()
    g.manual_seed(a.seed)
    T, V = config["max_position_embeddings"], config["vocab_size"]
    tokens = torch.randint(0, V, (a.sequences, T + 1), generator=g)
    write_safetensors(os.path.join(a.out, "probe.safetensors"),
                      [("inputs", (a.sequences, T)), ("targets", (a.sequences, T))],
                      lambda n, s: tokens[:, :-1] if n == "inputs" else tokens[:, 1:],
                      torch.int64)


if __name__ == "__main__":
    main()
