// The built-in GPT: nanoGPT's parameter names and initialisation, pre-LayerNorm blocks, plain
// softmax causal attention with a fused Q/K/V projection, exact GELU, tied or untied head.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/fmt_torch.h"
#include "curv/models/fused_ops.h"
#include "models/architecture.h"
#include "models/config_schema.h"
#include "models/transformer_parts.h"

namespace curv {

namespace {

class Gpt : public CausalLanguageModel {
 public:
  Gpt(const GptConfig& c, const ModelInit& init) : CausalLanguageModel(init), c_(c) {
    const int64_t C = c.n_embd;
    const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);
    // The fused c_attn rows: query [0, C), key [C, 2C), value [2C, 3C).
    const std::vector<RowSlice> qkv = {{ParamRole::kAttentionQuery, 0, C},
                                       {ParamRole::kAttentionKey, C, 2 * C},
                                       {ParamRole::kAttentionValue, 2 * C, 3 * C}};
    // Adds a weight and, with biases, its bias (directly after it), both in `role`.
    // `shape` is nn.Linear's [out, in]; HF's Conv1D stores the transpose.
    auto add_pair = [&](const std::string& name, std::vector<int64_t> shape, double std,
                        ParamRole weight_role, ParamRole bias_role,
                        const std::vector<RowSlice>& slices = {}) {
      const int64_t out = shape[0];
      const bool transposed = c.conv1d && shape.size() == 2;
      if (transposed) std::swap(shape[0], shape[1]);
      const size_t index = add_param(
          name + ".weight", std == 0.0 ? draw_.filled(shape, 1.0) : draw_.normal(shape, std),
          weight_role, slices);
      roles_[index].transposed = transposed;
      if (c.bias) add_param(name + ".bias", draw_.filled({out}, 0.0), bias_role, slices);
      return index;
    };
    add_param("transformer.wte.weight", draw_.normal({c.vocab_size, C}),
              ParamRole::kTokenEmbedding);
    add_param("transformer.wpe.weight", draw_.normal({c.block_size, C}),
              ParamRole::kPositionEmbedding);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = fmt::format("transformer.h.{}.", l);
      layer_ = l;
      Layer layer;
      layer.ln_1_w = add_pair(h + "ln_1", {C}, 0.0, ParamRole::kNormGain, ParamRole::kNormBias);
      layer.attn_w = add_pair(h + "attn.c_attn", {3 * C, C}, 0.02, ParamRole::kFusedQkv,
                              ParamRole::kFusedQkv, qkv);
      layer.attn_proj_w = add_pair(h + "attn.c_proj", {C, C}, proj_std, ParamRole::kAttentionOutput,
                                   ParamRole::kAttentionOutput);
      layer.ln_2_w = add_pair(h + "ln_2", {C}, 0.0, ParamRole::kNormGain, ParamRole::kNormBias);
      layer.fc_w = add_pair(h + "mlp.c_fc", {c.mlp_width(), C}, 0.02, ParamRole::kMlpInput,
                            ParamRole::kMlpInput);
      layer.mlp_proj_w = add_pair(h + "mlp.c_proj", {C, c.mlp_width()}, proj_std,
                                  ParamRole::kMlpOutput, ParamRole::kMlpOutput);
      layers_.push_back(layer);
    }
    layer_ = -1;
    ln_f_w_ = add_pair("transformer.ln_f", {C}, 0.0, ParamRole::kNormGain, ParamRole::kNormBias);
    if (!c.tied) {
      head_ = add_param("lm_head.weight", draw_.normal({c.vocab_size, C}), ParamRole::kOutputHead);
    }
    finish();
  }

  ModelStructure structure() const override {
    ModelStructure s = heads_structure(c_.n_head, c_.n_head, c_.n_embd / c_.n_head);
    if (c_.tied) s.tied.emplace_back("lm_head.weight", "transformer.wte.weight");
    return s;
  }

  std::string describe() const override { return ModelConfig("gpt", c_).describe(); }

 private:
  struct Layer {
    size_t ln_1_w, attn_w, attn_proj_w, ln_2_w, fc_w, mlp_proj_w;
  };

  void check(const Batch& batch) const override {
    check_token_batch(batch, "gpt", c_.vocab_size, c_.block_size, "block_size");
  }

  // Parameter i's bias partner when the model has biases (it directly follows its weight).
  at::Tensor bias_after(size_t weight) const { return c_.bias ? p(weight + 1) : at::Tensor(); }

  at::Tensor layer_norm(const at::Tensor& x, size_t weight) const {
    return fused_layer_norm(x, p(weight), bias_after(weight), c_.layer_norm_eps);
  }

  // nn.Linear (x Wᵀ + b) or, for HF's Conv1D layout, x W + b.
  at::Tensor project(const at::Tensor& x, size_t weight) const {
    return linear_map(x, weight, c_.bias ? weight + 1 : LinearUse::kNoBias, c_.conv1d);
  }

  at::Tensor activation(const at::Tensor& x) const {
    return fused_gelu(x, c_.activation == "gelu_tanh");
  }

  size_t num_layers() const override { return layers_.size(); }
  at::Tensor embed(const at::Tensor& tokens) const override {
    auto positions = at::arange(tokens.size(1), tokens.options());
    return at::embedding(p(0), tokens) + at::embedding(p(1), positions);
  }
  at::Tensor head(const at::Tensor& x) const override {
    return token_head(layer_norm(x, ln_f_w_), 0, head_, c_.tied);
  }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1), C = c_.n_embd, H = c_.n_head;
    const double scale = 1.0 / std::sqrt(static_cast<double>(C / H));
    auto h = layer_norm(x, l.ln_1_w);
    auto qkv = project(h, l.attn_w).split(C, -1);
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, C / H}).transpose(1, 2); };
    auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    x = x + project(causal_attention(q, k, v, scale), l.attn_proj_w);
    h = layer_norm(x, l.ln_2_w);
    return x + project(activation(project(h, l.fc_w)), l.mlp_proj_w);
  }

  GptConfig c_;
  std::vector<Layer> layers_;
  size_t ln_f_w_ = 0;
  size_t head_ = 0;
};

class GptArchitecture : public DeclaredConfigArchitecture<GptConfig> {
 public:
  std::string name() const override { return "gpt"; }
  const ConfigFields<GptConfig>& fields() const override {
    using C = GptConfig;
    static const ConfigFields<C> fields = {
        {"vocab_size", &C::vocab_size, FieldBound::kPositive},
        {"block_size", &C::block_size, FieldBound::kPositive},
        {"n_layer", &C::n_layer, FieldBound::kPositive},
        {"n_head", &C::n_head, FieldBound::kPositive},
        {"n_embd", &C::n_embd, FieldBound::kPositive},
        {"bias", &C::bias},
        {"tied", &C::tied},
        {"activation", &C::activation},
        {"layer_norm_eps", &C::layer_norm_eps, FieldBound::kPositive},
        {"n_inner", &C::n_inner, FieldBound::kNonNegative},
        {"conv1d", &C::conv1d}};
    return fields;
  }
  // dropout is accepted (nanoGPT configs carry it) but must be 0; it is no field of the model.
  std::vector<std::string> keys() const override {
    auto keys = DeclaredConfigArchitecture::keys();
    keys.push_back("dropout");
    return keys;
  }
  GptConfig from_json(const nlohmann::json& j, const std::string& origin) const override {
    if (j.value("dropout", 0.0) != 0.0) {
      throw FormatError(
          fmt::format("{}: dropout must be 0: curvature is measured in eval mode", origin));
    }
    return DeclaredConfigArchitecture::from_json(j, origin);
  }
  void check_relations(const GptConfig& c) const override {
    if (c.activation != "gelu" && c.activation != "gelu_tanh") {
      throw InvalidArgument(
          fmt::format("model config: activation = '{}': expected gelu or gelu_tanh", c.activation));
    }
    if (c.n_embd % c.n_head != 0) {
      throw InvalidArgument(fmt::format("model config: n_embd = {} is not divisible by n_head = {}",
                                        c.n_embd, c.n_head));
    }
  }
  std::string describe_config(const GptConfig& c) const override {
    return fmt::format(
        "gpt(n_layer={}, n_head={}, n_embd={}, vocab={}, block={}, bias={}, tied={}{}{})",
        c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size, c.bias, c.tied,
        c.activation == "gelu" ? "" : ", activation=" + c.activation, c.conv1d ? ", conv1d" : "");
  }
  std::unique_ptr<Objective> build(const GptConfig& c, const ModelInit& init) const override {
    return std::make_unique<Gpt>(c, init);
  }
  ModelData data_of(const GptConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.block_size;
    return d;
  }

  std::vector<std::string> hf_model_types() const override { return {"gpt2"}; }

  // Hugging Face GPT-2 (GPT2LMHeadModel): Conv1D weights, a tied head, biases everywhere.
  std::any parse_hf(const std::string& json, const std::string& origin) const override {
    const auto j = nlohmann::json::parse(json);
    HfConfigReader r(j, origin);
    GptConfig c;
    c.vocab_size = r.integer("vocab_size", 50257);
    c.block_size = r.integer("n_positions", 1024);
    c.n_layer = r.integer("n_layer", 12);
    c.n_head = r.integer("n_head", 12);
    c.n_embd = r.integer("n_embd", 768);
    c.n_inner = r.integer("n_inner", 0);
    c.layer_norm_eps = r.number("layer_norm_epsilon", 1e-5);
    c.bias = true;
    c.conv1d = true;
    c.tied = r.boolean("tie_word_embeddings", true);
    const std::string act = r.text("activation_function", "gelu_new");
    if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
      c.activation = "gelu_tanh";
    } else if (act == "gelu") {
      c.activation = "gelu";
    } else {
      r.unsupported("activation_function", "expected gelu_new, gelu_pytorch_tanh or gelu");
    }
    if (!r.boolean("scale_attn_weights", true)) {
      r.unsupported("scale_attn_weights", "attention scores are always scaled by 1/sqrt(d)");
    }
    if (r.boolean("scale_attn_by_inverse_layer_idx", false)) {
      r.unsupported("scale_attn_by_inverse_layer_idx", "not built in");
    }
    if (r.boolean("add_cross_attention", false)) {
      r.unsupported("add_cross_attention", "cross-attention is not built in");
    }
    // n_ctx is n_positions in old configs; the rest does nothing in eval mode or is about the
    // classification and generation heads the LM head does not use.
    if (r.integer("n_ctx", c.block_size) != c.block_size) {
      r.unsupported("n_ctx", "must equal n_positions");
    }
    r.ignore({"attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_activation",
              "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj",
              "reorder_and_upcast_attn", "task_specific_params"});
    r.finish();
    return c;
  }
};

}  // namespace

std::shared_ptr<const Architecture> gpt_architecture() {
  return std::make_shared<GptArchitecture>();
}

}  // namespace curv
