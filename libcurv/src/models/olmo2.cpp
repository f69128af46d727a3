// OLMo 2 (Hugging Face's Olmo2ForCausalLM): LLaMA's attention and SwiGLU MLP with the norms after
// each branch (x + norm(attn(x)), then x + norm(mlp(x))) and an RMSNorm over the whole query and
// key projections (all heads together) before the rotation. HF's parameter names and order, read
// from the config.json HF saves beside the weights.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

struct Olmo2Config {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 344;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t max_position_embeddings = 256;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;  // nn.Embedding's padding_idx: no gradient for that row; -1: none
  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const { return hidden_size / num_attention_heads; }
};

class Olmo2 : public RmsNormDecoder {
 public:
  Olmo2(const Olmo2Config& c, const ModelInit& init)
      : RmsNormDecoder(init, c.pad_token_id, c.rms_norm_eps, c.tie_word_embeddings), c_(c) {
    const int64_t C = c.hidden_size, D = c.head_size(), H = c.num_attention_heads;
    const int64_t KV = c.kv_heads(), F = c.intermediate_size;
    add_embedding(c.vocab_size, C);
    // HF's named_parameters order: self_attn (q, k, v, o, q_norm, k_norm), mlp (gate, up,
    // down), then the two post-norms.
    const bool bias = c.attention_bias;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("model.layers.{}.", l);
      layer_ = l;
      Layer y;
      y.q = add_linear(h + "self_attn.q_proj", H * D, C, bias, ParamRole::kAttentionQuery);
      y.k = add_linear(h + "self_attn.k_proj", KV * D, C, bias, ParamRole::kAttentionKey);
      y.v = add_linear(h + "self_attn.v_proj", KV * D, C, bias, ParamRole::kAttentionValue);
      y.o = add_linear(h + "self_attn.o_proj", C, H * D, bias, ParamRole::kAttentionOutput);
      y.q_norm = add_gain(h + "self_attn.q_norm", H * D);
      y.k_norm = add_gain(h + "self_attn.k_norm", KV * D);
      y.gate = add_linear(h + "mlp.gate_proj", F, C, false, ParamRole::kMlpGate);
      y.up = add_linear(h + "mlp.up_proj", F, C, false, ParamRole::kMlpInput);
      y.down = add_linear(h + "mlp.down_proj", C, F, false, ParamRole::kMlpOutput);
      y.post_attention_norm = add_gain(h + "post_attention_layernorm", C);
      y.post_mlp_norm = add_gain(h + "post_feedforward_layernorm", C);
      layers_.push_back(y);
    }
    layer_ = -1;
    add_final_norm_and_head(c.vocab_size, C);
    finish();
  }

  ModelStructure structure() const override {
    return decoder_structure(c_.num_attention_heads, c_.kv_heads(), c_.head_size(),
                             c_.tie_word_embeddings);
  }

  std::string describe() const override { return ModelConfig("olmo2", c_).describe(); }

 private:
  struct Layer {
    Linear q, k, v, o, gate, up, down;
    size_t q_norm = 0, k_norm = 0, post_attention_norm = 0, post_mlp_norm = 0;
  };

  void check(const Batch& batch) const override {
    check_token_batch(batch, "olmo2", c_.vocab_size, c_.max_position_embeddings);
  }

  size_t num_layers() const override { return layers_.size(); }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = c_.num_attention_heads, KV = c_.kv_heads(), D = c_.head_size();
    const RotaryTable rope = layer_rotary_table(x, c_.rope_theta, D);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto q = norm(linear(x, l.q), l.q_norm).view({B, T, H, D}).transpose(1, 2);
    auto k = norm(linear(x, l.k), l.k_norm).view({B, T, KV, D}).transpose(1, 2);
    auto v = linear(x, l.v).view({B, T, KV, D}).transpose(1, 2);
    auto attention = causal_attention(apply_rotary(q, rope), apply_rotary(k, rope), v, scale);
    x = x + norm(linear(attention, l.o), l.post_attention_norm);
    auto mlp = linear(fused_gated_silu(linear(x, l.gate), linear(x, l.up)), l.down);
    return x + norm(mlp, l.post_mlp_norm);
  }

  Olmo2Config c_;
  std::vector<Layer> layers_;
};

class Olmo2Architecture : public DeclaredConfigArchitecture<Olmo2Config> {
 public:
  std::string name() const override { return "olmo2"; }
  const ConfigFields<Olmo2Config>& fields() const override {
    using C = Olmo2Config;
    static const ConfigFields<C> fields = decoder_fields<C>(
        {{"num_key_value_heads", &C::num_key_value_heads, FieldBound::kNonNegative},
         {"rms_norm_eps", &C::rms_norm_eps, FieldBound::kPositive},
         {"rope_theta", &C::rope_theta, FieldBound::kPositive},
         {"attention_bias", &C::attention_bias},
         {"tie_word_embeddings", &C::tie_word_embeddings},
         {"pad_token_id", &C::pad_token_id, FieldBound::kTokenId}});
    return fields;
  }
  void check_relations(const Olmo2Config& c) const override {
    check_attention_heads(c.num_attention_heads, c.num_key_value_heads, c.hidden_size, 0, true);
  }
  std::string describe_config(const Olmo2Config& c) const override {
    return fmt::format(
        "olmo2(layers={}, hidden={}, heads={}, kv_heads={}, intermediate={}, vocab={}, "
        "context={}, tied={}{})",
        c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.kv_heads(),
        c.intermediate_size, c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings,
        c.attention_bias ? ", attention_bias" : "");
  }
  std::unique_ptr<Objective> build(const Olmo2Config& c, const ModelInit& init) const override {
    return std::make_unique<Olmo2>(c, init);
  }
  ModelData data_of(const Olmo2Config& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.max_position_embeddings;
    return d;
  }

  std::vector<std::string> hf_model_types() const override { return {"olmo2"}; }

  // Reads config.json as transformers 4.47 to 5.x write it for OLMo 2
  // (docs/checkpoints.md#hugging-face-models).
  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    Olmo2Config c;
    c.vocab_size = r.integer("vocab_size", 50304);
    c.hidden_size = r.integer("hidden_size", 4096);
    c.intermediate_size = r.integer("intermediate_size", 11008);
    c.num_hidden_layers = r.integer("num_hidden_layers", 32);
    c.num_attention_heads = r.integer("num_attention_heads", 32);
    c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
    c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
    c.rms_norm_eps = r.number("rms_norm_eps", 1e-5);
    c.attention_bias = r.boolean("attention_bias", false);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    c.pad_token_id = r.integer("pad_token_id", -1);
    if (r.text("hidden_act", "silu") != "silu") {
      r.unsupported("hidden_act", "OLMo 2's MLP is SwiGLU (silu)");
    }
    read_default_rope(r, "OLMo 2", c.rope_theta);
    r.ignore({"attention_dropout"});
    r.finish();
    return c;
  }
};

}  // namespace

std::shared_ptr<const Architecture> olmo2_architecture() {
  return std::make_shared<Olmo2Architecture>();
}

}  // namespace curv
