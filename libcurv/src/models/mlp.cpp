// The built-in MLP: Linear layers "layers.<i>.weight/bias" with PyTorch's default initialisation,
// one activation between them, cross-entropy or mse loss.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "models/architecture.h"

namespace curv {

namespace {

class Mlp : public FunctionalModel {
 public:
  Mlp(const MlpConfig& c, const ModelInit& init) : c_(c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(init.seed);
    auto opts = at::TensorOptions().dtype(at::kDouble);
    for (size_t i = 0; i + 1 < c.sizes.size(); ++i) {
      // PyTorch's Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
      const double bound = 1.0 / std::sqrt(static_cast<double>(c.sizes[i]));
      auto uniform = [&](std::vector<int64_t> shape) {
        return (at::rand(shape, gen, opts) * 2.0 - 1.0)
            .mul(bound)
            .to(c10::Device(init.device), init.dtype);
      };
      add(fmt::format("layers.{}.weight", i), uniform({c.sizes[i + 1], c.sizes[i]}));
      add(fmt::format("layers.{}.bias", i), uniform({c.sizes[i + 1]}));
    }
    finish();
  }

  // Plain layers: no attention, embeddings or head; each Linear is its own layer.
  ModelStructure structure() const override {
    ModelStructure s;
    for (size_t i = 0; i < params_.size(); ++i) {
      s.params.push_back({ParamRole::kOther, static_cast<int64_t>(i / 2), {}});
    }
    return s;
  }

  at::Tensor loss(const Batch& batch) override {
    at::Tensor h = forward(batch.inputs);
    if (c_.loss == "mse") {
      auto y = batch.targets.to(h.scalar_type());
      if (!y.sizes().equals(h.sizes())) {
        throw ModelError(fmt::format("mlp: mse targets must have shape {}; got {}", h.sizes(),
                                     batch.targets.sizes()));
      }
      return at::mse_loss(h, y);
    }
    check_class_targets(batch);
    return mean_cross_entropy(h, batch.targets);
  }

  // The outputs are logits only under cross-entropy; an mse MLP keeps the default (ModelError).
  at::Tensor logits(const Batch& batch) override {
    if (c_.loss != "cross_entropy") return Objective::logits(batch);
    at::Tensor h = forward(batch.inputs);
    check_class_targets(batch);
    return h;
  }

  std::string describe() const override { return ModelConfig("mlp", c_).describe(); }

 private:
  // The last layer's outputs on inputs (batch, sizes[0]); throws ModelError on any other shape.
  at::Tensor forward(const at::Tensor& x) const {
    if (x.dim() != 2 || x.size(1) != c_.sizes.front()) {
      throw ModelError(fmt::format("mlp: inputs must have shape (batch, {}); got {}",
                                   c_.sizes.front(), x.sizes()));
    }
    auto h = x.to(p(0).scalar_type());
    const size_t layers = c_.sizes.size() - 1;
    for (size_t i = 0; i < layers; ++i) {
      h = linear_map(h, 2 * i, 2 * i + 1);
      if (i + 1 < layers) h = activate(h);
    }
    return h;
  }

  void check_class_targets(const Batch& batch) const {
    if (batch.targets.scalar_type() != at::kLong || batch.targets.dim() != 1 ||
        batch.targets.size(0) != batch.inputs.size(0)) {
      throw ModelError(
          fmt::format("mlp: cross_entropy targets must be int64 class ids of shape "
                      "({}); got {} of shape {}",
                      batch.inputs.size(0), batch.targets.scalar_type(), batch.targets.sizes()));
    }
  }

  at::Tensor activate(const at::Tensor& h) const {
    if (c_.activation == "tanh") return at::tanh(h);
    if (c_.activation == "gelu") return at::gelu(h);
    if (c_.activation == "relu") return at::relu(h);
    return at::sigmoid(h);
  }
  MlpConfig c_;
};

class MlpArchitecture : public TypedArchitecture<MlpConfig> {
 public:
  std::string name() const override { return "mlp"; }
  std::vector<std::string> keys() const override { return {"sizes", "activation", "loss"}; }
  MlpConfig from_json(const nlohmann::json& j, const std::string&) const override {
    MlpConfig c;
    c.sizes = j.value("sizes", c.sizes);
    c.activation = j.value("activation", c.activation);
    c.loss = j.value("loss", c.loss);
    return c;
  }
  nlohmann::json to_json_object(const MlpConfig& c) const override {
    return {{"sizes", c.sizes}, {"activation", c.activation}, {"loss", c.loss}};
  }
  void validate_config(const MlpConfig& c) const override {
    if (c.sizes.size() < 2) {
      throw InvalidArgument(fmt::format(
          "model config: sizes has {} entries, needs input and output", c.sizes.size()));
    }
    for (auto s : c.sizes) {
      if (s <= 0) throw InvalidArgument(fmt::format("model config: sizes[] = {} must be > 0", s));
    }
    if (c.activation != "tanh" && c.activation != "gelu" && c.activation != "relu" &&
        c.activation != "sigmoid") {
      throw InvalidArgument(
          fmt::format("model config: activation '{}': expected tanh, gelu, relu "
                      "or sigmoid",
                      c.activation));
    }
    if (c.loss != "cross_entropy" && c.loss != "mse") {
      throw InvalidArgument(
          fmt::format("model config: loss '{}': expected cross_entropy or mse", c.loss));
    }
  }
  std::string describe_config(const MlpConfig& c) const override {
    std::vector<std::string> sizes;
    for (auto s : c.sizes) sizes.push_back(std::to_string(s));
    return fmt::format("mlp(sizes={}, activation={}, loss={})", join(sizes, "-"), c.activation,
                       c.loss);
  }
  std::unique_ptr<Objective> build(const MlpConfig& c, const ModelInit& init) const override {
    return std::make_unique<Mlp>(c, init);
  }
  ModelData data_of(const MlpConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kFeatures;
    d.features = c.sizes.front();
    d.classes = c.sizes.back();
    return d;
  }
};

}  // namespace

std::shared_ptr<const Architecture> mlp_architecture() {
  return std::make_shared<MlpArchitecture>();
}

}  // namespace curv
