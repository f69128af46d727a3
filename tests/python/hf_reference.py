"""Hugging Face-style checkpoint folders of tiny LLaMA, Qwen2, Mistral and GPT-2 models, and their
reference numbers from an independent float64 implementation of each HF forward pass.

Usage: hf_reference.py OUT_DIR ARCH      ARCH: llama | qwen2 | mistral | gpt2 | llama-bf16

No `transformers` package is available, so the forward passes are written here as HF's modules
are (transformers' models/llama/modeling_llama.py, qwen2/modeling_qwen2.py,
mistral/modeling_mistral.py, gpt2/modeling_gpt2.py and pytorch_utils.Conv1D), in float64 with
no float32 casts: RMSNorm x·rsqrt(mean(x²) + eps)·weight; rotary embeddings with rotate_half and
inv_freq = 1/θ^(arange(0, d, 2)/d); grouped-query attention by repeat_kv; causal softmax attention
scaled by 1/sqrt(head_dim); SwiGLU; GPT-2's Conv1D (x W + b, W stored [in, out]), gelu_new and
tied head. Module registration order is HF's, so named_parameters() gives HF's parameter order.

Writes OUT_DIR/run/checkpoint-10/ and checkpoint-20/ (config.json as save_pretrained writes it,
model.safetensors written byte by byte, or pytorch_model.bin for gpt2 with the causal-mask buffers
older HF versions saved, and trainer_state.json), and OUT_DIR/reference.json: inputs, targets,
param_names, the mean cross-entropy at both checkpoints (loss, loss_at_10), logits_first (sequence
0), and by parameter name at checkpoint 20 the gradient, the direction u = θ20 − θ10 and H u, with
uᵀHu (curvature); at_10 holds g·u and uᵀHu at checkpoint 10 (the delta audit's numbers).
llama-bf16 stores the llama weights as bfloat16: the reference uses those values upcast.
"""
import json
import math
import os
import struct
import sys

import torch
from torch import nn

DTYPE = torch.float64


# ------------------------------------------------------------------------------------------------
# LLaMA family (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=DTYPE))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


class Attention(nn.Module):
    def __init__(self, c, qkv_bias, o_bias):
        super().__init__()
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        h, d = c["hidden_size"], self.head_dim
        self.q_proj = nn.Linear(h, self.heads * d, bias=qkv_bias, dtype=DTYPE)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=qkv_bias, dtype=DTYPE)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=qkv_bias, dtype=DTYPE)
        self.o_proj = nn.Linear(self.heads * d, h, bias=o_bias, dtype=DTYPE)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        shape = lambda y, n: y.view(b, t, n, self.head_dim).transpose(1, 2)
        q = shape(self.q_proj(x), self.heads)
        k = shape(self.k_proj(x), self.kv_heads)
        v = shape(self.v_proj(x), self.kv_heads)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.heads // self.kv_heads), repeat_kv(v, self.heads // self.kv_heads)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(y)


class Mlp(nn.Module):
    def __init__(self, c, bias):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=bias, dtype=DTYPE)
        self.up_proj = nn.Linear(h, f, bias=bias, dtype=DTYPE)
        self.down_proj = nn.Linear(f, h, bias=bias, dtype=DTYPE)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c, qkv_bias, o_bias, mlp_bias):
        super().__init__()
        self.self_attn = Attention(c, qkv_bias, o_bias)
        self.mlp = Mlp(c, mlp_bias)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c, qkv_bias, o_bias, mlp_bias):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"], dtype=DTYPE)
        self.layers = nn.ModuleList(
            [DecoderLayer(c, qkv_bias, o_bias, mlp_bias) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaLike(nn.Module):
    def __init__(self, c, qkv_bias, o_bias, mlp_bias):
        super().__init__()
        self.c = c
        self.model = Backbone(c, qkv_bias, o_bias, mlp_bias)
        self.tied = c["tie_word_embeddings"]
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False, dtype=DTYPE)

    def forward(self, tokens):
        t = tokens.shape[1]
        d = self.model.layers[0].self_attn.head_dim
        inv_freq = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
        freqs = torch.outer(torch.arange(t, dtype=DTYPE), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return x @ head.T


# ------------------------------------------------------------------------------------------------
# GPT-2 (GPT2LMHeadModel)


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf, dtype=DTYPE))
        self.bias = nn.Parameter(torch.zeros(nf, dtype=DTYPE))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class Gpt2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, e = c["n_head"], c["n_embd"]
        self.c_attn = Conv1D(3 * e, e)
        self.c_proj = Conv1D(e, e)

    def forward(self, x):
        b, t, e = x.shape
        d = e // self.heads
        q, k, v = self.c_attn(x).split(e, dim=2)
        q, k, v = (y.view(b, t, self.heads, d).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = torch.where(causal, scores, torch.tensor(torch.finfo(DTYPE).min, dtype=DTYPE))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, e)
        return self.c_proj(y)


class Gpt2Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        e = c["n_embd"]
        inner = c["n_inner"] or 4 * e
        self.c_fc = Conv1D(inner, e)
        self.c_proj = Conv1D(e, inner)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class Gpt2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, eps = c["n_embd"], c["layer_norm_epsilon"]
        self.ln_1 = nn.LayerNorm(e, eps=eps, dtype=DTYPE)
        self.attn = Gpt2Attention(c)
        self.ln_2 = nn.LayerNorm(e, eps=eps, dtype=DTYPE)
        self.mlp = Gpt2Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"], dtype=DTYPE)
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"], dtype=DTYPE)
        self.h = nn.ModuleList([Gpt2Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"], dtype=DTYPE)


class Gpt2LMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = Gpt2Model(c)

    def forward(self, tokens):
        tr = self.transformer
        x = tr.wte(tokens) + tr.wpe(torch.arange(tokens.shape[1]))
        for block in tr.h:
            x = block(x)
        return tr.ln_f(x) @ tr.wte.weight.T  # the tied lm_head


# ------------------------------------------------------------------------------------------------
# Configs as save_pretrained writes them

COMMON = {"bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02, "use_cache": True,
          "transformers_version": "4.44.2"}


def config_of(arch):
    if arch in ("llama", "llama-bf16"):
        return dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama",
                    torch_dtype="bfloat16" if arch == "llama-bf16" else "float64",
                    vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                    max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                    rope_scaling=None, attention_bias=False, attention_dropout=0.0,
                    mlp_bias=False, pretraining_tp=1, tie_word_embeddings=False)
    if arch == "qwen2":
        return dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                    torch_dtype="float64", vocab_size=37, hidden_size=16, intermediate_size=20,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                    hidden_act="silu", max_position_embeddings=64, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, rope_scaling=None, attention_dropout=0.0,
                    use_sliding_window=False, sliding_window=4096, max_window_layers=2,
                    tie_word_embeddings=True)
    if arch == "mistral":
        return dict(COMMON, architectures=["MistralForCausalLM"], model_type="mistral",
                    torch_dtype="float64", vocab_size=37, hidden_size=24, intermediate_size=32,
                    num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                    head_dim=8, hidden_act="silu", max_position_embeddings=64,
                    rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096,
                    attention_dropout=0.0, tie_word_embeddings=False)
    if arch == "gpt2":
        return dict(COMMON, architectures=["GPT2LMHeadModel"], model_type="gpt2",
                    torch_dtype="float64", vocab_size=37, n_embd=16, n_layer=2, n_head=4,
                    n_positions=32, n_ctx=32, n_inner=None, activation_function="gelu_new",
                    layer_norm_epsilon=1e-5, attn_pdrop=0.1, embd_pdrop=0.1, resid_pdrop=0.1,
                    scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                    reorder_and_upcast_attn=False, summary_activation=None,
                    summary_first_dropout=0.1, summary_proj_to_labels=True,
                    summary_type="cls_index", summary_use_proj=True, bos_token_id=36,
                    eos_token_id=36)
    raise SystemExit(f"unknown ARCH {arch}")


def build(arch, c):
    if arch == "gpt2":
        return Gpt2LMHead(c)
    if arch == "qwen2":
        return LlamaLike(c, qkv_bias=True, o_bias=False, mlp_bias=False)
    bias = c.get("attention_bias", False)
    return LlamaLike(c, qkv_bias=bias, o_bias=bias, mlp_bias=c.get("mlp_bias", False))


# ------------------------------------------------------------------------------------------------
# Files


def write_safetensors(path, tensors, tag):
    """The safetensors format: u64 header size, JSON header, raw little-endian bytes."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if tag == "BF16":
            data = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        else:
            data = t.to(torch.float64).contiguous().numpy().tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def save_folder(folder, arch, c, model, step):
    os.makedirs(folder, exist_ok=True)
    with open(f"{folder}/config.json", "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    with open(f"{folder}/trainer_state.json", "w") as f:
        json.dump({"global_step": step, "epoch": step / 20, "log_history": [],
                   "max_steps": 20, "logging_steps": 10}, f, indent=2)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    if arch == "gpt2":
        # The tied head as the state dict carries it, and the buffers older HF versions saved.
        state["lm_head.weight"] = state["transformer.wte.weight"].clone()
        n = c["n_positions"]
        for i in range(c["n_layer"]):
            state[f"transformer.h.{i}.attn.bias"] = torch.tril(
                torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
            state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        torch.save(state, f"{folder}/pytorch_model.bin")
    else:
        write_safetensors(f"{folder}/model.safetensors", state,
                          "BF16" if arch == "llama-bf16" else "F64")


def main():
    out, arch = sys.argv[1], sys.argv[2]
    c = config_of(arch)
    torch.manual_seed(0)
    model = build(arch, c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    theta10 = [p.detach().clone() for p in params]
    theta20 = [t + 0.02 * torch.randn_like(t) for t in theta10]
    if arch == "llama-bf16":
        # What a reader of the bf16 file gets back, upcast.
        theta10 = [t.to(torch.bfloat16).to(DTYPE) for t in theta10]
        theta20 = [t.to(torch.bfloat16).to(DTYPE) for t in theta20]
    tokens = torch.randint(0, c["vocab_size"], (3, 9))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def load(theta):
        with torch.no_grad():
            for p, t in zip(params, theta):
                p.copy_(t)

    for step, theta in ((10, theta10), (20, theta20)):
        load(theta)
        save_folder(f"{out}/run/checkpoint-{step}", arch, c, model, step)

    def loss_fn():
        logits = model(inputs)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1)), logits

    u = [b - a for a, b in zip(theta10, theta20)]

    def terms(theta):
        load(theta)
        loss, logits = loss_fn()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        gu = sum((g * d).sum() for g, d in zip(grads, u))
        hvp = torch.autograd.grad(gu, params)
        curvature = sum((h * d).sum() for h, d in zip(hvp, u)).item()
        return loss.item(), logits, grads, gu.item(), hvp, curvature

    loss10, _, _, gu10, _, curvature10 = terms(theta10)
    loss20, logits, grads, _, hvp, curvature20 = terms(theta20)
    flat = lambda ts: {n: t.detach().reshape(-1).tolist() for n, t in zip(names, ts)}
    reference = {
        "inputs": inputs.tolist(),
        "targets": targets.tolist(),
        "param_names": names,
        "loss": loss20,
        "loss_at_10": loss10,
        "logits_first": logits[0].detach().reshape(-1).tolist(),
        "grad": flat(grads),
        "direction": flat(u),
        "hvp": flat(hvp),
        "curvature": curvature20,
        "at_10": {"first_order": gu10, "curvature": curvature10},
    }
    with open(f"{out}/reference.json", "w") as f:
        json.dump(reference, f)


if __name__ == "__main__":
    main()
