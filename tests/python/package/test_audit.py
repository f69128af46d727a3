"""The package's audit on nn.Modules against torch.autograd in float64 (≤ 1e-10)."""
import pytest
import torch

import curv
from conftest import autograd_reference, float64_model, lm_batches, random_direction, rel

TOL = 1e-10


def check_against_autograd(probe, model, objective, batches, u, loss_fn=None):
    ref = autograd_reference(model, objective, batches, u, loss_fn)
    audit = probe.audit(u)
    assert rel(audit.loss, ref["loss"]) < TOL
    assert rel(audit.first_order, ref["gu"]) < TOL
    assert rel(audit.curvature, ref["uhu"]) < TOL
    sq = sum((t * t).sum().item() for t in u.values())
    assert rel(audit.nds, ref["uhu"] / sq) < TOL
    # The blocks' row sums u_lᵀ(Hu)_l from the reference HVP, and the /taylor table's total row.
    hvp = probe.hvp(u)
    for name, h in ref["hu"].items():
        assert (hvp[name] - h).abs().max().item() <= TOL * h.abs().max().item() + 1e-300
    total = audit.table[audit.table.block == "total"].iloc[0]
    assert total.nds == audit.nds and total.first_order == audit.first_order
    assert abs(audit.blocks.row_sum.sum() - audit.curvature) < 1e-12 * abs(audit.curvature) + 1e-15
    assert abs(audit.coupling.values.sum() - audit.curvature) < 1e-10 * abs(audit.curvature)
    return audit


def test_llama_logits_and_targets(llama):
    batches = lm_batches()
    probe = curv.Probe(llama, batches)
    assert probe.blocks == ["embeddings", "model.layers.0", "model.layers.1", "head"]
    assert probe.roles["model.layers.0.self_attn.k_proj.weight"] == "key"
    audit = check_against_autograd(probe, llama, curv.causal_lm, batches, random_direction(llama))
    assert audit.status == "complete" and audit.table.shape[0] == 5


def test_scalar_loss_and_micro_batches_give_the_same_numbers(llama):
    batches = lm_batches()
    u = random_direction(llama)
    logits = curv.Probe(llama, batches).audit(u)

    def scalar(model, batch):
        lg, t = curv.causal_lm(model, batch)
        return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), t.reshape(-1))

    loss = curv.Probe(llama, batches, scalar).audit(u)
    sliced = curv.Probe(llama, batches, micro_batch=1).audit(u)
    for other in (loss, sliced):
        assert rel(other.curvature, logits.curvature) < TOL
        assert rel(other.first_order, logits.first_order) < TOL
    with pytest.raises(ValueError, match="Gauss-Newton split needs"):
        curv.Probe(llama, batches, scalar).audit(u, ggn=True)
    with pytest.raises(ValueError, match="token buckets need"):
        curv.Probe(llama, batches, scalar).token_buckets(u)


def test_vector_dtype_sets_the_gradients_and_products_dtype(llama):
    batches = lm_batches()
    u = random_direction(llama)
    wide = curv.Probe(llama, batches)
    narrow = curv.Probe(llama, batches, vector_dtype=torch.float32, host_copies=True)
    g64, g32 = wide.gradient(), narrow.gradient()
    hv64, hv32 = wide.hvp(u), narrow.hvp(u)
    for name, g in g32.items():
        assert g.dtype == torch.float32 and g64[name].dtype == torch.float64
        assert hv32[name].dtype == torch.float32
        # The model stays float64: only the vectors' storage is rounded.
        assert (g.double() - g64[name]).abs().max().item() <= 1e-6 * g64[name].abs().max().item()
    assert rel(narrow.audit(u).curvature, wide.audit(u).curvature) < 1e-6
    with pytest.raises(ValueError, match="vector_dtype torch.int64"):
        curv.Probe(llama, batches, vector_dtype=torch.int64)


def test_gemma_tied_head():
    from transformers import GemmaConfig, GemmaForCausalLM
    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                         max_position_embeddings=64, tie_word_embeddings=True)
    model = float64_model(GemmaForCausalLM(config))
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # tied: one parameter
    batches = lm_batches()
    probe = curv.Probe(model, batches)
    check_against_autograd(probe, model, curv.causal_lm, batches, random_direction(model))


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3)
        self.conv2 = torch.nn.Conv2d(4, 6, 3)
        self.fc = torch.nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        x = torch.tanh(self.conv1(x))
        x = torch.nn.functional.softplus(self.conv2(x))
        return self.fc(x.flatten(1))


def test_cnn_on_images_with_a_non_lm_loss():
    torch.manual_seed(0)
    model = SmallCnn().double()
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(7, 1, 8, 8, generator=g, dtype=torch.float64),
                torch.randint(0, 5, (7,), generator=g)) for _ in range(3)]
    u = random_direction(model, 0.1)
    check_against_autograd(curv.Probe(model, batches, curv.classifier), model, curv.classifier,
                           batches, u)

    def huber(model, batch):  # a scalar loss with no logits: mean Huber loss on one-hot targets
        x, y = batch
        onehot = torch.nn.functional.one_hot(y, 5).double()
        return torch.nn.functional.smooth_l1_loss(model(x), onehot)

    check_against_autograd(curv.Probe(model, batches, huber), model, huber, batches, u)
    # A per-token loss in place of cross-entropy: (logits, targets) -> losses shaped like targets.
    focal = lambda logits, t: -(1 - logits.softmax(-1).gather(-1, t[:, None])[:, 0]) ** 2 * \
        logits.log_softmax(-1).gather(-1, t[:, None])[:, 0]
    check_against_autograd(curv.Probe(model, batches, curv.classifier, loss_fn=focal), model,
                           curv.classifier, batches, u, loss_fn=focal)


def test_spectrum_within_and_buckets_run_on_a_module(llama):
    batches = lm_batches()
    probe = curv.Probe(llama, batches)
    u = random_direction(llama)
    eig = probe.eigenvalues(2)
    assert eig.status == "converged" and eig.largest[0] >= eig.largest[1]
    # λ_max is the Rayleigh quotient of its own eigenvector, by torch.autograd.
    v = eig.vectors[0]
    offsets, vec = 0, {}
    for n, p in llama.named_parameters():
        vec[n] = v[offsets:offsets + p.numel()].reshape(p.shape)
        offsets += p.numel()
    ref = autograd_reference(llama, curv.causal_lm, batches, vec)
    assert rel(ref["uhu"], eig.largest[0]) < 1e-6
    within = probe.within(u)
    assert "model.layers.0.self_attn.q_proj.weight" in set(within.summary().name)
    q = next(p for p in within.params if p.name.endswith("0.self_attn.q_proj.weight"))
    assert any(name.startswith("head") for name in q.groups.name)  # 4 heads from the config
    buckets = probe.token_buckets(u)
    assert list(buckets.table.bucket) == ["head", "tail"]
    assert probe.trace(matvecs=12).estimate == probe.trace(matvecs=12).estimate


def test_attention_without_double_backward_is_named():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, max_position_embeddings=64,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    probe = curv.Probe(model, lm_batches())
    u = random_direction(model)
    try:
        probe.audit(u)
    except curv.AttentionDoubleBackwardError as e:
        assert "model.layers.0.self_attn" in str(e) and 'attn_implementation="eager"' in str(e)
    else:  # this torch's kernel has a double backward here: then it must be right
        eager = LlamaForCausalLM(config.__class__(**{**config.to_dict(),
                                                     "attn_implementation": "eager"}))
        eager.load_state_dict(model.state_dict())
        a, b = probe.audit(u), curv.Probe(eager, lm_batches()).audit(u)
        assert rel(a.curvature, b.curvature) < 1e-4


def test_bad_input_is_named(llama):
    with pytest.raises(ValueError, match="no batch"):
        curv.Probe(llama, [])
    probe = curv.Probe(llama, lm_batches())
    u = random_direction(llama)
    u["model.norm.weight"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="model.norm.weight"):
        probe.audit(u)

    def broken(model, batch):
        if not torch.is_grad_enabled():
            return curv.causal_lm(model, batch)
        raise KeyError("labels")

    with pytest.raises(KeyError, match="labels"):
        curv.Probe(llama, lm_batches(), broken).audit(random_direction(llama))


def family(name):
    from transformers import (GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM,
                              Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM)
    small = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=64)
    if name == "olmo2":  # post-norms, q/k RMSNorm over the whole projection
        return Olmo2ForCausalLM(Olmo2Config(**small, num_key_value_heads=2))
    if name == "phi3":  # fused qkv_proj and gate_up_proj
        return Phi3ForCausalLM(Phi3Config(**small, num_key_value_heads=2, pad_token_id=0))
    if name == "gpt_neox":  # parallel residual, partial rotary, fused interleaved qkv
        return GPTNeoXForCausalLM(GPTNeoXConfig(**small, rotary_pct=0.5, eos_token_id=0,
                                                bos_token_id=0, tie_word_embeddings=False))
    if name == "gpt2":  # Conv1D weights, tied head
        return GPT2LMHeadModel(GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4,
                                          n_positions=64, bos_token_id=0, eos_token_id=0))
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["olmo2", "phi3", "gpt_neox", "gpt2"])
def test_transformers_families_without_a_built_in(name):
    torch.manual_seed(0)
    model = float64_model(family(name))
    batches = lm_batches()
    probe = curv.Probe(model, batches)
    check_against_autograd(probe, model, curv.causal_lm, batches, random_direction(model))
    roles = probe.roles
    expect = {"olmo2": {"model.layers.0.self_attn.q_norm.weight": "norm_gain",
                        "model.layers.1.post_feedforward_layernorm.weight": "norm_gain"},
              "phi3": {"model.layers.0.self_attn.qkv_proj.weight": "fused_qkv",
                       "model.layers.0.mlp.gate_up_proj.weight": "mlp_input"},
              "gpt_neox": {"gpt_neox.embed_in.weight": "token_embedding",
                           "lm_head.weight": "output_head",
                           "gpt_neox.layers.0.attention.dense.weight": "attention_output",
                           "gpt_neox.layers.0.mlp.dense_4h_to_h.weight": "mlp_output"},
              "gpt2": {"transformer.h.0.attn.c_attn.weight": "fused_qkv",
                       "transformer.wpe.weight": "position_embedding"}}[name]
    for param, role in expect.items():
        assert roles[param] == role, (param, roles[param])
    assert len(probe.blocks) == 4  # embeddings, two layers, head


def test_roles_and_head_counts_can_be_overridden(llama):
    probe = curv.Probe(llama, lm_batches(), roles={r"mlp\.up_proj": "other"}, heads=(2, 2, 16),
                       blocks=curv.BlockRule.COMPONENT)
    assert probe.roles["model.layers.0.mlp.up_proj.weight"] == "other"
    assert "model.layers.0.attn.qk" in probe.blocks
    q = probe.within(random_direction(llama), param_regex=r"layers\.0\.self_attn\.q_proj").params[0]
    assert sorted(n for n in q.groups.name if n.startswith("head")) == ["head0", "head1"]
    with pytest.raises(ValueError, match="unknown parameter role 'mlp'"):
        curv.Probe(llama, lm_batches(), roles={"mlp": "mlp"})
