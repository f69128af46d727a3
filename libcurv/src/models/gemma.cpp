// Gemma 2 (Hugging Face's Gemma2ForCausalLM) and Gemma 3's text model (Gemma3ForCausalLM,
// model_type gemma3_text): RMSNorms with gains 1 + w around each branch (before and after the
// attention and the MLP), the embedding scaled by √hidden, a GeGLU MLP, attention scaled by
// query_pre_attn_scalar^-½ with layers that alternate between a sliding window and the whole
// context. Gemma 2 soft-caps the attention scores and the logits (cap · tanh(s / cap)); Gemma 3
// normalises each query and key head (RMSNorm over head_dim) and gives its sliding layers their
// own rotary base. HF's parameter names and order, read from the config.json HF saves beside the
// weights.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "curv/models/fused_ops.h"
#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kFull = "full_attention";

struct GemmaConfig {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 256;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 32;
  int64_t max_position_embeddings = 256;
  double rms_norm_eps = 1e-6;
  double query_pre_attn_scalar = 32;  // the attention scale is its inverse square root
  // Each layer's kind, kSliding or kFull; empty: the generation's pattern (Gemma 2 alternates
  // starting with a sliding layer, Gemma 3 makes every sixth layer full).
  std::vector<std::string> layer_types;
  int64_t sliding_window = 64;
  double rope_theta = 10000.0;        // the full-attention layers' rotary base
  double rope_factor = 1.0;           // their linear rotary scaling (Gemma 3 4B and larger: 8)
  double rope_local_theta = 10000.0;  // the sliding layers' rotary base
  double attn_logit_softcapping = 0;  // 0: none
  double final_logit_softcapping = 0;
  bool qk_norm = false;   // Gemma 3's per-head query and key RMSNorms
  bool gelu_tanh = true;  // hidden_activation gelu_pytorch_tanh; false: exact gelu
  bool attention_bias = false;
  bool tie_word_embeddings = true;
  int64_t pad_token_id = -1;  // nn.Embedding's padding_idx: no gradient for that row; -1: none

  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  bool sliding(int64_t layer, int generation) const {
    if (!layer_types.empty()) return layer_types[static_cast<size_t>(layer)] == kSliding;
    return (layer + 1) % (generation == 2 ? 2 : 6) != 0;
  }
};

class Gemma : public CausalLanguageModel {
 public:
  Gemma(const GemmaConfig& c, int generation, const ModelInit& init)
      : CausalLanguageModel(init), c_(c), generation_(generation) {
    const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads;
    const int64_t KV = c.kv_heads(), F = c.intermediate_size;
    // Gemma's norms multiply by 1 + w: HF initialises w to 0.
    constexpr double kGain = 0.0;
    embed_ = add_token_embedding(c.vocab_size, C);
    // HF's named_parameters order: self_attn (q, k, v, o, then Gemma 3's q_norm, k_norm), mlp
    // (gate, up, down), then the four norms.
    const bool bias = c.attention_bias;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("model.layers.{}.", l);
      layer_ = l;
      Layer y;
      y.sliding = c.sliding(l, generation);
      y.q = add_linear(h + "self_attn.q_proj", H * D, C, bias, ParamRole::kAttentionQuery);
      y.k = add_linear(h + "self_attn.k_proj", KV * D, C, bias, ParamRole::kAttentionKey);
      y.v = add_linear(h + "self_attn.v_proj", KV * D, C, bias, ParamRole::kAttentionValue);
      y.o = add_linear(h + "self_attn.o_proj", C, H * D, bias, ParamRole::kAttentionOutput);
      if (c.qk_norm) {
        y.q_norm = add_gain(h + "self_attn.q_norm", D, kGain);
        y.k_norm = add_gain(h + "self_attn.k_norm", D, kGain);
      }
      y.gate = add_linear(h + "mlp.gate_proj", F, C, false, ParamRole::kMlpGate);
      y.up = add_linear(h + "mlp.up_proj", F, C, false, ParamRole::kMlpInput);
      y.down = add_linear(h + "mlp.down_proj", C, F, false, ParamRole::kMlpOutput);
      y.input_norm = add_gain(h + "input_layernorm", C, kGain);
      y.post_attention_norm = add_gain(h + "post_attention_layernorm", C, kGain);
      y.pre_mlp_norm = add_gain(h + "pre_feedforward_layernorm", C, kGain);
      y.post_mlp_norm = add_gain(h + "post_feedforward_layernorm", C, kGain);
      layers_.push_back(y);
    }
    layer_ = -1;
    norm_ = add_gain("model.norm", C, kGain);
    head_ = add_untied_head(c.vocab_size, C, c.tie_word_embeddings);
    finish();
  }

  ModelStructure structure() const override {
    return decoder_structure(c_.num_attention_heads, c_.kv_heads(), c_.head_dim,
                             c_.tie_word_embeddings);
  }

  std::string describe() const override {
    return ModelConfig(generation_ == 2 ? "gemma2" : "gemma3", c_).describe();
  }

 private:
  struct Layer {
    bool sliding = false;
    Linear q, k, v, o, gate, up, down;
    size_t q_norm = 0, k_norm = 0, input_norm = 0, post_attention_norm = 0, pre_mlp_norm = 0,
           post_mlp_norm = 0;
  };

  at::Tensor norm(const at::Tensor& x, size_t gain) const {
    return rms_norm(x, p(gain) + 1.0, c_.rms_norm_eps);
  }
  static at::Tensor softcap(const at::Tensor& x, double cap) {
    return cap > 0 ? at::tanh(x / cap) * cap : x;
  }
  void check(const Batch& batch) const override {
    check_token_batch(batch, generation_ == 2 ? "gemma2" : "gemma3", c_.vocab_size,
                      c_.max_position_embeddings);
  }

  size_t num_layers() const override { return layers_.size(); }
  at::Tensor embed(const at::Tensor& tokens) const override {
    const auto e = at::embedding(p(embed_), tokens, c_.pad_token_id);
    // HF multiplies by √hidden rounded to the model's dtype.
    return e * at::scalar_tensor(std::sqrt(static_cast<double>(c_.hidden_size)), e.options());
  }
  at::Tensor head(const at::Tensor& x) const override {
    return softcap(token_head(norm(x, norm_), embed_, head_, c_.tie_word_embeddings),
                   c_.final_logit_softcapping);
  }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = c_.num_attention_heads, KV = c_.kv_heads(), D = c_.head_dim;
    // The layer's rotary table: local (sliding) layers their own θ, global ones scaled.
    const RotaryTable rope = l.sliding ? layer_rotary_table(x, c_.rope_local_theta, D)
                                       : layer_rotary_table(x, c_.rope_theta, D, c_.rope_factor);
    AttentionScores scores;
    scores.scale = 1.0 / std::sqrt(c_.query_pre_attn_scalar);
    scores.softcap = c_.attn_logit_softcapping;
    scores.window = l.sliding ? c_.sliding_window : 0;
    const auto h = norm(x, l.input_norm);
    auto q = linear(h, l.q).view({B, T, H, D});
    auto k = linear(h, l.k).view({B, T, KV, D});
    if (c_.qk_norm) {
      q = norm(q, l.q_norm);
      k = norm(k, l.k_norm);
    }
    const auto v = linear(h, l.v).view({B, T, KV, D}).transpose(1, 2);
    const auto attention = causal_attention(apply_rotary(q.transpose(1, 2), rope),
                                            apply_rotary(k.transpose(1, 2), rope), v, scores);
    x = x + norm(linear(attention, l.o), l.post_attention_norm);
    const auto m = norm(x, l.pre_mlp_norm);
    const auto mlp = linear(fused_gelu(linear(m, l.gate), c_.gelu_tanh) * linear(m, l.up), l.down);
    return x + norm(mlp, l.post_mlp_norm);
  }

  GemmaConfig c_;
  int generation_;
  std::vector<Layer> layers_;
  size_t embed_ = 0, norm_ = 0, head_ = 0;
};

class GemmaArchitecture : public DeclaredConfigArchitecture<GemmaConfig> {
 public:
  explicit GemmaArchitecture(int generation) : generation_(generation) {}

  std::string name() const override { return generation_ == 2 ? "gemma2" : "gemma3"; }
  // Gemma 2 soft-caps, Gemma 3 normalises queries and keys: the defaults of absent keys.
  std::any defaults() const override { return generation_defaults(); }
  const ConfigFields<GemmaConfig>& fields() const override {
    using C = GemmaConfig;
    static const ConfigFields<C> fields = decoder_fields<C>(
        {{"num_key_value_heads", &C::num_key_value_heads, FieldBound::kNonNegative},
         {"head_dim", &C::head_dim, FieldBound::kPositive},
         {"rms_norm_eps", &C::rms_norm_eps, FieldBound::kPositive},
         {"query_pre_attn_scalar", &C::query_pre_attn_scalar, FieldBound::kPositive},
         {"layer_types", &C::layer_types},
         {"sliding_window", &C::sliding_window, FieldBound::kPositive},
         {"rope_theta", &C::rope_theta, FieldBound::kPositive},
         {"rope_factor", &C::rope_factor, FieldBound::kPositive},
         {"rope_local_theta", &C::rope_local_theta, FieldBound::kPositive},
         {"attn_logit_softcapping", &C::attn_logit_softcapping, FieldBound::kNonNegative},
         {"final_logit_softcapping", &C::final_logit_softcapping, FieldBound::kNonNegative},
         {"qk_norm", &C::qk_norm},
         {"gelu_tanh", &C::gelu_tanh},
         {"attention_bias", &C::attention_bias},
         {"tie_word_embeddings", &C::tie_word_embeddings},
         {"pad_token_id", &C::pad_token_id, FieldBound::kTokenId}});
    return fields;
  }
  void check_relations(const GemmaConfig& c) const override {
    check_attention_heads(c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.head_dim,
                          true);
    if (!c.layer_types.empty() &&
        static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
      throw InvalidArgument(
          fmt::format("model config: layer_types lists {} layers, num_hidden_layers = {}",
                      c.layer_types.size(), c.num_hidden_layers));
    }
    for (const auto& kind : c.layer_types) {
      if (kind != kSliding && kind != kFull) {
        throw InvalidArgument(
            fmt::format("model config: layer_types holds \"{}\"; each must be \"{}\" or \"{}\"",
                        kind, kSliding, kFull));
      }
    }
  }
  std::string describe_config(const GemmaConfig& c) const override {
    int64_t sliding = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) sliding += c.sliding(l, generation_);
    return fmt::format(
        "{}(layers={} ({} sliding, window {}), hidden={}, heads={}, kv_heads={}, head_dim={}, "
        "intermediate={}, vocab={}, context={}, tied={}{}{})",
        name(), c.num_hidden_layers, sliding, c.sliding_window, c.hidden_size,
        c.num_attention_heads, c.kv_heads(), c.head_dim, c.intermediate_size, c.vocab_size,
        c.max_position_embeddings, c.tie_word_embeddings,
        c.attn_logit_softcapping > 0
            ? fmt::format(", attention softcap {}", c.attn_logit_softcapping)
            : "",
        c.final_logit_softcapping > 0 ? fmt::format(", logit softcap {}", c.final_logit_softcapping)
                                      : "");
  }
  std::unique_ptr<Objective> build(const GemmaConfig& c, const ModelInit& init) const override {
    return std::make_unique<Gemma>(c, generation_, init);
  }
  ModelData data_of(const GemmaConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.max_position_embeddings;
    return d;
  }

  std::vector<std::string> hf_model_types() const override {
    return {generation_ == 2 ? "gemma2" : "gemma3_text"};
  }

  // Reads config.json as transformers 4.42 to 5.x write it for Gemma 2, and 4.50 to 5.x for
  // Gemma 3's text model (docs/checkpoints.md#hugging-face-models).
  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    const bool g2 = generation_ == 2;
    GemmaConfig c;
    c.vocab_size = r.integer("vocab_size", g2 ? 256000 : 262208);
    c.hidden_size = r.integer("hidden_size", 2304);
    c.intermediate_size = r.integer("intermediate_size", 9216);
    c.num_hidden_layers = r.integer("num_hidden_layers", 26);
    c.num_attention_heads = r.integer("num_attention_heads", 8);
    c.num_key_value_heads = r.integer("num_key_value_heads", 4);
    c.head_dim = r.integer("head_dim", 256);
    c.max_position_embeddings = r.integer("max_position_embeddings", g2 ? 8192 : 131072);
    c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
    c.query_pre_attn_scalar = r.number("query_pre_attn_scalar", 256);
    c.sliding_window = r.integer("sliding_window", 4096);
    c.attn_logit_softcapping = r.number("attn_logit_softcapping", g2 ? 50.0 : 0.0);
    c.final_logit_softcapping = r.number("final_logit_softcapping", g2 ? 30.0 : 0.0);
    c.attention_bias = r.boolean("attention_bias", false);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
    c.pad_token_id = r.integer("pad_token_id", 0);
    c.qk_norm = !g2;
    const std::string act = r.text("hidden_activation", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh" && act != "gelu") {
      r.unsupported("hidden_activation", "Gemma's GELUs built in are gelu_pytorch_tanh and gelu");
    }
    c.gelu_tanh = act == "gelu_pytorch_tanh";
    if (r.boolean("use_bidirectional_attention", false)) {
      r.unsupported("use_bidirectional_attention", "the causal language models are built in");
    }
    // Older configs name the pattern (every N-th layer full); transformers 5 lists layer_types.
    // (transformers 5 also writes Gemma 3's as _sliding_window_pattern).
    int64_t pattern = r.integer("sliding_window_pattern", g2 ? 2 : 6);
    pattern = r.integer("_sliding_window_pattern", pattern);
    if (pattern <= 0) r.unsupported("sliding_window_pattern", "it must be at least 1");
    if (const nlohmann::json* types = r.find("layer_types")) {
      if (!types->is_array()) r.unsupported("layer_types", "expected a list of layer kinds");
      for (const auto& kind : *types) {
        if (!kind.is_string() || (kind != kSliding && kind != kFull)) {
          r.unsupported("layer_types",
                        fmt::format("each layer must be \"{}\" or \"{}\"", kSliding, kFull));
        }
        c.layer_types.push_back(kind.get<std::string>());
      }
    } else {
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        c.layer_types.push_back((l + 1) % pattern != 0 ? kSliding : kFull);
      }
    }
    if (g2) {
      read_default_rope(r, "Gemma 2", c.rope_theta);
      c.rope_local_theta = c.rope_theta;
    } else {
      read_gemma3_rope(r, c);
    }
    // The KV-cache layout of generation, and dropout in eval mode.
    // hidden_act is the Gemma 1 name of the activation, which Gemma 2 and 3 read from
    // hidden_activation.
    r.ignore({"attention_dropout", "cache_implementation", "hidden_act"});
    r.finish();
    return c;
  }

 private:
  // Gemma 3's rotary bases: transformers 5's rope_parameters per layer kind, or 4.x's rope_theta
  // (full layers, default 1e6), rope_local_base_freq (sliding layers, default 1e4) and
  // rope_scaling (full layers only). The full layers may scale linearly; the rest is refused.
  static void read_gemma3_rope(HfConfigReader& r, GemmaConfig& c) {
    c.rope_theta = r.number("rope_theta", 1e6);
    c.rope_local_theta = r.number("rope_local_base_freq", 1e4);
    auto read_kind = [&](const nlohmann::json& spec, const std::string& where, double& theta,
                         double* factor) {
      if (!spec.is_object()) r.unsupported(where, "expected an object");
      HfConfigReader p(spec, fmt::format("{}: \"{}\"", r.origin(), where), false);
      theta = p.number("rope_theta", theta);
      const std::string type = p.text("rope_type", p.text("type", "default"));
      if (type == "linear" && factor) {
        *factor = p.number("factor", 1.0);
      } else if (type != "default") {
        p.unsupported("rope_type", factor ? "the full layers' rotary types built in are default "
                                            "and linear"
                                          : "the sliding layers' rotary type built in is default");
      }
      p.finish();
    };
    if (const nlohmann::json* scaling = r.find("rope_scaling")) {
      read_kind(*scaling, "rope_scaling", c.rope_theta, &c.rope_factor);
    }
    if (const nlohmann::json* rope = r.find("rope_parameters")) {
      if (!rope->is_object()) r.unsupported("rope_parameters", "expected an object");
      HfConfigReader kinds(*rope, fmt::format("{}: \"rope_parameters\"", r.origin()), false);
      if (const nlohmann::json* full = kinds.find(kFull)) {
        read_kind(*full, fmt::format("rope_parameters.{}", kFull), c.rope_theta, &c.rope_factor);
      }
      if (const nlohmann::json* local = kinds.find(kSliding)) {
        read_kind(*local, fmt::format("rope_parameters.{}", kSliding), c.rope_local_theta, nullptr);
      }
      kinds.finish();
    }
  }

  GemmaConfig generation_defaults() const {
    GemmaConfig c;
    c.qk_norm = generation_ == 3;
    if (generation_ == 2) {
      c.attn_logit_softcapping = 50.0;
      c.final_logit_softcapping = 30.0;
    }
    return c;
  }

  int generation_;
};

}  // namespace

std::shared_ptr<const Architecture> gemma2_architecture() {
  return std::make_shared<GemmaArchitecture>(2);
}

std::shared_ptr<const Architecture> gemma3_architecture() {
  return std::make_shared<GemmaArchitecture>(3);
}

}  // namespace curv
