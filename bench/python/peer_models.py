"""The two models of bench/peers.sh as torch modules, and the files both sides read.

`GPT` is nanoGPT's model (its parameter names, LayerNorm with bias, exact GELU, learned
positions, tied head) and `Llama` Hugging Face's LlamaForCausalLM (its parameter names, RMSNorm,
rotary embeddings by rotate_half, grouped-query attention, SwiGLU, untied head): the same functions
as libcurv's built-in `gpt` and `llama` architectures. Attention is written out (matmul, mask,
softmax) because torch's fused attention kernels have no double backward and no forward-mode
derivative of their backward, which the peers' HVPs need.

`make` writes a native checkpoint (RUN/step_0/model.safetensors and meta.json with the model
config, docs/checkpoints.md) after a few AdamW steps on a synthetic token stream, and the probe
set (probe.safetensors: int64 `inputs` and `targets`, targets shifted by one), so that ndsprobe,
bench/peer_bench.cpp and the Python peers start from the same numbers.
"""
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

GPT_CONFIG = {"arch": "gpt", "vocab_size": 256, "block_size": 32, "n_layer": 2, "n_head": 4,
              "n_embd": 128, "bias": True, "tied": True}
LLAMA_CONFIG = {"arch": "llama", "vocab_size": 256, "hidden_size": 128,
                "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 32,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}


def explicit_layer_norm():
    """nn.LayerNorm computed from elementary operations from now on (the same function). torch
    2.11's forward-mode derivative of layer_norm's backward is not exact: an HVP taken
    forward-over-reverse (curvlinops) through nn.LayerNorm differs from the exact one by about
    3e-3 relative on the bench's GPT, while written out it agrees to 1e-15."""
    def layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + eps)
        y = y * weight if weight is not None else y
        return y + bias if bias is not None else y
    F.layer_norm = layer_norm


def causal_softmax(scores):
    T = scores.size(-1)
    mask = torch.full((T, T), -math.inf, dtype=scores.dtype, device=scores.device).triu(1)
    return torch.softmax(scores + mask, -1)


class _Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["n_embd"]
        self.c_attn = nn.Linear(C, 3 * C, bias=c["bias"])
        self.c_proj = nn.Linear(C, C, bias=c["bias"])
        self.n_head = c["n_head"]

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, -1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(C // H))
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class _Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["n_embd"]
        self.c_fc = nn.Linear(C, 4 * C, bias=c["bias"])
        self.c_proj = nn.Linear(4 * C, C, bias=c["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["n_embd"]
        self.ln_1 = nn.LayerNorm(C, bias=c["bias"])
        self.attn = _Attention(c)
        self.ln_2 = nn.LayerNorm(C, bias=c["bias"])
        self.mlp = _Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT without dropout; forward(tokens) returns logits (B, T, vocab)."""

    def __init__(self, c):
        super().__init__()
        assert c.get("tied", True), "the bench's GPT ties its head, as nanoGPT does"
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList(_Block(c) for _ in range(c["n_layer"])),
            ln_f=nn.LayerNorm(c["n_embd"], bias=c["bias"])))
        for name, p in self.named_parameters():  # nanoGPT's initialisation
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c["n_layer"]))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, tokens):
        t = self.transformer
        T = tokens.size(1)
        x = t.wte(tokens) + t.wpe(torch.arange(T, device=tokens.device))
        for block in t.h:
            x = block(x)
        return F.linear(t.ln_f(x), t.wte.weight)


class _RmsNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, D = c["hidden_size"], c["head_dim"]
        H, KV = c["num_attention_heads"], c["num_key_value_heads"]
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, KV * D, bias=False)
        self.v_proj = nn.Linear(C, KV * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.H, self.KV, self.D = H, KV, D

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H, KV, D = self.H, self.KV, self.D

        def rope(t):
            return t * cos + torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1) * sin

        q = rope(self.q_proj(x).view(B, T, H, D).transpose(1, 2))
        k = rope(self.k_proj(x).view(B, T, KV, D).transpose(1, 2))
        v = self.v_proj(x).view(B, T, KV, D).transpose(1, 2)
        k, v = (t.repeat_interleave(H // KV, dim=1) for t in (k, v))  # HF's repeat_kv
        att = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(D))
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, H * D))


class _LlamaMlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, F_ = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x):
        # SiLU written out: torch 2.11 has no forward-mode derivative of silu_backward, which
        # curvlinops' forward-over-reverse HVP needs ("Trying to use forward AD with
        # aten::silu_backward that does not support it"). The same function on every side.
        g = self.gate_proj(x)
        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))


class _LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = _LlamaAttention(c)
        self.mlp = _LlamaMlp(c)
        self.input_layernorm = _RmsNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = _RmsNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class _LlamaBody(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(_LlamaLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = _RmsNorm(c["hidden_size"], c["rms_norm_eps"])


class Llama(nn.Module):
    """LlamaForCausalLM (untied head); forward(tokens) returns logits (B, T, vocab)."""

    def __init__(self, c):
        super().__init__()
        assert not c.get("tie_word_embeddings", False)
        self.model = _LlamaBody(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.c = c
        for p in self.parameters():  # HF's _init_weights
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens):
        c, T = self.c, tokens.size(1)
        D = c["head_dim"]
        # Angles in float64, then the model's dtype, as the built-in llama computes them.
        f64 = dict(dtype=torch.float64, device=tokens.device)
        inv = 1.0 / c["rope_theta"] ** (torch.arange(0, D, 2, **f64) / D)
        angles = torch.outer(torch.arange(T, **f64), inv)
        emb = torch.cat((angles, angles), -1)
        dtype = self.lm_head.weight.dtype
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def build(config):
    return GPT(config) if config["arch"] == "gpt" else Llama(config)


def mean_cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def token_stream(vocab, length, seed):
    """A first-order Markov chain with Zipf-like transitions: text-shaped, learnable tokens."""
    rng = np.random.default_rng(seed)
    ranks = 1.0 / np.arange(1, vocab + 1) ** 1.1
    table = np.stack([rng.permutation(ranks) for _ in range(vocab)])
    table /= table.sum(1, keepdims=True)
    cdf = np.cumsum(table, 1)
    out = np.empty(length, dtype=np.int64)
    out[0] = 0
    u = rng.random(length)
    for i in range(1, length):
        out[i] = min(np.searchsorted(cdf[out[i - 1]], u[i]), vocab - 1)
    return out


def windows(stream, count, T, seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - T - 1, count)
    seq = np.stack([stream[s:s + T + 1] for s in starts])
    return torch.from_numpy(seq[:, :-1].copy()), torch.from_numpy(seq[:, 1:].copy())


def make(config, run_dir, probe_path, probe_sequences, train_steps, seed=0):
    """Trains `train_steps` AdamW steps in float32 and writes the checkpoint and probe set."""
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    model = build(config)
    vocab = config["vocab_size"]
    T = config.get("block_size", config.get("max_position_embeddings"))
    stream = token_stream(vocab, 200_000, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(train_steps):
        x, y = windows(stream, 16, T, seed + 1 + step)
        loss = mean_cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    step_dir = os.path.join(run_dir, "step_0")
    os.makedirs(step_dir, exist_ok=True)
    with open(os.path.join(step_dir, "meta.json"), "w") as f:
        json.dump({"step": 0, "model": config}, f, indent=1)
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()},
              os.path.join(step_dir, "model.safetensors"))
    x, y = windows(stream, probe_sequences, T, seed + 10_000)
    save_file({"inputs": x.contiguous(), "targets": y.contiguous()}, probe_path)
    with torch.no_grad():
        final = mean_cross_entropy(model(x), y).item()
    return sum(p.numel() for p in model.parameters()), final


def load(run_dir, dtype, device):
    """The model of RUN/step_0 (config from meta.json, parameters from model.safetensors)."""
    from safetensors.torch import load_file
    step_dir = os.path.join(run_dir, "step_0")
    with open(os.path.join(step_dir, "meta.json")) as f:
        config = json.load(f)["model"]
    model = build(config)
    state = load_file(os.path.join(step_dir, "model.safetensors"))
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval(), config


def probe_batches(path, batch_size, device):
    from safetensors.torch import load_file
    data = load_file(path)
    x, y = data["inputs"].to(device), data["targets"].to(device)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]
