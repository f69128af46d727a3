"""Fixtures of the Python package's tests (docs/python.md): tiny transformers models run wholly
in float64 (transformers computes RMSNorm, the rotary table and eager attention's softmax in
float32 whatever the model's dtype: replaced here by the same formulas in float64, as
tests/python/transformers_reference.py does for the built-in architectures' references), and
torch.autograd references."""
import os
import sys
import types

import pytest
import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/python


def eager_float64(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  softcap=None, **kwargs):
    """transformers' eager attention of every family here, with its softmax in the model's dtype
    (transformers runs it in float32)."""
    groups = getattr(module, "num_key_value_groups", 1)
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, :key.shape[-2]]
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _register_attention():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    AttentionInterface.register("eager_float64", eager_float64)
    AttentionMaskInterface.register("eager_float64", eager_mask)


def rope_float64(module, config):
    """The rotary table in float64: the default rope type's inverse frequencies over the rotated
    dimensions (all of a head, or GPT-NeoX's partial share), checked against transformers'
    float32 ones (tests/python/transformers_reference.py)."""
    import transformers_reference as ref
    d = 2 * module.inv_freq.numel()
    assert config.rope_parameters.get("rope_type", "default") == "default"
    base = config.rope_parameters["rope_theta"]
    ref.make_rope_float64(module, config,
                          1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)))


def rms_norm_float64(self, x):
    eps = getattr(self, "variance_epsilon", None) or getattr(self, "eps")
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gemma_rms_norm_float64(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def float64_model(model):
    """The model with transformers' float32 islands (RMSNorm, the rotary table, eager
    attention's softmax) computed in float64 by the same formulas."""
    _register_attention()
    model = model.double().eval()
    model.config._attn_implementation = "eager_float64"
    for m in model.modules():
        name = type(m).__name__
        if name == "GemmaRMSNorm":
            m.forward = types.MethodType(gemma_rms_norm_float64, m)
        elif name.endswith("RMSNorm"):
            m.forward = types.MethodType(rms_norm_float64, m)
        elif name.endswith("RotaryEmbedding"):
            rope_float64(m, model.config)
    return model


def autograd_reference(model, objective, batches, u, loss_fn=None):
    """L, g·u, uᵀHu, the HVP and the per-parameter u_iᵀ(Hu)_i by torch.autograd on the probe set's
    example-weighted mean loss, as libcurv defines it."""
    from curv._evaluator import IGNORE_INDEX, token_losses
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    sizes = [next(v for v in (b.values() if isinstance(b, dict) else b) if torch.is_tensor(v))
             .shape[0] if not torch.is_tensor(b) else b.shape[0] for b in batches]
    total = sum(sizes)
    loss = 0
    for b, n in zip(batches, sizes):
        out = objective(model, b)
        if isinstance(out, tuple):
            logits, targets = out
            per = token_losses(logits, targets, loss_fn)
            out = per.sum() / (targets != IGNORE_INDEX).sum()
        loss = loss + out * (n / total)
    g = torch.autograd.grad(loss, params, create_graph=True)
    uv = [u[n] for n, _ in named]
    gu = sum((gi * ui).sum() for gi, ui in zip(g, uv))
    hu = torch.autograd.grad(gu, params)
    return {"loss": loss.item(), "gu": gu.item(),
            "uhu": sum((h * ui).sum() for h, ui in zip(hu, uv)).item(),
            "hu": {n: h for (n, _), h in zip(named, hu)}}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


@pytest.fixture
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    return float64_model(LlamaForCausalLM(config))


def lm_batches(vocab=61, count=2, rows=3, length=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, vocab, (rows, length), generator=g)}
            for _ in range(count)]


def random_direction(model, scale=1e-2, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g, dtype=p.dtype) * scale
            for n, p in model.named_parameters()}
