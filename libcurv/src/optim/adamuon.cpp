// pytorch-optimizer's AdaMuon (pytorch_optimizer/optimizer/muon/adamuon.py, 4.1; its default
// single-tensor path), operation for operation: on its use_muon groups the first moment is
// orthogonalised by Newton–Schulz in bfloat16, then divided elementwise by the square root of a
// second moment of that bfloat16 output (v, flat), rescaled to RMS-like norm and stepped with
// Muon's scale; its other groups take pytorch-optimizer's AdamW (adam_* fields). The bfloat16
// arithmetic the reference does in place is reproduced in bfloat16 here.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "optim/rules.h"

namespace curv {

namespace {

class AdaMuon : public Optimizer {
 public:
  AdaMuon(OptimizerConfig c, const ParamSpace& s, const ModelStructure& structure)
      : Optimizer(std::move(c), s), muon_(rules::muon_partition(config_, space_, structure)) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<AdaMuon>(*this); }

 protected:
  std::string rule(size_t i) const override { return muon_[i] ? config_.name : "adamw"; }
  std::vector<std::string> slots(size_t i) const override {
    if (muon_[i]) return {"m", "v"};
    return {"exp_avg", "exp_avg_sq"};
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    if (key == "v") return {space_[i].numel};  // the flattened parameter's
    return space_[i].shape;
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    const bool muon = muon_[i];
    const double lr = muon ? c.lr : c.adam_lr;
    const double wd = muon ? c.weight_decay : c.adam_weight_decay;
    const double b1 = muon ? c.beta1 : c.adam_beta1, b2 = muon ? c.beta2 : c.adam_beta2;
    const double eps = muon ? c.eps : c.adam_eps;
    const double step = static_cast<double>(t);
    const double bias1 = 1.0 - std::pow(b1, step), bias2 = 1.0 - std::pow(b2, step);
    auto [after, d] = rules::weight_decayed(theta, g, wd, c.decoupled, lr);
    if (!muon) {
      at::Tensor m = slot(i, "exp_avg", g), v = slot(i, "exp_avg_sq", g);
      m.lerp_(d, 1.0 - b1);
      v.lerp_(d.square(), 1.0 - b2);
      const at::Tensor denom = v.sqrt().div_(std::sqrt(bias2)).add_(eps);
      after.addcdiv_(m, denom, -lr / bias1);
      return after - theta;
    }
    at::Tensor m = slot(i, "m", g), v = slot(i, "v", g);
    m.lerp_(d, 1.0 - b1);
    const at::Tensor matrix = m.dim() > 2 ? m.view({m.size(0), -1}) : m;
    at::Tensor o =
        rules::newton_schulz_bf16(matrix, c.ns_steps, c.ns_a, c.ns_b, c.ns_c).reshape(v.sizes());
    v.mul_(b2).addcmul_(o, o, 1.0 - b2);
    o.div_((v / bias2).sqrt_().add_(eps));
    o = o.reshape(theta.sizes());
    const int64_t rows = theta.size(0), cols = theta.numel() / rows;
    const double scale = std::sqrt(static_cast<double>(std::min(rows, cols)));
    // Python's scale / tensor is the tensor's reciprocal times scale, here in bfloat16.
    o.mul_(at::linalg_vector_norm(o, 2).add_(eps).reciprocal() * scale);
    // Muon's two scales (muon_scale), the second by math.pow(x, 0.5) as the reference takes it.
    const double ratio =
        c.rms_scale
            ? 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)))
            : std::pow(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)), 0.5);
    after.add_(o, -(lr * ratio));
    return after - theta;
  }

 private:
  std::vector<bool> muon_;
};

}  // namespace

namespace rules {

at::Tensor newton_schulz_bf16(const at::Tensor& g, int64_t steps, double a, double b, double c) {
  const bool tall = g.size(-2) > g.size(-1);
  at::Tensor x = (tall ? g.mT() : g).to(at::kBFloat16).contiguous();
  at::Tensor norm = at::linalg_vector_norm(x, 2, at::IntArrayRef{-2, -1}, true);
  x.div_(norm.clamp_min_(1e-7));
  for (int64_t k = 0; k < steps; ++k) {
    const at::Tensor gram = at::mm(x, x.mT());
    const at::Tensor poly = at::addmm(gram, gram, gram, b, c);
    x = at::addmm(x, poly, x, a, 1.0);
  }
  return tall ? x.mT() : x;
}

std::unique_ptr<Optimizer> adamuon(const OptimizerConfig& c, const ParamSpace& s,
                                   const ModelStructure& structure) {
  return std::make_unique<AdaMuon>(c, s, structure);
}

}  // namespace rules

}  // namespace curv
