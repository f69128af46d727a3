#include "curv/models/models.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "core/fmt_torch.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "curv/core/error.h"
#include "curv/models/model_problems.h"
#include "core/strings.h"

namespace curv {

// ---------------------------------------------------------------------------------------------
// Config

// JSON fields of the model problems' configs: absent keys keep the defaults.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(QuadraticConfig, rows, cols, alpha, w_high, w_low,
                                                d_high, d_low, basis, basis_seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(MemoryConfig, classes, dim, embeddings, embedding_seed)

namespace {

// "arch" and the JSON keys of a config struct: the keys a config file of that arch may hold.
template <typename Config>
std::vector<std::string> keys_of(const Config& defaults) {
  std::vector<std::string> keys = {"arch"};
  const nlohmann::json fields = defaults;
  for (const auto& item : fields.items()) keys.push_back(item.key());
  return keys;
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t value) {
    if (value <= 0) throw InvalidArgument(fmt::format("model config: {} = {} must be > 0", field, value));
  };
  if (arch == "gpt") {
    positive("vocab_size", gpt.vocab_size);
    positive("block_size", gpt.block_size);
    positive("n_layer", gpt.n_layer);
    positive("n_head", gpt.n_head);
    positive("n_embd", gpt.n_embd);
    if (gpt.n_embd % gpt.n_head != 0) {
      throw InvalidArgument(fmt::format("model config: n_embd = {} is not divisible by n_head = {}",
                                        gpt.n_embd, gpt.n_head));
    }
  } else if (arch == "mlp") {
    if (mlp.sizes.size() < 2) {
      throw InvalidArgument(fmt::format("model config: sizes has {} entries, needs input and output",
                                        mlp.sizes.size()));
    }
    for (auto s : mlp.sizes) positive("sizes[]", s);
    if (mlp.activation != "tanh" && mlp.activation != "gelu" && mlp.activation != "relu" &&
        mlp.activation != "sigmoid") {
      throw InvalidArgument(fmt::format("model config: activation '{}': expected tanh, gelu, relu "
                                        "or sigmoid", mlp.activation));
    }
    if (mlp.loss != "cross_entropy" && mlp.loss != "mse") {
      throw InvalidArgument(fmt::format("model config: loss '{}': expected cross_entropy or mse",
                                        mlp.loss));
    }
  } else if (arch == "quadratic") {
    validate_quadratic(quadratic);
  } else if (arch == "memory") {
    validate_memory(memory);
  } else {
    throw InvalidArgument(fmt::format("model config: arch '{}': expected gpt, mlp, quadratic or "
                                      "memory", arch));
  }
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: model config is not valid JSON: {}", origin, e.what()));
  }
  if (!j.is_object()) throw FormatError(fmt::format("{}: model config must be a JSON object", origin));
  ModelConfig c;
  try {
    c.arch = j.value("arch", std::string("gpt"));
    static const std::vector<std::string> gpt_keys = {"arch", "vocab_size", "block_size", "n_layer",
                                                      "n_head", "n_embd", "bias", "tied", "dropout"};
    static const std::vector<std::string> mlp_keys = {"arch", "sizes", "activation", "loss"};
    static const std::vector<std::string> quadratic_keys = keys_of(QuadraticConfig{});
    static const std::vector<std::string> memory_keys = keys_of(MemoryConfig{});
    const auto& known = c.arch == "mlp"         ? mlp_keys
                        : c.arch == "quadratic" ? quadratic_keys
                        : c.arch == "memory"    ? memory_keys
                                                : gpt_keys;
    for (const auto& item : j.items()) {
      if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
        throw FormatError(fmt::format("{}: unknown model config key '{}'{}", origin, item.key(),
                                      did_you_mean(item.key(), known)));
      }
    }
    if (c.arch == "mlp") {
      c.mlp.sizes = j.value("sizes", c.mlp.sizes);
      c.mlp.activation = j.value("activation", c.mlp.activation);
      c.mlp.loss = j.value("loss", c.mlp.loss);
    } else if (c.arch == "quadratic") {
      c.quadratic = j.get<QuadraticConfig>();
    } else if (c.arch == "memory") {
      c.memory = j.get<MemoryConfig>();
    } else {
      c.gpt.vocab_size = j.value("vocab_size", c.gpt.vocab_size);
      c.gpt.block_size = j.value("block_size", c.gpt.block_size);
      c.gpt.n_layer = j.value("n_layer", c.gpt.n_layer);
      c.gpt.n_head = j.value("n_head", c.gpt.n_head);
      c.gpt.n_embd = j.value("n_embd", c.gpt.n_embd);
      c.gpt.bias = j.value("bias", c.gpt.bias);
      c.gpt.tied = j.value("tied", c.gpt.tied);
      if (j.value("dropout", 0.0) != 0.0) {
        throw FormatError(fmt::format("{}: dropout must be 0: curvature is measured in eval mode",
                                      origin));
      }
    }
  } catch (const nlohmann::json::type_error& e) {
    throw FormatError(fmt::format("{}: model config has a value of the wrong type: {}", origin,
                                  e.what()));
  }
  c.validate();
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw FormatError(fmt::format("cannot open model config '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

std::string ModelConfig::to_json() const {
  nlohmann::json j;
  j["arch"] = arch;
  if (arch == "mlp") {
    j["sizes"] = mlp.sizes;
    j["activation"] = mlp.activation;
    j["loss"] = mlp.loss;
  } else if (arch == "quadratic") {
    j.update(nlohmann::json(quadratic));
  } else if (arch == "memory") {
    j.update(nlohmann::json(memory));
  } else {
    j["vocab_size"] = gpt.vocab_size;
    j["block_size"] = gpt.block_size;
    j["n_layer"] = gpt.n_layer;
    j["n_head"] = gpt.n_head;
    j["n_embd"] = gpt.n_embd;
    j["bias"] = gpt.bias;
    j["tied"] = gpt.tied;
  }
  return j.dump();
}

std::string ModelConfig::describe() const {
  if (arch == "mlp") {
    std::vector<std::string> sizes;
    for (auto s : mlp.sizes) sizes.push_back(std::to_string(s));
    return fmt::format("mlp(sizes={}, activation={}, loss={})", join(sizes, "-"), mlp.activation,
                       mlp.loss);
  }
  if (arch == "quadratic") {
    const auto& q = quadratic;
    return fmt::format("quadratic(rows={}, cols={}, alpha={}, w_high={}, w_low={}, d_high={}, "
                       "d_low={}, basis={}, basis_seed={})", q.rows, q.cols, q.alpha, q.w_high,
                       q.w_low, q.d_high, q.d_low, q.basis, q.basis_seed);
  }
  if (arch == "memory") {
    const auto& m = memory;
    return fmt::format("memory(classes={}, dim={}, embeddings={}, embedding_seed={})", m.classes,
                       m.dim, m.embeddings, m.embedding_seed);
  }
  return fmt::format("gpt(n_layer={}, n_head={}, n_embd={}, vocab={}, block={}, bias={}, tied={})",
                     gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.vocab_size, gpt.block_size, gpt.bias,
                     gpt.tied);
}

// ---------------------------------------------------------------------------------------------
// Models: parameters live in one ordered list; forward passes are plain ATen calls on them, so
// everything is twice differentiable and nothing depends on torch::nn.

namespace {

class FunctionalModel : public Objective {
 public:
  const ParamSpace& space() const override { return space_; }
  ParamVector parameters() override { return params_; }

 protected:
  // Registers a parameter; the order of calls is the model's parameter order.
  at::Tensor& add(const std::string& name, at::Tensor value) {
    names_.push_back(name);
    params_.push_back(value.set_requires_grad(true));
    return params_.back();
  }
  void finish() { space_ = ParamSpace(names_, params_); }
  const at::Tensor& p(size_t i) const { return params_[i]; }

  std::vector<std::string> names_;
  ParamVector params_;
  ParamSpace space_;
};

at::Tensor mean_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t classes = logits.size(-1);
  return at::nll_loss(at::log_softmax(logits.reshape({-1, classes}), -1), targets.reshape({-1}));
}

class Gpt : public FunctionalModel {
 public:
  Gpt(const GptConfig& c, const ModelInit& init) : c_(c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(init.seed);
    auto opts = at::TensorOptions().dtype(at::kDouble);
    // Draw in float64 on the CPU from one generator, so the same seed gives the same model in
    // every dtype and on every device.
    auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::normal(0.0, std, shape, gen, opts).to(c10::Device(init.device), init.dtype);
    };
    auto filled = [&](std::vector<int64_t> shape, double value) {
      return at::full(shape, value, opts).to(c10::Device(init.device), init.dtype);
    };
    const int64_t C = c.n_embd;
    const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);
    add("transformer.wte.weight", normal({c.vocab_size, C}, 0.02));
    add("transformer.wpe.weight", normal({c.block_size, C}, 0.02));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = fmt::format("transformer.h.{}.", l);
      Layer layer;
      layer.ln_1_w = params_.size(); add(h + "ln_1.weight", filled({C}, 1.0));
      if (c.bias) add(h + "ln_1.bias", filled({C}, 0.0));
      layer.attn_w = params_.size(); add(h + "attn.c_attn.weight", normal({3 * C, C}, 0.02));
      if (c.bias) add(h + "attn.c_attn.bias", filled({3 * C}, 0.0));
      layer.attn_proj_w = params_.size(); add(h + "attn.c_proj.weight", normal({C, C}, proj_std));
      if (c.bias) add(h + "attn.c_proj.bias", filled({C}, 0.0));
      layer.ln_2_w = params_.size(); add(h + "ln_2.weight", filled({C}, 1.0));
      if (c.bias) add(h + "ln_2.bias", filled({C}, 0.0));
      layer.fc_w = params_.size(); add(h + "mlp.c_fc.weight", normal({4 * C, C}, 0.02));
      if (c.bias) add(h + "mlp.c_fc.bias", filled({4 * C}, 0.0));
      layer.mlp_proj_w = params_.size(); add(h + "mlp.c_proj.weight", normal({C, 4 * C}, proj_std));
      if (c.bias) add(h + "mlp.c_proj.bias", filled({C}, 0.0));
      layers_.push_back(layer);
    }
    ln_f_w_ = params_.size();
    add("transformer.ln_f.weight", filled({C}, 1.0));
    if (c.bias) add("transformer.ln_f.bias", filled({C}, 0.0));
    if (!c.tied) {
      head_ = params_.size();
      add("lm_head.weight", normal({c.vocab_size, C}, 0.02));
    }
    finish();
  }

  at::Tensor loss(const Batch& batch) override {
    const auto& x = batch.inputs;
    if (x.dim() != 2 || x.scalar_type() != at::kLong) {
      throw ModelError(fmt::format("gpt: inputs must be int64 tokens of shape (batch, T); got {} "
                                   "of shape {}", x.scalar_type(), x.sizes()));
    }
    if (!batch.targets.sizes().equals(x.sizes()) || batch.targets.scalar_type() != at::kLong) {
      throw ModelError(fmt::format("gpt: targets must be int64 of the inputs' shape {}; got {} of "
                                   "shape {}", x.sizes(), batch.targets.scalar_type(),
                                   batch.targets.sizes()));
    }
    const int64_t T = x.size(1);
    if (T > c_.block_size) {
      throw ModelError(fmt::format("gpt: sequence length {} exceeds block_size {}", T, c_.block_size));
    }
    const int64_t lo = x.min().item<int64_t>(), hi = x.max().item<int64_t>();
    if (lo < 0 || hi >= c_.vocab_size) {
      throw ModelError(fmt::format("gpt: token ids span [{}, {}], outside the vocabulary [0, {})",
                                   lo, hi, c_.vocab_size));
    }
    return mean_cross_entropy(logits(x), batch.targets);
  }

  at::Tensor token_losses(const Batch& batch) override {
    loss(Batch{batch.inputs.narrow(0, 0, 1), batch.targets.narrow(0, 0, 1)});  // validates
    auto l = logits(batch.inputs);
    const int64_t classes = l.size(-1);
    return at::nll_loss(at::log_softmax(l.reshape({-1, classes}), -1), batch.targets.reshape({-1}),
                        {}, at::Reduction::None)
        .reshape(batch.targets.sizes());
  }

  std::string describe() const override {
    ModelConfig config;
    config.gpt = c_;
    return config.describe();
  }

 private:
  struct Layer {
    size_t ln_1_w, attn_w, attn_proj_w, ln_2_w, fc_w, mlp_proj_w;
  };

  // Parameter i's bias partner when the model has biases (it directly follows its weight).
  at::Tensor bias_after(size_t weight) const { return c_.bias ? p(weight + 1) : at::Tensor(); }

  at::Tensor layer_norm(const at::Tensor& x, size_t weight) const {
    return at::layer_norm(x, {c_.n_embd}, p(weight), bias_after(weight), 1e-5);
  }

  at::Tensor logits(const at::Tensor& tokens) const {
    const int64_t B = tokens.size(0), T = tokens.size(1), C = c_.n_embd, H = c_.n_head;
    auto positions = at::arange(T, tokens.options());
    auto x = at::embedding(p(0), tokens) + at::embedding(p(1), positions);
    // Additive causal mask (0 above nothing, -inf above the diagonal): softmax of a masked row is
    // smooth in the unmasked entries, so double backward is exact.
    auto mask = at::full({T, T}, -std::numeric_limits<double>::infinity(), x.options()).triu(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(C / H));
    for (const auto& l : layers_) {
      auto h = layer_norm(x, l.ln_1_w);
      auto qkv = at::linear(h, p(l.attn_w), bias_after(l.attn_w)).split(C, -1);
      auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, C / H}).transpose(1, 2); };
      auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
      auto att = at::softmax(at::matmul(q, k.transpose(-2, -1)) * scale + mask, -1);
      auto y = at::matmul(att, v).transpose(1, 2).reshape({B, T, C});
      x = x + at::linear(y, p(l.attn_proj_w), bias_after(l.attn_proj_w));
      h = layer_norm(x, l.ln_2_w);
      h = at::gelu(at::linear(h, p(l.fc_w), bias_after(l.fc_w)));
      x = x + at::linear(h, p(l.mlp_proj_w), bias_after(l.mlp_proj_w));
    }
    x = layer_norm(x, ln_f_w_);
    return at::linear(x, c_.tied ? p(0) : p(head_));
  }

  GptConfig c_;
  std::vector<Layer> layers_;
  size_t ln_f_w_ = 0;
  size_t head_ = 0;
};

class Mlp : public FunctionalModel {
 public:
  Mlp(const MlpConfig& c, const ModelInit& init) : c_(c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(init.seed);
    auto opts = at::TensorOptions().dtype(at::kDouble);
    for (size_t i = 0; i + 1 < c.sizes.size(); ++i) {
      // PyTorch's Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
      const double bound = 1.0 / std::sqrt(static_cast<double>(c.sizes[i]));
      auto uniform = [&](std::vector<int64_t> shape) {
        return (at::rand(shape, gen, opts) * 2.0 - 1.0).mul(bound).to(c10::Device(init.device),
                                                                       init.dtype);
      };
      add(fmt::format("layers.{}.weight", i), uniform({c.sizes[i + 1], c.sizes[i]}));
      add(fmt::format("layers.{}.bias", i), uniform({c.sizes[i + 1]}));
    }
    finish();
  }

  at::Tensor loss(const Batch& batch) override {
    const auto& x = batch.inputs;
    if (x.dim() != 2 || x.size(1) != c_.sizes.front()) {
      throw ModelError(fmt::format("mlp: inputs must have shape (batch, {}); got {}",
                                   c_.sizes.front(), x.sizes()));
    }
    auto h = x.to(p(0).scalar_type());
    const size_t layers = c_.sizes.size() - 1;
    for (size_t i = 0; i < layers; ++i) {
      h = at::linear(h, p(2 * i), p(2 * i + 1));
      if (i + 1 < layers) h = activate(h);
    }
    if (c_.loss == "mse") {
      auto y = batch.targets.to(h.scalar_type());
      if (!y.sizes().equals(h.sizes())) {
        throw ModelError(fmt::format("mlp: mse targets must have shape {}; got {}", h.sizes(),
                                     batch.targets.sizes()));
      }
      return at::mse_loss(h, y);
    }
    if (batch.targets.scalar_type() != at::kLong || batch.targets.dim() != 1 ||
        batch.targets.size(0) != x.size(0)) {
      throw ModelError(fmt::format("mlp: cross_entropy targets must be int64 class ids of shape "
                                   "({}); got {} of shape {}", x.size(0),
                                   batch.targets.scalar_type(), batch.targets.sizes()));
    }
    return mean_cross_entropy(h, batch.targets);
  }

  std::string describe() const override {
    ModelConfig config;
    config.arch = "mlp";
    config.mlp = c_;
    return config.describe();
  }

 private:
  at::Tensor activate(const at::Tensor& h) const {
    if (c_.activation == "tanh") return at::tanh(h);
    if (c_.activation == "gelu") return at::gelu(h);
    if (c_.activation == "relu") return at::relu(h);
    return at::sigmoid(h);
  }
  MlpConfig c_;
};

}  // namespace

std::unique_ptr<Objective> make_model(const ModelConfig& config, const ModelInit& init) {
  config.validate();
  if (!at::isFloatingType(init.dtype)) {
    throw InvalidArgument(fmt::format("model dtype {} is not floating point", init.dtype));
  }
  if (config.arch == "mlp") return std::make_unique<Mlp>(config.mlp, init);
  if (config.arch == "quadratic") return make_quadratic_problem(config.quadratic, init);
  if (config.arch == "memory") return make_memory_problem(config.memory, init);
  return std::make_unique<Gpt>(config.gpt, init);
}

}  // namespace curv
