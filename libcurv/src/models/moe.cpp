// Mixtures of experts with top-k routing, as Hugging Face's MixtralForCausalLM,
// OlmoeForCausalLM and Qwen3MoeForCausalLM compute them: LLaMA's pre-norm decoder (RMSNorm,
// rotary grouped-query attention) whose MLP is a router and a set of SwiGLU experts. Each token's
// router probabilities softmax(x Wᵣᵀ) pick its top k experts; the MLP's output is the sum of those
// experts' outputs weighted by their probabilities (renormalised over the k for Mixtral, and for
// OLMoE and Qwen3-MoE with norm_topk_prob). The choice is piecewise constant in θ, so the
// gradient and the HVP are those of the chosen experts with the routing held fixed; the weights
// stay differentiable, so the router has its gradient. The objective is the cross-entropy alone:
// the auxiliary load-balancing loss is left out. OLMoE normalises the whole query and key
// projections (as OLMo 2), Qwen3-MoE each head (as Qwen3) and may keep dense MLPs on some layers;
// Mixtral attends within a sliding window. Parameters are per expert, as the checkpoints store
// them (experts.<E>.w1 / gate_proj, ...), with HF's names and transformers 4.x's order.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

enum class MoeFamily { kMixtral, kOlmoe, kQwen3Moe };

struct MoeConfig {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 256;         // the dense MLPs' (Qwen3-MoE's mlp_only_layers)
  int64_t expert_intermediate_size = 128;  // each expert's
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 256;
  int64_t num_experts = 8;
  int64_t num_experts_per_tok = 2;
  bool norm_topk_prob = true;         // the k chosen probabilities renormalised to sum 1
  std::vector<int64_t> dense_layers;  // layers with a dense SwiGLU MLP instead of experts
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t sliding_window = 0;  // 0: none
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;  // nn.Embedding's padding_idx: no gradient for that row; -1: none

  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  bool dense(int64_t layer) const {
    return std::find(dense_layers.begin(), dense_layers.end(), layer) != dense_layers.end();
  }
};

const char* family_name(MoeFamily f) {
  switch (f) {
    case MoeFamily::kMixtral:
      return "mixtral";
    case MoeFamily::kOlmoe:
      return "olmoe";
    default:
      return "qwen3_moe";
  }
}

class MixtureOfExperts : public RmsNormDecoder {
 public:
  MixtureOfExperts(const MoeConfig& c, MoeFamily family, const ModelInit& init)
      : RmsNormDecoder(init, c.pad_token_id, c.rms_norm_eps, c.tie_word_embeddings),
        c_(c),
        family_(family) {
    const int64_t C = c.hidden_size, D = c.head_size(), H = c.num_attention_heads;
    const int64_t KV = c.kv_heads();
    const bool mixtral = family == MoeFamily::kMixtral;
    add_embedding(c.vocab_size, C);
    const bool bias = c.attention_bias;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("model.layers.{}.", l);
      layer_ = l;
      Layer y;
      y.q = add_linear(h + "self_attn.q_proj", H * D, C, bias, ParamRole::kAttentionQuery);
      y.k = add_linear(h + "self_attn.k_proj", KV * D, C, bias, ParamRole::kAttentionKey);
      y.v = add_linear(h + "self_attn.v_proj", KV * D, C, bias, ParamRole::kAttentionValue);
      y.o = add_linear(h + "self_attn.o_proj", C, H * D, bias, ParamRole::kAttentionOutput);
      if (family == MoeFamily::kOlmoe) {  // over the whole projections
        y.q_norm = add_gain(h + "self_attn.q_norm", H * D);
        y.k_norm = add_gain(h + "self_attn.k_norm", KV * D);
      } else if (family == MoeFamily::kQwen3Moe) {  // over each head
        y.q_norm = add_gain(h + "self_attn.q_norm", D);
        y.k_norm = add_gain(h + "self_attn.k_norm", D);
      }
      y.dense = c.dense(l);
      if (y.dense) {
        const int64_t F = c.intermediate_size;
        y.experts.push_back({add_linear(h + "mlp.gate_proj", F, C, false, ParamRole::kMlpGate),
                             add_linear(h + "mlp.up_proj", F, C, false, ParamRole::kMlpInput),
                             add_linear(h + "mlp.down_proj", C, F, false, ParamRole::kMlpOutput)});
      } else {
        // transformers 4.x's order: the router, then each expert's projections.
        const std::string moe = h + (mixtral ? "block_sparse_moe." : "mlp.");
        const int64_t F = c.expert_intermediate_size;
        y.router =
            add_param(moe + "gate.weight", draw_.normal({c.num_experts, C}), ParamRole::kRouter);
        for (expert_ = 0; expert_ < c.num_experts; ++expert_) {
          const std::string e = fmt::format("{}experts.{}.", moe, expert_);
          Expert x;
          if (mixtral) {
            x.gate = add_linear(e + "w1", F, C, false, ParamRole::kMlpGate);
            x.down = add_linear(e + "w2", C, F, false, ParamRole::kMlpOutput);
            x.up = add_linear(e + "w3", F, C, false, ParamRole::kMlpInput);
          } else {
            x.gate = add_linear(e + "gate_proj", F, C, false, ParamRole::kMlpGate);
            x.up = add_linear(e + "up_proj", F, C, false, ParamRole::kMlpInput);
            x.down = add_linear(e + "down_proj", C, F, false, ParamRole::kMlpOutput);
          }
          y.experts.push_back(x);
        }
        expert_ = -1;
      }
      y.input_norm = add_gain(h + "input_layernorm", C);
      y.post_attention_norm = add_gain(h + "post_attention_layernorm", C);
      layers_.push_back(y);
    }
    layer_ = -1;
    add_final_norm_and_head(c.vocab_size, C);
    finish();
  }

  ModelStructure structure() const override {
    ModelStructure s = decoder_structure(c_.num_attention_heads, c_.kv_heads(), c_.head_size(),
                                         c_.tie_word_embeddings);
    return s;
  }

  std::string describe() const override { return ModelConfig(family_name(family_), c_).describe(); }

  at::Tensor expert_choices(const Batch& batch) override {
    check(batch);
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> choices;
    choices_ = &choices;
    try {
      forward(batch.inputs);
    } catch (...) {
      choices_ = nullptr;
      throw;
    }
    choices_ = nullptr;
    return at::cat(choices, 0);
  }

 private:
  struct Expert {
    Linear gate, up, down;
  };
  struct Layer {
    Linear q, k, v, o;
    bool dense = false;
    size_t router = 0;
    std::vector<Expert> experts;  // the dense MLP alone on a dense layer
    size_t q_norm = 0, k_norm = 0, input_norm = 0, post_attention_norm = 0;
  };

  at::Tensor swiglu(const at::Tensor& x, const Expert& e) const {
    return at::linear(
        fused_gated_silu(at::linear(x, p(e.gate.weight)), at::linear(x, p(e.up.weight))),
        p(e.down.weight));
  }
  void check(const Batch& batch) const override {
    check_token_batch(batch, family_name(family_), c_.vocab_size, c_.max_position_embeddings);
  }

  // The experts' weighted sum over the tokens x [N, C]: each expert runs on the tokens that chose
  // it (the choice taken from values, so no derivative flows through it).
  at::Tensor mixture(const at::Tensor& x, const Layer& l) const {
    const int64_t k = c_.num_experts_per_tok;
    const auto probabilities = at::softmax(at::linear(x, p(l.router)), -1);
    const auto chosen = std::get<1>(at::topk(probabilities.detach(), k, -1));
    if (choices_) choices_->push_back(std::get<0>(at::sort(chosen, -1)));
    auto weights = probabilities.gather(1, chosen);
    if (c_.norm_topk_prob) weights = weights / weights.sum(-1, true);
    const auto flat_weights = weights.reshape({-1});
    auto out = at::zeros_like(x);
    for (int64_t e = 0; e < c_.num_experts; ++e) {
      const auto hits = (chosen == e).nonzero();  // (token, slot) pairs
      if (hits.size(0) == 0) continue;
      const auto tokens = hits.select(1, 0);
      const auto w = flat_weights.index_select(0, tokens * k + hits.select(1, 1));
      const auto y = swiglu(x.index_select(0, tokens), l.experts[static_cast<size_t>(e)]);
      out = out.index_add(0, tokens, y * w.unsqueeze(-1));
    }
    return out;
  }

  size_t num_layers() const override { return layers_.size(); }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1), C = c_.hidden_size;
    const int64_t H = c_.num_attention_heads, KV = c_.kv_heads(), D = c_.head_size();
    const RotaryTable rope = layer_rotary_table(x, c_.rope_theta, D);
    AttentionScores scores;
    scores.scale = 1.0 / std::sqrt(static_cast<double>(D));
    scores.window = c_.sliding_window;
    const auto h = norm(x, l.input_norm);
    auto q = linear(h, l.q);
    auto k = linear(h, l.k);
    if (family_ == MoeFamily::kOlmoe) {
      q = norm(q, l.q_norm);
      k = norm(k, l.k_norm);
    }
    q = q.view({B, T, H, D});
    k = k.view({B, T, KV, D});
    if (family_ == MoeFamily::kQwen3Moe) {
      q = norm(q, l.q_norm);
      k = norm(k, l.k_norm);
    }
    const auto v = linear(h, l.v).view({B, T, KV, D}).transpose(1, 2);
    const auto attention = causal_attention(apply_rotary(q.transpose(1, 2), rope),
                                            apply_rotary(k.transpose(1, 2), rope), v, scores);
    x = x + linear(attention, l.o);
    const auto m = norm(x, l.post_attention_norm);
    return x + (l.dense ? swiglu(m, l.experts.front())
                        : mixture(m.reshape({B * T, C}), l).view({B, T, C}));
  }

  MoeConfig c_;
  MoeFamily family_;
  std::vector<Layer> layers_;
  // Set while expert_choices runs the forward pass: each routed layer's choices, in order.
  std::vector<at::Tensor>* choices_ = nullptr;
};

class MoeArchitecture : public DeclaredConfigArchitecture<MoeConfig> {
 public:
  explicit MoeArchitecture(MoeFamily family) : family_(family) {}

  std::string name() const override { return family_name(family_); }
  // Mixtral renormalises the chosen probabilities, OLMoE and Qwen3-MoE do not by default: the
  // defaults of absent keys.
  std::any defaults() const override { return family_defaults(); }
  const ConfigFields<MoeConfig>& fields() const override {
    using C = MoeConfig;
    static const ConfigFields<C> fields = decoder_fields<C>(
        {{"expert_intermediate_size", &C::expert_intermediate_size, FieldBound::kPositive},
         {"num_key_value_heads", &C::num_key_value_heads, FieldBound::kNonNegative},
         {"head_dim", &C::head_dim, FieldBound::kNonNegative},
         {"num_experts", &C::num_experts, FieldBound::kPositive},
         {"num_experts_per_tok", &C::num_experts_per_tok, FieldBound::kPositive},
         {"norm_topk_prob", &C::norm_topk_prob},
         {"dense_layers", &C::dense_layers},
         {"rms_norm_eps", &C::rms_norm_eps, FieldBound::kPositive},
         {"rope_theta", &C::rope_theta, FieldBound::kPositive},
         {"sliding_window", &C::sliding_window, FieldBound::kNonNegative},
         {"attention_bias", &C::attention_bias},
         {"tie_word_embeddings", &C::tie_word_embeddings},
         {"pad_token_id", &C::pad_token_id, FieldBound::kTokenId}});
    return fields;
  }
  void check_relations(const MoeConfig& c) const override {
    check_attention_heads(c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.head_dim,
                          true);
    if (c.num_experts_per_tok > c.num_experts) {
      throw InvalidArgument(
          fmt::format("model config: num_experts_per_tok = {} exceeds num_experts = {}",
                      c.num_experts_per_tok, c.num_experts));
    }
    for (const int64_t l : c.dense_layers) {
      if (l < 0 || l >= c.num_hidden_layers) {
        throw InvalidArgument(fmt::format(
            "model config: dense_layers holds {}, not a layer of num_hidden_layers = {}", l,
            c.num_hidden_layers));
      }
    }
  }
  std::string describe_config(const MoeConfig& c) const override {
    return fmt::format(
        "{}(layers={}, hidden={}, heads={}, kv_heads={}, head_dim={}, experts={} (top {}{}, "
        "intermediate {}){}, vocab={}, context={}, tied={}{})",
        name(), c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.kv_heads(),
        c.head_size(), c.num_experts, c.num_experts_per_tok,
        c.norm_topk_prob ? ", renormalised" : "", c.expert_intermediate_size,
        c.dense_layers.empty() ? ""
                               : fmt::format(", dense layers {}", fmt::join(c.dense_layers, ",")),
        c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings,
        c.sliding_window > 0 ? fmt::format(", window {}", c.sliding_window) : "");
  }
  std::unique_ptr<Objective> build(const MoeConfig& c, const ModelInit& init) const override {
    return std::make_unique<MixtureOfExperts>(c, family_, init);
  }
  ModelData data_of(const MoeConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.max_position_embeddings;
    return d;
  }

  std::vector<std::string> hf_model_types() const override { return {family_name(family_)}; }

  // Reads config.json as transformers 4.40 to 5.x write it for Mixtral, OLMoE and Qwen3-MoE
  // (docs/checkpoints.md#mixtures-of-experts).
  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    MoeConfig c = family_defaults();
    const bool mixtral = family_ == MoeFamily::kMixtral, qwen = family_ == MoeFamily::kQwen3Moe;
    c.vocab_size = r.integer("vocab_size", mixtral ? 32000 : qwen ? 151936 : 50304);
    c.hidden_size = r.integer("hidden_size", mixtral ? 4096 : 2048);
    c.intermediate_size = r.integer("intermediate_size", mixtral ? 14336 : qwen ? 6144 : 2048);
    c.expert_intermediate_size =
        qwen ? r.integer("moe_intermediate_size", 768) : c.intermediate_size;
    c.num_hidden_layers = r.integer("num_hidden_layers", mixtral ? 32 : qwen ? 24 : 16);
    c.num_attention_heads = r.integer("num_attention_heads", mixtral ? 32 : qwen ? 32 : 16);
    c.num_key_value_heads = r.integer("num_key_value_heads", mixtral ? 8 : c.num_attention_heads);
    if (family_ != MoeFamily::kOlmoe) c.head_dim = r.integer("head_dim", 0);
    c.max_position_embeddings = r.integer("max_position_embeddings", 4096);
    // transformers 5 writes Qwen3-MoE's num_experts as num_local_experts.
    c.num_experts = mixtral ? r.integer("num_local_experts", 8)
                    : qwen  ? r.integer("num_experts", r.integer("num_local_experts", 128))
                            : r.integer("num_experts", 64);
    c.num_experts_per_tok = r.integer("num_experts_per_tok", mixtral ? 2 : 8);
    if (!mixtral) c.norm_topk_prob = r.boolean("norm_topk_prob", false);
    c.rms_norm_eps = r.number("rms_norm_eps", qwen ? 1e-6 : 1e-5);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    c.pad_token_id = r.integer("pad_token_id", -1);
    c.attention_bias = !mixtral && r.boolean("attention_bias", false);
    if (r.text("hidden_act", "silu") != "silu") {
      r.unsupported("hidden_act", "the experts built in are SwiGLU (silu)");
    }
    if (family_ == MoeFamily::kOlmoe && r.find("clip_qkv")) {
      r.unsupported("clip_qkv", "OLMoE's clamped projections are not built in");
    }
    if (mixtral) {
      c.sliding_window = r.integer("sliding_window", 0);
    } else if (qwen) {
      if (r.boolean("use_sliding_window", false)) {
        r.unsupported("use_sliding_window", "Qwen3-MoE's sliding window is not built in");
      }
      r.ignore({"sliding_window", "max_window_layers"});
      // Layers listed in mlp_only_layers, and all but every decoder_sparse_step-th, are dense.
      const int64_t step = r.integer("decoder_sparse_step", 1);
      if (step <= 0) r.unsupported("decoder_sparse_step", "it must be at least 1");
      std::vector<int64_t> only;
      if (const nlohmann::json* list = r.find("mlp_only_layers")) {
        if (!list->is_array()) r.unsupported("mlp_only_layers", "expected a list of layers");
        for (const auto& l : *list) {
          if (!l.is_number_integer()) r.unsupported("mlp_only_layers", "expected layer indices");
          only.push_back(l.get<int64_t>());
        }
      }
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (std::find(only.begin(), only.end(), l) != only.end() || (l + 1) % step != 0) {
          c.dense_layers.push_back(l);
        }
      }
    }
    if (const nlohmann::json* types = r.find("layer_types")) {
      for (const auto& kind : *types) {
        if (kind != "full_attention") {
          r.unsupported("layer_types", "every layer's attention is full_attention here");
        }
      }
    }
    read_default_rope(r, name().c_str(), c.rope_theta);
    // The load-balancing loss the objective leaves out, router noise (training only), and
    // dropout in eval mode.
    r.ignore({"router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
              "attention_dropout"});
    r.finish();
    return c;
  }

 private:
  MoeConfig family_defaults() const {
    MoeConfig c;
    c.norm_topk_prob = family_ == MoeFamily::kMixtral;
    return c;
  }

  MoeFamily family_;
};

}  // namespace

std::shared_ptr<const Architecture> mixtral_architecture() {
  return std::make_shared<MoeArchitecture>(MoeFamily::kMixtral);
}

std::shared_ptr<const Architecture> olmoe_architecture() {
  return std::make_shared<MoeArchitecture>(MoeFamily::kOlmoe);
}

std::shared_ptr<const Architecture> qwen3_moe_architecture() {
  return std::make_shared<MoeArchitecture>(MoeFamily::kQwen3Moe);
}

}  // namespace curv
