// Phi-3 (Hugging Face's Phi3ForCausalLM): LLaMA's RMSNorm, rotary embeddings (over the first
// partial_rotary_factor of each head) and grouped-query attention, with the query, key and value
// projections fused into one qkv_proj (their rows one after the other) and the MLP's gate and up
// projections into one gate_up_proj. HF's parameter names and order, read from the config.json
// HF saves beside the weights.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

struct Phi3Config {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 344;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t max_position_embeddings = 256;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  // Sequences longer than the window are refused, so plain causal attention is the window's.
  int64_t sliding_window = 0;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;  // nn.Embedding's padding_idx: no gradient for that row; -1: none
  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const { return hidden_size / num_attention_heads; }
  int64_t rotary_dims() const {
    return static_cast<int64_t>(static_cast<double>(head_size()) * partial_rotary_factor);
  }
};

class Phi3 : public RmsNormDecoder {
 public:
  Phi3(const Phi3Config& c, const ModelInit& init)
      : RmsNormDecoder(init, c.pad_token_id, c.rms_norm_eps, c.tie_word_embeddings), c_(c) {
    const int64_t C = c.hidden_size, D = c.head_size(), H = c.num_attention_heads;
    const int64_t KV = c.kv_heads(), F = c.intermediate_size;
    const int64_t qkv_rows = (H + 2 * KV) * D;
    add_embedding(c.vocab_size, C);
    // HF's named_parameters order: self_attn (o, then qkv: its registration order), mlp
    // (gate_up, down), then the norms.
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("model.layers.{}.", l);
      layer_ = l;
      Layer y;
      y.o = add_linear(h + "self_attn.o_proj", C, H * D, false, ParamRole::kAttentionOutput);
      y.qkv = add_linear(h + "self_attn.qkv_proj", qkv_rows, C, false, ParamRole::kFusedQkv,
                         fused_qkv_slices(qkv_rows, H, KV, D));
      y.gate_up = add_linear(h + "mlp.gate_up_proj", 2 * F, C, false, ParamRole::kMlpInput);
      y.down = add_linear(h + "mlp.down_proj", C, F, false, ParamRole::kMlpOutput);
      y.input_norm = add_gain(h + "input_layernorm", C);
      y.post_norm = add_gain(h + "post_attention_layernorm", C);
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

  std::string describe() const override { return ModelConfig("phi3", c_).describe(); }

 private:
  struct Layer {
    Linear qkv, o, gate_up, down;
    size_t input_norm = 0, post_norm = 0;
  };

  void check(const Batch& batch) const override {
    check_token_batch(batch, "phi3", c_.vocab_size, c_.max_position_embeddings);
    if (c_.sliding_window > 0 && batch.inputs.size(1) > c_.sliding_window) {
      throw ModelError(fmt::format(
          "phi3: sequence length {} exceeds the sliding window {}; windowed attention is not "
          "built in, so probe with sequences of at most {} tokens",
          batch.inputs.size(1), c_.sliding_window, c_.sliding_window));
    }
  }

  size_t num_layers() const override { return layers_.size(); }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = c_.num_attention_heads, KV = c_.kv_heads(), D = c_.head_size();
    const int64_t F = c_.intermediate_size;
    const RotaryTable rope = layer_rotary_table(x, c_.rope_theta, c_.rotary_dims());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto qkv = linear(norm(x, l.input_norm), l.qkv);
    auto q = qkv.narrow(-1, 0, H * D).view({B, T, H, D}).transpose(1, 2);
    auto k = qkv.narrow(-1, H * D, KV * D).view({B, T, KV, D}).transpose(1, 2);
    auto v = qkv.narrow(-1, (H + KV) * D, KV * D).view({B, T, KV, D}).transpose(1, 2);
    auto y = causal_attention(apply_rotary(q, rope), apply_rotary(k, rope), v, scale);
    x = x + linear(y, l.o);
    auto gate_up = linear(norm(x, l.post_norm), l.gate_up);
    return x + linear(fused_gated_silu(gate_up.narrow(-1, 0, F), gate_up.narrow(-1, F, F)), l.down);
  }

  Phi3Config c_;
  std::vector<Layer> layers_;
};

class Phi3Architecture : public DeclaredConfigArchitecture<Phi3Config> {
 public:
  std::string name() const override { return "phi3"; }
  const ConfigFields<Phi3Config>& fields() const override {
    using C = Phi3Config;
    static const ConfigFields<C> fields = decoder_fields<C>(
        {{"num_key_value_heads", &C::num_key_value_heads, FieldBound::kNonNegative},
         {"rms_norm_eps", &C::rms_norm_eps, FieldBound::kPositive},
         {"rope_theta", &C::rope_theta, FieldBound::kPositive},
         {"partial_rotary_factor", &C::partial_rotary_factor, FieldBound::kPositive},
         {"sliding_window", &C::sliding_window, FieldBound::kNonNegative},
         {"tie_word_embeddings", &C::tie_word_embeddings},
         {"pad_token_id", &C::pad_token_id, FieldBound::kTokenId}});
    return fields;
  }
  void check_relations(const Phi3Config& c) const override {
    check_attention_heads(c.num_attention_heads, c.num_key_value_heads, c.hidden_size, 0, false);
    if (c.partial_rotary_factor > 1 || c.rotary_dims() % 2 != 0) {
      throw InvalidArgument(fmt::format(
          "model config: partial_rotary_factor = {} must be in (0, 1] and rotate an even number "
          "of a head's {} features (it rotates {})",
          c.partial_rotary_factor, c.head_size(), c.rotary_dims()));
    }
  }
  std::string describe_config(const Phi3Config& c) const override {
    return fmt::format(
        "phi3(layers={}, hidden={}, heads={}, kv_heads={}, intermediate={}, vocab={}, "
        "context={}, rotary={}/{}, tied={})",
        c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.kv_heads(),
        c.intermediate_size, c.vocab_size, c.max_position_embeddings, c.rotary_dims(),
        c.head_size(), c.tie_word_embeddings);
  }
  std::unique_ptr<Objective> build(const Phi3Config& c, const ModelInit& init) const override {
    return std::make_unique<Phi3>(c, init);
  }
  ModelData data_of(const Phi3Config& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.sliding_window > 0 ? std::min(c.sliding_window, c.max_position_embeddings)
                                     : c.max_position_embeddings;
    return d;
  }

  std::vector<std::string> hf_model_types() const override { return {"phi3"}; }

  // Reads config.json as transformers 4.40 to 5.x write it for Phi-3
  // (docs/checkpoints.md#hugging-face-models).
  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    Phi3Config c;
    c.vocab_size = r.integer("vocab_size", 32064);
    c.hidden_size = r.integer("hidden_size", 3072);
    c.intermediate_size = r.integer("intermediate_size", 8192);
    c.num_hidden_layers = r.integer("num_hidden_layers", 32);
    c.num_attention_heads = r.integer("num_attention_heads", 32);
    c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
    c.max_position_embeddings = r.integer("max_position_embeddings", 4096);
    c.rms_norm_eps = r.number("rms_norm_eps", 1e-5);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    c.pad_token_id = r.integer("pad_token_id", -1);
    c.sliding_window = r.integer("sliding_window", 0);
    if (r.text("hidden_act", "silu") != "silu") {
      r.unsupported("hidden_act", "Phi-3's MLP is SwiGLU (silu)");
    }
    // longrope (the 128k-context models) is refused: only the default rotary type is built in.
    read_default_rope(r, "Phi-3", c.rope_theta, &c.partial_rotary_factor);
    // The context the default rotary type ignores (longrope reads it), and dropout in eval mode.
    r.ignore(
        {"original_max_position_embeddings", "resid_pdrop", "embd_pdrop", "attention_dropout"});
    r.finish();
    return c;
  }
};

}  // namespace

std::shared_ptr<const Architecture> phi3_architecture() {
  return std::make_shared<Phi3Architecture>();
}

}  // namespace curv
