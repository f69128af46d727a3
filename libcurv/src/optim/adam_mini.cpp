// Adam-mini (the adam-mini package, 1.1.1: adam_mini/adam_mini.py), operation for operation: Adam
// with one second moment per block instead of per entry. The blocks come from the parameter's
// name (lower-cased), by the reference's default name sets, in its order:
//   "bias"                                   Adam itself (m, v)
//   q_proj, k_proj, wq, wk, query, key       one second moment per head: m viewed as
//                                            (numel / head_numel, head_numel), vmean per row
//   embed, embd, wte; lm_head, output,       one per output row (neuron): vmean (rows, 1)
//   final_layer; v_proj, wv, value;
//   o_proj, wo, attn.proj; feed_forward,
//   linear, mlp
//   anything else (norms)                    one for the whole tensor: vmean a scalar
// head_numel is the reference's dim·dim / n_heads. Names with "norm", "ln" or "bias" take no
// weight decay, as the reference's constructor sets their groups.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "curv/core/error.h"
#include "optim/rules.h"

namespace curv {

namespace {

enum class Block { kAdam, kHead, kNeuron, kWhole };

bool mentions(const std::string& name, std::initializer_list<const char*> parts) {
  return std::any_of(parts.begin(), parts.end(),
                     [&](const char* part) { return name.find(part) != std::string::npos; });
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Block block_of(const std::string& parameter) {
  const std::string name = lower(parameter);
  if (mentions(name, {"bias"})) return Block::kAdam;
  if (mentions(name, {"k_proj", "q_proj", "wq", "wk", "query", "key"})) return Block::kHead;
  if (mentions(name, {"embed", "embd", "wte", "lm_head", "output", "final_layer", "v_proj", "wv",
                      "value", "o_proj", "wo", "attn.proj", "feed_forward", "linear", "mlp"})) {
    return Block::kNeuron;
  }
  return Block::kWhole;
}

class AdamMini : public Optimizer {
 public:
  AdamMini(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<AdamMini>(*this); }

 protected:
  std::vector<std::string> slots(size_t i) const override {
    if (block_of(space_[i].name) == Block::kAdam) return {"m", "v"};
    return {"m", "vmean"};
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    const auto& shape = space_[i].shape;
    const Block b = block_of(space_[i].name);
    const int64_t numel = space_[i].numel;
    if (b == Block::kHead && numel % config_.head_numel != 0) {
      throw InvalidArgument(fmt::format(
          "optimizer adam-mini: parameter '{}' ({} entries) is a query or key block, which "
          "head_numel = {} (dim·dim / n_heads) does not divide",
          space_[i].name, numel, config_.head_numel));
    }
    if ((b == Block::kHead || b == Block::kNeuron) && shape.size() != 2) {
      throw InvalidArgument(
          fmt::format("optimizer adam-mini: parameter '{}' has {} dimensions; its name puts it in "
                      "a per-row block, which Adam-mini takes for matrices only",
                      space_[i].name, shape.size()));
    }
    if (b == Block::kHead) {
      const int64_t heads = numel / config_.head_numel;
      return key == "m" ? std::vector<int64_t>{heads, config_.head_numel}
                        : std::vector<int64_t>{heads, 1};
    }
    if (key != "vmean") return shape;
    if (b == Block::kNeuron) return {shape[0], 1};
    return {};
  }

  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    const std::string name = lower(space_[i].name);
    const Block block = block_of(name);
    const double step = static_cast<double>(t);
    const double bias1 = 1.0 - std::pow(c.beta1, step);
    const double bias2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, step));
    const double wd = mentions(name, {"norm", "ln", "bias"}) ? 0.0 : c.weight_decay;
    at::Tensor after = theta.clone();
    at::Tensor m = slot(i, "m", g);
    if (block == Block::kAdam) {
      at::Tensor v = slot(i, "v", g);
      v.mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
      if (wd > 0) after.mul_(1.0 - c.lr * wd);
      m.lerp_(g, 1.0 - c.beta1);
      const at::Tensor h = (v.sqrt() / bias2_sqrt).add_(c.eps);
      after.addcdiv_(m, h, -(c.lr / bias1));
      return after - theta;
    }
    at::Tensor vmean = slot(i, "vmean", g);
    const at::Tensor grad = block == Block::kHead ? g.view(m.sizes()) : g;
    const at::Tensor mean_square =
        block == Block::kWhole
            ? (g * g).sum().div(static_cast<double>(static_cast<float>(g.numel())))
            : (grad * grad).mean(at::IntArrayRef{1}, /*keepdim=*/true);
    vmean.mul_(c.beta2).add_(mean_square, 1.0 - c.beta2);
    if (wd > 0) after.mul_(1.0 - c.lr * wd);
    m.lerp_(grad, 1.0 - c.beta1);
    const at::Tensor h = (vmean.sqrt() / bias2_sqrt).add_(c.eps);
    // Python's (1 / bias1) / h is h.reciprocal() * (1 / bias1).
    const at::Tensor stepsize = h.reciprocal().mul(1.0 / bias1);
    at::Tensor u = (m * stepsize).view(theta.sizes());
    u.mul_(c.lr);
    after.sub_(u);
    return after - theta;
  }
};

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> adam_mini(const OptimizerConfig& c, const ParamSpace& s,
                                     const ModelStructure&) {
  return std::make_unique<AdamMini>(c, s);
}

}  // namespace rules

}  // namespace curv
