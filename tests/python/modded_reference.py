"""A modded-nanogpt run and its reference numbers, for the built-in "modded" architecture.

Usage: modded_reference.py OUT_DIR

The model is the GPT of modded-nanogpt's optimization track
(records/track_3_optimization/train_gpt_simple.py), written here as that script's nn.Modules
in float64, tiny (vocabulary 29, 2 layers, width 16, head_dim 8). torch 1.13 has neither
F.rms_norm nor the `scale` argument of scaled_dot_product_attention, so both are spelled out:
F.rms_norm(x, (d,)) with eps=None is x * rsqrt(mean(x²) + finfo(dtype).eps), and the attention is
the causal softmax of q·kᵀ·0.12.

Writes OUT_DIR/run/state_step000010.pt and state_step000020.pt as the speedrun saves them
(dict(step, code, model, optimizers); the model's names under torch.compile's "_orig_mod."
prefix; the rotary buffer included), and OUT_DIR/reference.json: inputs, targets, the mean
cross-entropy at both checkpoints (the script's sum-reduced loss over the batch's tokens divided by
their number), the gradient and the Hessian-vector product along u = θ20 − θ10 at θ20, by name.
"""
import json
import os
import sys

import torch
from torch import nn

DTYPE = torch.float64
# The saved 'code' carries the hyper-parameters shapes do not show, as the script's own text does.
CODE = """class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, head_dim=8):
        ...
        y = F.scaled_dot_product_attention(q, k, v, scale=0.12, is_causal=True)
"""


def rms_norm(x):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gains = nn.Parameter(torch.ones(dim, dtype=DTYPE))

    def forward(self, x):
        return rms_norm(x) * self.gains


class Rotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        angular_freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4, dtype=DTYPE)
        self.register_buffer("angular_freq", torch.cat([angular_freq, angular_freq.new_zeros(dim // 4)]))

    def forward(self, x_BTHD):
        pos = torch.arange(x_BTHD.size(1), dtype=DTYPE)
        theta = torch.outer(pos, self.angular_freq)[None, :, None, :]
        cos, sin = theta.cos(), theta.sin()
        x1, x2 = x_BTHD.chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), 3)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.num_heads, self.head_dim = dim // head_dim, head_dim
        hdim = self.num_heads * head_dim
        self.q = nn.Linear(dim, hdim, dtype=DTYPE)
        self.k = nn.Linear(dim, hdim, dtype=DTYPE)
        self.v = nn.Linear(dim, hdim, dtype=DTYPE)
        self.proj = nn.Linear(hdim, dim, dtype=DTYPE)
        self.rotary = Rotary(head_dim)

    def forward(self, x):
        B, T = x.size(0), x.size(1)
        q = self.q(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k(x).view(B, T, self.num_heads, self.head_dim)
        v = self.v(x).view(B, T, self.num_heads, self.head_dim)
        q, k = rms_norm(q), rms_norm(k)
        q, k = self.rotary(q), self.rotary(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * 0.12
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).contiguous().view(B, T, -1)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim, dtype=DTYPE)
        self.proj = nn.Linear(4 * dim, dim, dtype=DTYPE)

    def forward(self, x):
        return self.proj(self.fc(x).relu().square())


class Block(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.attn = CausalSelfAttention(dim, head_dim)
        self.mlp = MLP(dim)
        self.norm1 = RMSNorm(dim)
        self.norm2 = RMSNorm(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, num_layers, model_dim, head_dim):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model_dim, dtype=DTYPE)
        self.blocks = nn.ModuleList([Block(model_dim, head_dim) for _ in range(num_layers)])
        self.proj = nn.Linear(model_dim, vocab_size, dtype=DTYPE)
        self.norm1 = RMSNorm(model_dim)
        self.norm2 = RMSNorm(model_dim)

    def forward(self, inputs, targets):
        x = self.norm1(self.embed(inputs))
        for block in self.blocks:
            x = block(x)
        logits = self.proj(self.norm2(x))
        logits = 15 * logits * (logits.square() + 15**2).rsqrt()
        return nn.functional.cross_entropy(logits.view(targets.numel(), -1), targets.view(-1),
                                           reduction="sum")


def small_model(vocab_size=29):
    """The fixtures' model, seeded: 2 layers of width 16, heads of 8, with non-trivial values
    everywhere (the script zeroes its "proj" weights at step 0)."""
    torch.manual_seed(0)
    model = GPT(vocab_size=vocab_size, num_layers=2, model_dim=16, head_dim=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gains"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model


def main():
    out = sys.argv[1]
    model = small_model()
    names = [n for n, _ in model.named_parameters()]
    theta10 = [p.detach().clone() for p in model.parameters()]
    theta20 = [t + 0.02 * torch.randn_like(t) for t in theta10]
    tokens = torch.randint(0, 29, (3, 9))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    os.makedirs(f"{out}/run", exist_ok=True)
    for step, theta in ((10, theta10), (20, theta20)):
        with torch.no_grad():
            for p, t in zip(model.parameters(), theta):
                p.copy_(t)
        state = {"_orig_mod." + k: v.clone() for k, v in model.state_dict().items()}
        muon_state = {"state": {}, "param_groups": [{"lr": 0.025, "params": [0]}]}
        torch.save(dict(step=step, code=CODE, model=state, optimizers=[muon_state, muon_state]),
                   f"{out}/run/state_step{step:06d}.pt")

    def mean_loss(theta):
        with torch.no_grad():
            for p, t in zip(model.parameters(), theta):
                p.copy_(t)
        return model(inputs, targets) / targets.numel()

    loss10 = mean_loss(theta10).item()
    loss = mean_loss(theta20)
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, create_graph=True)
    u = [b - a for a, b in zip(theta10, theta20)]
    gu = sum((g * d).sum() for g, d in zip(grads, u))
    hvp = torch.autograd.grad(gu, params)
    flat = lambda ts: {n: t.detach().reshape(-1).tolist() for n, t in zip(names, ts)}
    reference = {
        "inputs": inputs.tolist(),
        "targets": targets.tolist(),
        "param_names": names,
        "loss": loss.item(),
        "loss_at_10": loss10,
        "grad": flat(grads),
        "direction": flat(u),
        "hvp": flat(hvp),
        "curvature": sum((h * d).sum() for h, d in zip(hvp, u)).item(),
    }
    with open(f"{out}/reference.json", "w") as f:
        json.dump(reference, f)


if __name__ == "__main__":
    main()
