// The built-in modded-nanogpt: the architecture of the optimization track of KellerJordan's
// modded-nanogpt (records/track_3_optimization/train_gpt_simple.py), with its parameter names:
// RMSNorm with learnable gains (torch's F.rms_norm, eps = the dtype's machine epsilon) after the
// embedding, before each sublayer and before the head; per-head RMS-normalised queries and keys;
// its half-truncated rotary embedding; causal attention with a fixed scale 0.12; a ReLU² MLP;
// biases on every projection; an untied head with a logit soft-cap 15·z/√(z² + 15²).

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

class Modded : public CausalLanguageModel {
 public:
  Modded(const ModdedConfig& c, const ModelInit& init) : CausalLanguageModel(init), c_(c) {
    // The script's own initialisation: "proj" weights zero, the embedding normal(0, 1), other
    // weights normal(0, 0.33^0.5 / sqrt(fan_in)), biases zero, gains one.
    const int64_t C = c.model_dim, H = c.heads() * c.head_dim, V = c.vocab_size;
    auto add_projection = [&](const std::string& name, int64_t out, int64_t in, ParamRole role) {
      const bool zero = name.find("proj") != std::string::npos;
      const size_t index = add_param(
          name + ".weight",
          zero ? draw_.filled({out, in}, 0.0) : draw_.normal({out, in}, std::sqrt(0.33 / in)),
          role);
      add_param(name + ".bias", draw_.filled({out}, 0.0), role);
      return index;
    };
    auto add_gains = [&](const std::string& name) {
      return add_param(name + ".gains", draw_.filled({C}, 1.0), ParamRole::kNormGain);
    };
    // named_parameters order: embed, blocks (attn q, k, v, proj; mlp fc, proj; norm1, norm2),
    // proj, norm1, norm2.
    embed_ = add_param("embed.weight", draw_.normal({V, C}, 1.0), ParamRole::kTokenEmbedding);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string b = fmt::format("blocks.{}.", l);
      layer_ = l;
      Layer layer;
      layer.q = add_projection(b + "attn.q", H, C, ParamRole::kAttentionQuery);
      layer.k = add_projection(b + "attn.k", H, C, ParamRole::kAttentionKey);
      layer.v = add_projection(b + "attn.v", H, C, ParamRole::kAttentionValue);
      layer.o = add_projection(b + "attn.proj", C, H, ParamRole::kAttentionOutput);
      layer.fc = add_projection(b + "mlp.fc", 4 * C, C, ParamRole::kMlpInput);
      layer.down = add_projection(b + "mlp.proj", C, 4 * C, ParamRole::kMlpOutput);
      layer.norm1 = add_gains(b + "norm1");
      layer.norm2 = add_gains(b + "norm2");
      layers_.push_back(layer);
    }
    layer_ = -1;
    head_ = add_projection("proj", V, C, ParamRole::kOutputHead);
    norm1_ = add_gains("norm1");
    norm2_ = add_gains("norm2");
    finish();
  }

  ModelStructure structure() const override {
    return heads_structure(c_.heads(), c_.heads(), c_.head_dim);
  }

  at::Tensor logits(const Batch& batch) override {
    if (c_.loss_scale != 1.0) {
      // The Gauss-Newton split assumes loss = mean cross-entropy of the logits.
      throw ModelError("modded: logits are only offered with loss_scale = 1");
    }
    check(batch);
    return forward(batch.inputs);
  }

  std::string describe() const override { return ModelConfig("modded", c_).describe(); }

 private:
  struct Layer {
    size_t q, k, v, o, fc, down, norm1, norm2;
  };

  at::Tensor linear(const at::Tensor& x, size_t weight) const {
    return linear_map(x, weight, weight + 1);
  }

  // torch.nn.functional.rms_norm with eps=None: x / sqrt(mean(x²) + ε), ε the dtype's machine
  // epsilon, over the last dimension, then times the gains where the norm has them.
  static double rms_epsilon(const at::Tensor& x) {
    return x.scalar_type() == at::kDouble
               ? std::numeric_limits<double>::epsilon()
               : static_cast<double>(std::numeric_limits<float>::epsilon());
  }
  static at::Tensor rms_norm(const at::Tensor& x) {
    return fused_rms_norm(x, at::Tensor(), rms_epsilon(x));
  }
  at::Tensor rms_norm(const at::Tensor& x, size_t gains) const {
    return fused_rms_norm(x, p(gains), rms_epsilon(x));
  }

  void check(const Batch& batch) const override {
    check_token_batch(batch, "modded", c_.vocab_size, c_.context, "context");
  }

  size_t num_layers() const override { return layers_.size(); }
  double loss_scale() const override { return c_.loss_scale; }
  at::Tensor embed(const at::Tensor& tokens) const override {
    return rms_norm(at::embedding(p(embed_), tokens), norm1_);
  }
  at::Tensor head(const at::Tensor& x) const override {
    auto z = linear(rms_norm(x, norm2_), head_);
    const double cap = c_.logit_cap;
    return cap > 0 ? cap * z * at::rsqrt(z.square() + cap * cap) : z;
  }

  at::Tensor layer(size_t index, const at::Tensor& input) const override {
    const Layer& l = layers_[index];
    at::Tensor x = input;
    const int64_t B = x.size(0), T = x.size(1), H = c_.heads(), D = c_.head_dim;
    // Half-truncated rotary: frequencies (1/1024)^linspace(0, 1, D/4) on the first D/4 pairs and
    // zero on the rest; the halves x1, x2 of each head turn as (x1 cos + x2 sin, x2 cos − x1 sin).
    // Again for each layer: a T × D table, next to nothing beside a layer.
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(x.device());
    auto freq = at::pow(1.0 / 1024.0, at::linspace(0.0, 1.0, D / 4, f64));
    freq = at::cat({freq, at::zeros({D / 4}, f64)});
    auto theta = at::outer(at::arange(T, f64), freq).view({1, T, 1, D / 2});
    const auto cos = theta.cos().to(x.scalar_type()), sin = theta.sin().to(x.scalar_type());
    auto rotary = [&](const at::Tensor& t) {
      auto x1 = t.narrow(-1, 0, D / 2), x2 = t.narrow(-1, D / 2, D / 2);
      return at::cat({x1 * cos + x2 * sin, x2 * cos - x1 * sin}, -1);
    };
    auto h = rms_norm(x, l.norm1);
    auto q = rotary(rms_norm(linear(h, l.q).view({B, T, H, D}))).transpose(1, 2);
    auto k = rotary(rms_norm(linear(h, l.k).view({B, T, H, D}))).transpose(1, 2);
    auto v = linear(h, l.v).view({B, T, H, D}).transpose(1, 2);
    x = x + linear(causal_attention(q, k, v, c_.attention_scale), l.o);
    h = rms_norm(x, l.norm2);
    return x + linear(at::relu(linear(h, l.fc)).square(), l.down);
  }

  ModdedConfig c_;
  std::vector<Layer> layers_;
  size_t embed_ = 0, head_ = 0, norm1_ = 0, norm2_ = 0;
};

class ModdedArchitecture : public DeclaredConfigArchitecture<ModdedConfig> {
 public:
  std::string name() const override { return "modded"; }
  const ConfigFields<ModdedConfig>& fields() const override {
    using C = ModdedConfig;
    static const ConfigFields<C> fields = {
        {"vocab_size", &C::vocab_size, FieldBound::kPositive},
        {"num_layers", &C::num_layers, FieldBound::kPositive},
        {"model_dim", &C::model_dim, FieldBound::kPositive},
        {"head_dim", &C::head_dim, FieldBound::kPositive},
        {"context", &C::context, FieldBound::kPositive},
        {"logit_cap", &C::logit_cap, FieldBound::kNonNegative},
        {"loss_scale", &C::loss_scale, FieldBound::kPositive},
        {"attention_scale", &C::attention_scale, FieldBound::kPositive}};
    return fields;
  }
  void check_relations(const ModdedConfig& c) const override {
    if (c.model_dim % c.head_dim != 0 || c.head_dim % 4 != 0) {
      throw InvalidArgument(fmt::format(
          "model config: head_dim = {} must divide model_dim = {} and be a multiple of 4",
          c.head_dim, c.model_dim));
    }
  }
  std::string describe_config(const ModdedConfig& c) const override {
    return fmt::format(
        "modded(layers={}, dim={}, heads={}, head_dim={}, vocab={}, context={}, logit_cap={}, "
        "loss_scale={})",
        c.num_layers, c.model_dim, c.heads(), c.head_dim, c.vocab_size, c.context, c.logit_cap,
        c.loss_scale);
  }
  std::unique_ptr<Objective> build(const ModdedConfig& c, const ModelInit& init) const override {
    return std::make_unique<Modded>(c, init);
  }
  ModelData data_of(const ModdedConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kTokens;
    d.vocab_size = c.vocab_size;
    d.context = c.context;
    return d;
  }
};

}  // namespace

std::shared_ptr<const Architecture> modded_architecture() {
  return std::make_shared<ModdedArchitecture>();
}

}  // namespace curv
