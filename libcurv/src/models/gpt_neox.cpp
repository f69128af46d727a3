// GPT-NeoX (Hugging Face's GPTNeoXForCausalLM): the Pythia suite's architecture. LayerNorm with
// biases, one fused query_key_value projection whose rows interleave q, k and v head by head,
// rotary embeddings over the first rotary_pct of each head, a GELU MLP, and the attention and MLP
// branches added to the residual in parallel (use_parallel_residual) or in turn; an untied head
// embed_out. HF's parameter names and order, read from the config.json HF saves beside the
// weights (transformers 4.x's rotary_pct / rotary_emb_base or 5.x's rope_parameters).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "curv/models/fused_ops.h"
#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

struct GptNeoxConfig {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 512;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t max_position_embeddings = 256;
  double rotary_pct = 0.25;  // the share of each head's features that rotate
  double rotary_emb_base = 10000.0;
  double layer_norm_eps = 1e-5;
  bool use_parallel_residual = true;  // x + attn(ln1(x)) + mlp(ln2(x)), else in turn
  bool attention_bias = true;         // biases on query_key_value and dense
  bool gelu_tanh = false;             // hidden_act gelu_new / gelu_pytorch_tanh
  int64_t head_size() const { return hidden_size / num_attention_heads; }
  int64_t rotary_dims() const {
    return static_cast<int64_t>(static_cast<double>(head_size()) * rotary_pct);
  }
};

class GptNeox : public CausalLanguageModel {
 public:
  GptNeox(const GptNeoxConfig& c, const ModelInit& init) : CausalLanguageModel(init), c_(c) {
    const int64_t C = c.hidden_size, F = c.intermediate_size, H = c.num_attention_heads;
    const int64_t D = c.head_size();
    // query_key_value's rows: for each head, its D query rows, D key rows, D value rows.
    std::vector<RowSlice> interleaved;
    for (int64_t h = 0; h < H; ++h) {
      for (const auto role :
           {ParamRole::kAttentionQuery, ParamRole::kAttentionKey, ParamRole::kAttentionValue}) {
        const int64_t begin = static_cast<int64_t>(interleaved.size()) * D;
        interleaved.push_back({role, begin, begin + D});
      }
    }
    // A LayerNorm: its gain, then its bias.
    auto add_norm = [&](const std::string& name) {
      const size_t index = add_gain(name, C);
      add_param(name + ".bias", draw_.filled({C}, 0.0), ParamRole::kNormBias);
      return index;
    };
    embed_ = add_param("gpt_neox.embed_in.weight", draw_.normal({c.vocab_size, C}),
                       ParamRole::kTokenEmbedding);
    // HF's named_parameters order: the two norms, then attention, then the MLP.
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string h = fmt::format("gpt_neox.layers.{}.", l);
      layer_ = l;
      Layer y;
      y.input_norm = add_norm(h + "input_layernorm");
      y.post_norm = add_norm(h + "post_attention_layernorm");
      y.qkv = add_linear(h + "attention.query_key_value", 3 * C, C, c.attention_bias,
                         ParamRole::kFusedQkv, interleaved);
      y.dense =
          add_linear(h + "attention.dense", C, C, c.attention_bias, ParamRole::kAttentionOutput);
      y.up = add_linear(h + "mlp.dense_h_to_4h", F, C, true, ParamRole::kMlpInput);
      y.down = add_linear(h + "mlp.dense_4h_to_h", C, F, true, ParamRole::kMlpOutput);
      layers_.push_back(y);
    }
    layer_ = -1;
    final_norm_ = add_norm("gpt_neox.final_layer_norm");
    head_ = add_param("embed_out.weight", draw_.normal({c.vocab_size, C}), ParamRole::kOutputHead);
    finish();
  }

  ModelStructure structure() const override {
    return heads_structure(c_.num_attention_heads, c_.num_attention_heads, c_.head_size());
  }

  std::string describe() const override { return ModelConfig("gpt_neox", c_).describe(); }

 private:
  struct Layer {
    size_t input_norm = 0, post_norm = 0;
    Linear qkv, dense, up, down;
  };

  at::Tensor norm(const at::Tensor& x, size_t weight) const {
    return fused_layer_norm(x, p(weight), p(weight + 1), c_.layer_norm_eps);
  }

  void check(const Batch& batch) const override {
    check_token_batch(batch, "gpt_neox", c_.vocab_size, c_.max_position_embeddings);
  }

  size_t num_layers() const override { return layers_.size(); }
  at::Tensor embed(const at::Tensor& tokens) const override {
    return at::embedding(p(embed_), tokens);
  }
  at::Tensor head(const at::Tensor& x) const override {
    return linear_map(norm(x, final_norm_), head_);
  }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = c_.num_attention_heads, D = c_.head_size();
    const RotaryTable rope = layer_rotary_table(x, c_.rotary_emb_base, c_.rotary_dims());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto mlp = [&](const at::Tensor& h) {
      return linear(fused_gelu(linear(h, l.up), c_.gelu_tanh), l.down);
    };
    // [B, T, H, 3D]: each head's query, key and value features side by side.
    auto qkv = linear(norm(x, l.input_norm), l.qkv).view({B, T, H, 3 * D}).transpose(1, 2);
    auto q = apply_rotary(qkv.narrow(-1, 0, D), rope);
    auto k = apply_rotary(qkv.narrow(-1, D, D), rope);
    auto attention = linear(causal_attention(q, k, qkv.narrow(-1, 2 * D, D), scale), l.dense);
    if (c_.use_parallel_residual) return mlp(norm(x, l.post_norm)) + attention + x;
    auto y = attention + x;
    return mlp(norm(y, l.post_norm)) + y;
  }

  GptNeoxConfig c_;
  std::vector<Layer> layers_;
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
};

class GptNeoxArchitecture : public DeclaredConfigArchitecture<GptNeoxConfig> {
 public:
  std::string name() const override { return "gpt_neox"; }
  const ConfigFields<GptNeoxConfig>& fields() const override {
    using C = GptNeoxConfig;
    static const ConfigFields<C> fields =
        decoder_fields<C>({{"rotary_pct", &C::rotary_pct, FieldBound::kPositive},
                           {"rotary_emb_base", &C::rotary_emb_base, FieldBound::kPositive},
                           {"layer_norm_eps", &C::layer_norm_eps, FieldBound::kPositive},
                           {"use_parallel_residual", &C::use_parallel_residual},
                           {"attention_bias", &C::attention_bias},
                           {"gelu_tanh", &C::gelu_tanh}});
    return fields;
  }
  void check_relations(const GptNeoxConfig& c) const override {
    check_attention_heads(c.num_attention_heads, 0, c.hidden_size, 0, false);
    if (c.rotary_pct > 1 || c.rotary_dims() % 2 != 0) {
      throw InvalidArgument(fmt::format(
          "model config: rotary_pct = {} must be in (0, 1] and rotate an even number of a head's "
          "{} features (it rotates {})",
          c.rotary_pct, c.head_size(), c.rotary_dims()));
    }
  }
  std::string describe_config(const GptNeoxConfig& c) const override {
    return fmt::format(
        "gpt_neox(layers={}, hidden={}, heads={}, intermediate={}, vocab={}, context={}, "
        "rotary={}/{}{}{})",
        c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
        c.vocab_size, c.max_position_embeddings, c.rotary_dims(), c.head_size(),
        c.use_parallel_residual ? ", parallel residual" : "", c.gelu_tanh ? ", gelu tanh" : "");
  }
  std::unique_ptr<Objective> build(const GptNeoxConfig& c, const ModelInit& init) const override {
    return std::make_unique<GptNeox>(c, init);
  }
  ModelData data_of(const GptNeoxConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.max_position_embeddings;
    return d;
  }

  std::vector<std::string> hf_model_types() const override { return {"gpt_neox"}; }

  // Reads config.json as transformers 4.x (Pythia's) and 5.x write it
  // (docs/checkpoints.md#hugging-face-models).
  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    GptNeoxConfig c;
    c.vocab_size = r.integer("vocab_size", 50432);
    c.hidden_size = r.integer("hidden_size", 6144);
    c.intermediate_size = r.integer("intermediate_size", 24576);
    c.num_hidden_layers = r.integer("num_hidden_layers", 44);
    c.num_attention_heads = r.integer("num_attention_heads", 64);
    c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
    c.layer_norm_eps = r.number("layer_norm_eps", 1e-5);
    c.use_parallel_residual = r.boolean("use_parallel_residual", true);
    c.attention_bias = r.boolean("attention_bias", true);
    const std::string act = r.text("hidden_act", "gelu");
    if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
      c.gelu_tanh = true;
    } else if (act != "gelu") {
      r.unsupported("hidden_act", "the GELUs built in are gelu, gelu_new and gelu_pytorch_tanh");
    }
    if (r.boolean("tie_word_embeddings", false)) {
      r.unsupported("tie_word_embeddings", "GPT-NeoX's embed_out is its own matrix");
    }
    read_rope(r, c);
    // Dropout does nothing in eval mode, where curvature is measured.
    r.ignore({"attention_dropout", "hidden_dropout", "classifier_dropout",
              "attention_probs_dropout_prob", "hidden_dropout_prob"});
    r.finish();
    return c;
  }

 private:
  // transformers 5's rope_parameters {rope_theta, partial_rotary_factor, rope_type}, or 4.x's
  // rotary_emb_base and rotary_pct beside an optional null rope_scaling.
  static void read_rope(HfConfigReader& r, GptNeoxConfig& c) {
    c.rotary_emb_base = r.number("rotary_emb_base", 10000.0);
    c.rotary_pct = r.number("rotary_pct", 0.25);
    if (r.find("rope_scaling")) r.unsupported("rope_scaling", "no rotary scaling is built in");
    const nlohmann::json* rope = r.find("rope_parameters");
    if (!rope) return;
    if (!rope->is_object()) r.unsupported("rope_parameters", "expected an object");
    HfConfigReader p(*rope, fmt::format("{}: \"rope_parameters\"", r.origin()), false);
    c.rotary_emb_base = p.number("rope_theta", c.rotary_emb_base);
    c.rotary_pct = p.number("partial_rotary_factor", c.rotary_pct);
    if (p.text("rope_type", "default") != "default") {
      p.unsupported("rope_type", "GPT-NeoX's rotary type built in is default");
    }
    p.finish();
  }
};

}  // namespace

std::shared_ptr<const Architecture> gpt_neox_architecture() {
  return std::make_shared<GptNeoxArchitecture>();
}

}  // namespace curv
