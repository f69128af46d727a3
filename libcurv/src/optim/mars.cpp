// pytorch-optimizer's MARS (pytorch_optimizer/optimizer/mars.py, 4.1) of its default AdamW type,
// operation for operation as its foreach path (the default) takes a step. On matrices (every
// parameter with optimize_1d) the gradient is corrected by the change since the last one,
// c = g + gamma·β₁/(1 − β₁)·(g − g_last), clipped to norm 1, and fed to Adam's moments; vectors
// take plain Adam with lr·lr_1d_factor, betas_1d and weight_decay_1d. The weight decay comes
// after the moments, as the reference applies it: decoupled, it scales θ; as an L2 term it only
// enters the gradient kept for the next correction (last_grad).
#include <ATen/ATen.h>

#include <cmath>

#include "optim/rules.h"

namespace curv {

namespace {

class Mars : public Optimizer {
 public:
  Mars(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Mars>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override {
    return {"exp_avg", "exp_avg_sq", "last_grad"};
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    const bool mixed = c.optimize_1d || theta.dim() >= 2;
    const double lr = mixed ? c.lr : c.lr * c.lr_1d_factor;
    const double b1 = mixed ? c.beta1 : c.beta1_1d, b2 = mixed ? c.beta2 : c.beta2_1d;
    const double wd = mixed ? c.weight_decay : c.weight_decay_1d;
    const double step = static_cast<double>(t);
    const double bias1 = 1.0 - std::pow(b1, step);
    const double bias2_sqrt = std::sqrt(1.0 - std::pow(b2, step));
    at::Tensor m = slot(i, "exp_avg", g), v = slot(i, "exp_avg_sq", g);
    at::Tensor last = slot(i, "last_grad", g);
    at::Tensor corrected = g;
    if (mixed) {
      corrected = g.sub(last);
      corrected.mul_(c.gamma * b1 / (1.0 - b1));
      corrected.add_(g);
      corrected.div_(at::linalg_vector_norm(corrected, 2).clamp_min(1.0));
    }
    m.lerp_(corrected, 1.0 - b1);
    at::Tensor u = m.clone();
    v.mul_(b2).addcmul_(corrected, corrected, 1.0 - b2);
    at::Tensor denom = v.add(1e-15);
    denom.sqrt_().add_(c.eps);
    denom.div_(bias2_sqrt).mul_(bias1);
    u.div_(denom);
    auto [after, kept] = rules::weight_decayed(theta, g, wd, c.decoupled, c.fixed_decay ? 1.0 : lr);
    after.add_(u, -lr);
    last.copy_(kept);
    return after - theta;
  }
};

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> mars(const OptimizerConfig& c, const ParamSpace& s,
                                const ModelStructure&) {
  return std::make_unique<Mars>(c, s);
}

}  // namespace rules

}  // namespace curv
