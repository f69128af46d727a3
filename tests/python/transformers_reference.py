"""Hugging Face folders written by transformers itself, and reference values from its own code.

A tiny model of one family (llama, llama3: Llama 3.1's rotary scaling, qwen2, qwen3, mistral,
gpt2, gpt_neox: Pythia's parallel residual and quarter-head rotary, gpt_neox_sequential: the
residual in turn, half-head rotary, gelu_new; olmo2; phi3; gemma2: soft-capped scores and
logits, a sliding window shorter than the probe; gemma3: per-head q/k norms, a rotary base per
layer kind, linear rotary scaling; mixtral, olmoe, qwen3_moe: mixtures of experts, the router's
softmax run in float64 too, experts_implementation "eager") is made with transformers' classes and
trained 4 steps on the CPU by transformers' Trainer
(AdamW, linear schedule decaying to 0, save_steps=2), which writes OUT/run/checkpoint-2 and
checkpoint-4 as users get them (config.json, model.safetensors, optimizer.pt, scheduler.pt,
trainer_state.json). For llama, OUT/sharded/ holds both checkpoints again in bfloat16, sharded
with a model.safetensors.index.json.

The reference runs transformers' modelling code in float64 with eager attention. For the LLaMA
family transformers computes three things in float32 whatever the model's dtype: RMSNorm's
normalisation (hidden_states.to(torch.float32); Gemma's x.float() with gains 1 + w), the rotary
table, and eager attention's softmax (softmax(..., dtype=torch.float32)). Those run here in
float64 with the same formulas: the first two by replacing the modules' forward, the third as an
attention function registered through transformers' AttentionInterface (with Gemma 2's
soft-capping); the float64 inverse frequencies are checked against transformers' float32 ones.
GPT-2's eager attention is float64 as it is.

At checkpoint-2 it writes, for the probe batch OUT/probe.safetensors (inputs, targets):
- delta: u = θ4 − θ2, the checkpoint delta;
- adamw: u = the step torch.optim.AdamW takes from checkpoint-2's optimizer.pt and scheduler.pt,
  with the Trainer's own parameter groups, on the probe-batch gradient;
with the loss, g·u, uᵀHu, ‖u‖² and L(θ + u) − L(θ) of each (for a mixture of experts also the share
of routing choices that differ at θ + u), and the loss of the bfloat16 folders.

usage: transformers_reference.py OUT ARCH
"""
import json
import math
import os
import sys
import types

import torch
import transformers
from safetensors.torch import save_file
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers import (AttentionInterface, AutoModelForCausalLM, Gemma2Config,
                          Gemma3TextConfig, GPT2Config, GPTNeoXConfig, LlamaConfig, MistralConfig,
                          MixtralConfig, OlmoeConfig, Olmo2Config, Phi3Config, Qwen2Config,
                          Qwen3Config, Qwen3MoeConfig, Trainer, TrainingArguments)

VOCAB, T, STEPS = 61, 12, 4
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)


def config_of(arch):
    if arch == "llama":  # grouped-query attention, untied head
        return LlamaConfig(**SMALL, num_key_value_heads=2)
    if arch == "llama3":  # Llama 3.1's rotary scaling: every band of wavelengths is present
        return LlamaConfig(**SMALL, num_key_value_heads=4, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16})
    if arch == "qwen2":  # q/k/v biases, tied head, rope_theta 1e6
        return Qwen2Config(**SMALL, num_key_value_heads=2, tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if arch == "qwen3":  # q/k RMSNorm, head_dim != hidden / heads
        return Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16)
    if arch == "mistral":  # head_dim != hidden / heads, a sliding window longer than the probe
        return MistralConfig(**SMALL, num_key_value_heads=2, head_dim=16, sliding_window=4096)
    if arch == "gpt_neox":  # Pythia's defaults: parallel residual, rotary_pct 0.25
        return GPTNeoXConfig(**SMALL)
    if arch == "gpt_neox_sequential":
        return GPTNeoXConfig(**SMALL, use_parallel_residual=False, hidden_act="gelu_new",
                             rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                              "partial_rotary_factor": 0.5})
    # post-norms, q/k RMSNorm over the whole projections; pad_token_id 1 (a token of the data):
    # HF's padding row gets no gradient, so its AdamW step differs from the plain gradient's
    if arch == "olmo2":
        return Olmo2Config(**SMALL, num_key_value_heads=2)
    if arch == "phi3":  # fused qkv_proj and gate_up_proj, half-head rotary, a padding token
        return Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=3, bos_token_id=1,
                          eos_token_id=2, rope_parameters={"rope_type": "default",
                                                           "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.5})
    # Alternating sliding (window 5 < T) and full layers; caps small enough that tanh bends the
    # scores and logits of a model this size; an untied head.
    if arch == "gemma2":
        return Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=16, sliding_window=5,
                            query_pre_attn_scalar=16, attn_logit_softcapping=0.1,
                            final_logit_softcapping=1.0, tie_word_embeddings=False)
    # Gemma 3 4B's rotary setting (linear factor 8 on the full layers' base 1e6, base 1e4 on the
    # sliding ones), exact gelu, the tied head.
    if arch == "gemma3":
        return Gemma3TextConfig(
            **SMALL, num_key_value_heads=2, head_dim=16, sliding_window=5,
            query_pre_attn_scalar=16, hidden_activation="gelu",
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    # Mixtures of experts, 4 experts, top 2: Mixtral (renormalised top-k, a sliding window shorter
    # than the probe), OLMoE (q/k norms over the whole projections, probabilities as they are),
    # Qwen3-MoE (per-head q/k norms, renormalised, its second layer a dense MLP).
    if arch == "mixtral":
        return MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4,
                             num_experts_per_tok=2, sliding_window=5)
    if arch == "olmoe":
        return OlmoeConfig(**SMALL, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                           eos_token_id=2)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**SMALL, num_key_value_heads=2, head_dim=16, num_experts=4,
                              num_experts_per_tok=2, moe_intermediate_size=24,
                              norm_topk_prob=True, mlp_only_layers=[1])
    if arch == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                          bos_token_id=0, eos_token_id=0)
    raise SystemExit(f"unknown arch {arch}")


def eager_attention_in_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0,
                             softcap=None, **kwargs):
    """transformers' eager_attention_forward of the LLaMA and Gemma families with its softmax in
    the model's dtype."""
    groups = getattr(module, "num_key_value_groups", 1)
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


AttentionInterface.register("eager_in_dtype", eager_attention_in_dtype)
# The additive causal (and sliding-window) masks eager attention gets.
AttentionMaskInterface.register("eager_in_dtype", eager_mask)


def rms_norm_float64(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def gemma_rms_norm_float64(self, x):
    return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def inverse_frequencies(c, rope=None):
    """The rotary inverse frequencies of transformers' rope types, in float64."""
    rope = rope or c.rope_parameters
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    d = int(d * rope.get("partial_rotary_factor", 1.0))  # GPT-NeoX rotates part of each head
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        return inv / rope["factor"]
    if kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        context = rope["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv
        scaled = torch.where(wavelength > context / low, inv / factor, inv)
        smooth = (context / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        band = (wavelength >= context / high) & (wavelength <= context / low)
        return torch.where(band, smoothed, scaled)
    assert kind == "default", kind
    return inv


def make_rope_float64(module, config, inv=None):
    """The module's rotary table computed in float64 from `inv` (default: the config's inverse
    frequencies)."""
    inv = inverse_frequencies(config) if inv is None else inv
    # The same frequencies as transformers' own rope_init_fn, to its float32 rounding.
    assert torch.allclose(inv, module.inv_freq.to(torch.float64), rtol=1e-6, atol=0), \
        (inv, module.inv_freq)
    module.inv_freq64 = inv

    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].to(torch.float64) * self.inv_freq64.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.attention_scaling).to(x.dtype),
                (emb.sin() * self.attention_scaling).to(x.dtype))

    module.forward = types.MethodType(forward, module)


def make_layer_rope_float64(module, config):
    """Gemma 3's rotary tables, one per layer kind, computed in float64."""
    for kind in module.layer_types:
        inv = inverse_frequencies(config, config.rope_parameters[kind])
        assert torch.allclose(inv, getattr(module, f"{kind}_inv_freq").to(torch.float64),
                              rtol=1e-6, atol=0), kind
        assert getattr(module, f"{kind}_attention_scaling") == 1.0, kind
        setattr(module, f"{kind}_inv_freq64", inv)

    def forward(self, x, position_ids, layer_type):
        inv = getattr(self, f"{layer_type}_inv_freq64").to(x.device)
        freqs = position_ids[:, :, None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    module.forward = types.MethodType(forward, module)


def router_float64(self, hidden_states):
    """transformers' top-k router with its softmax in the model's dtype."""
    logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    probabilities = torch.softmax(logits, dim=-1)
    top, chosen = torch.topk(probabilities, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):  # Mixtral always renormalises
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, chosen


MOE = ("mixtral", "olmoe", "qwen3_moe")


def load_float64(folder):
    model_type = json.load(open(f"{folder}/config.json"))["model_type"]
    extra = {"experts_implementation": "eager"} if model_type in MOE else {}
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float64,
        attn_implementation="eager" if model_type == "gpt2" else "eager_in_dtype", **extra)
    model.eval()
    for m in model.modules():
        name = type(m).__name__
        if name.startswith("Gemma") and name.endswith("RMSNorm"):
            m.forward = types.MethodType(gemma_rms_norm_float64, m)
        elif name.endswith("RMSNorm"):
            m.forward = types.MethodType(rms_norm_float64, m)
        elif name.endswith("RotaryEmbedding") and hasattr(m, "layer_types"):
            make_layer_rope_float64(m, model.config)
        elif name.endswith("RotaryEmbedding"):
            make_rope_float64(m, model.config)
        elif name.endswith("TopKRouter"):
            m.forward = types.MethodType(router_float64, m)
        elif name.endswith("ScaledWordEmbedding"):  # √hidden, in float64 as the model is
            assert m.embed_scale.dtype == torch.float64
            assert m.embed_scale.item() == model.config.hidden_size ** 0.5
    return model


def loss_of(model, inputs, targets):
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             targets.reshape(-1))


def audit(model, inputs, targets, u):
    """loss, g·u, uᵀHu, ‖u‖², L(θ + u) − L(θ) of the model's parameters, exact autograd."""
    params = [p for _, p in model.named_parameters()]
    loss = loss_of(model, inputs, targets)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    gu = sum((g * v).sum() for g, v in zip(grads, u))
    hu = torch.autograd.grad(gu, params)
    out = {"loss": loss.item(), "first_order": gu.item(),
           "curvature": sum((h * v).sum() for h, v in zip(hu, u)).item(),
           "sq_norm": sum((v * v).sum() for v in u).item()}
    with torch.no_grad():
        before = expert_choices(model, inputs)
        for p, v in zip(params, u):
            p.add_(v)
        out["realized"] = loss_of(model, inputs, targets).item() - out["loss"]
        after = expert_choices(model, inputs)
        for p, v in zip(params, u):
            p.sub_(v)
    if before:
        changed = sum((a != b).any(-1).sum().item() for a, b in zip(before, after))
        out["routing_changed"] = changed / sum(a.shape[0] for a in before)
    return out


def expert_choices(model, inputs):
    """Each routed layer's top-k experts per token (sorted), from its router's own output."""
    chosen = []
    hooks = [m.register_forward_hook(lambda m, i, o: chosen.append(o[2].sort(-1).values))
             for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    if hooks:
        model(input_ids=inputs)
    for h in hooks:
        h.remove()
    return chosen


def training_args(out):
    return TrainingArguments(
        output_dir=out, max_steps=STEPS, save_steps=2, per_device_train_batch_size=4,
        learning_rate=3e-3, weight_decay=0.1, lr_scheduler_type="linear", warmup_steps=0,
        logging_steps=100, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        save_total_limit=None, dataloader_num_workers=0)


def adamw_step(folder, args, inputs, targets):
    """The step the Trainer's AdamW takes from `folder`'s saved state on the probe gradient."""
    model = load_float64(folder)
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=STEPS)
    optimizer = torch.optim.AdamW(trainer.optimizer.param_groups, foreach=False)
    optimizer.load_state_dict(torch.load(f"{folder}/optimizer.pt", weights_only=True))
    trainer.lr_scheduler.load_state_dict(torch.load(f"{folder}/scheduler.pt", weights_only=True))
    before = [p.detach().clone() for p in model.parameters()]
    model.zero_grad()
    loss_of(model, inputs, targets).backward()
    optimizer.step()
    step = [p.detach() - b for p, b in zip(model.parameters(), before)]
    lrs = [g["lr"] for g in optimizer.param_groups]
    return step, lrs


def saved_expert_names(arch, names, experts):
    """transformers 5 holds each layer's experts in two fused tensors (experts.gate_up_proj,
    experts.down_proj) and saves them per expert, as the published checkpoints and 4.x's modules
    name them; the names of 4.x's parameters, in its order (the router, then each expert's)."""
    out = []
    for n in names:
        layer, _, leaf = n.partition(".mlp.")
        if not leaf:
            out.append(n)
        elif leaf == "experts.gate_up_proj":
            module = "block_sparse_moe" if arch == "mixtral" else "mlp"
            parts = ("w1", "w2", "w3") if arch == "mixtral" else ("gate_proj", "up_proj",
                                                                  "down_proj")
            out.append(f"{layer}.{module}.gate.weight")
            for e in range(experts):
                out += [f"{layer}.{module}.experts.{e}.{p}.weight" for p in parts]
        elif leaf not in ("gate.weight", "experts.down_proj"):
            out.append(n)
    return out


def main():
    out, arch = sys.argv[1], sys.argv[2]
    run = f"{out}/run"
    torch.manual_seed(0)
    config = config_of(arch)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, VOCAB, (32, T + 1), generator=g)]
    trainer = Trainer(model=model, args=training_args(run), train_dataset=data)
    trainer.train()

    inputs = torch.randint(0, VOCAB, (3, T), generator=g)
    targets = torch.randint(0, VOCAB, (3, T), generator=g)
    save_file({"inputs": inputs, "targets": targets}, f"{out}/probe.safetensors")

    at2, at4 = load_float64(f"{run}/checkpoint-2"), load_float64(f"{run}/checkpoint-4")
    # GPT-NeoX's head is the module lm_head, saved as embed_out.weight (Pythia's name).
    names = [("embed_out.weight" if arch.startswith("gpt_neox") and n == "lm_head.weight" else n)
             for n, _ in at2.named_parameters()]
    if arch in MOE:
        names = saved_expert_names(arch, names, config.num_local_experts
                                   if arch == "mixtral" else config.num_experts)
    delta = [b.detach() - a.detach() for a, b in zip(at2.parameters(), at4.parameters())]
    ref = {"transformers": transformers.__version__, "torch": torch.__version__,
           "param_names": names,
           "loss_at_4": loss_of(at4, inputs, targets).item(),
           "delta": audit(at2, inputs, targets, delta)}
    step, lrs = adamw_step(f"{run}/checkpoint-2", training_args(f"{out}/unused"), inputs, targets)
    ref["adamw"] = audit(at2, inputs, targets, step)
    ref["adamw"]["lr"] = lrs
    _, lrs4 = adamw_step(f"{run}/checkpoint-4", training_args(f"{out}/unused"), inputs, targets)
    ref["lr_at_4"] = lrs4

    if arch == "llama":
        for step_dir in ("checkpoint-2", "checkpoint-4"):
            m = AutoModelForCausalLM.from_pretrained(f"{run}/{step_dir}", dtype=torch.bfloat16)
            m.save_pretrained(f"{out}/sharded/{step_dir}", max_shard_size="20KB")
        ref["bf16_loss_at_2"] = loss_of(load_float64(f"{out}/sharded/checkpoint-2"), inputs,
                                        targets).item()
        ref["bf16_shards"] = len([f for f in os.listdir(f"{out}/sharded/checkpoint-2")
                                  if f.endswith(".safetensors")])
    with open(f"{out}/reference.json", "w") as f:
        json.dump(ref, f, indent=1)


if __name__ == "__main__":
    main()
