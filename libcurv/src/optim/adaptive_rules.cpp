// torch.optim's Muon, NAdam, RAdam and Adafactor, and pytorch-optimizer's AdEMAMix, each operation
// for operation as its reference takes a step (torch/optim/*.py single-tensor paths, the CPU
// default; pytorch_optimizer/optimizer/ademamix.py). Each rule forms the parameter after the step
// as the reference does and returns its difference from θ, so that a rebuilt step is the
// reference's θ_after − θ_before to the last rounding.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/strings.h"
#include "curv/core/error.h"
#include "optim/rules.h"

namespace curv {

namespace {

// torch.optim.Muon: B ← lerp(B, g, 1 − μ); Nesterov lerp(g, B, μ); Newton–Schulz in bfloat16
// (torch/optim/_muon.py, _zeropower_via_newtonschulz); θ ← θ(1 − lr·wd) − lr·adjust(A, B)·O. On
// the parameters outside its partition, torch.optim.AdamW with the adam_* fields: the pairing
// torch's documentation recommends, read from a list of the two optimizers' states.
class TorchMuon : public Optimizer {
 public:
  TorchMuon(OptimizerConfig c, const ParamSpace& s, const ModelStructure& structure)
      : Optimizer(std::move(c), s), muon_(rules::muon_partition(config_, space_, structure)) {
    for (size_t i = 0; i < space_.size(); ++i) {
      if (muon_[i] && space_[i].shape.size() != 2) {
        throw InvalidArgument(
            fmt::format("optimizer torch-muon: parameter '{}' has shape {}; torch.optim.Muon "
                        "takes matrices only (muon_params '{}')",
                        space_[i].name, shape_string(space_[i].shape), config_.muon_params));
      }
    }
  }
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<TorchMuon>(*this); }

 protected:
  std::string rule(size_t i) const override { return muon_[i] ? config_.name : "adamw"; }
  std::vector<std::string> slots(size_t i) const override {
    if (!muon_[i]) return {"exp_avg", "exp_avg_sq"};
    return {"momentum_buffer"};
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    if (!muon_[i]) {
      return rules::adamw_update(theta, g, slot(i, "exp_avg", g), slot(i, "exp_avg_sq", g), t,
                                 c.adam_lr, c.adam_beta1, c.adam_beta2, c.adam_eps,
                                 c.adam_weight_decay);
    }
    at::Tensor& buf = slot(i, "momentum_buffer", g);
    buf.lerp_(g, 1 - c.momentum);
    const at::Tensor d = c.nesterov ? g.lerp(buf, c.momentum) : buf;
    at::Tensor x = d.to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/true);
    const bool tall = d.size(0) > d.size(1);
    if (tall) x = x.t();
    x.div_(at::linalg_vector_norm(x, 2).clamp_min(c.eps));
    for (int64_t k = 0; k < c.ns_steps; ++k) {
      const at::Tensor gram = at::matmul(x, x.t());
      const at::Tensor gram_update = at::addmm(gram, gram, gram, c.ns_b, c.ns_c);
      x = at::addmm(x, gram_update, x, c.ns_a);
    }
    if (tall) x = x.t();
    // "original" and "match_rms_adamw" are Muon's two scales; "spectral_unclamped" is its own.
    const int64_t rows = theta.size(0), cols = theta.size(1);
    const double ratio = c.adjust_lr == 2
                             ? std::sqrt(static_cast<double>(rows) / static_cast<double>(cols))
                             : muon_scale(rows, cols, c.adjust_lr == 1);
    at::Tensor after = theta.mul(1 - c.lr * c.weight_decay);
    after.add_(x, -c.lr * ratio);
    return after - theta;
  }

 private:
  std::vector<bool> muon_;
};

// torch.optim.NAdam: μₜ = β₁(1 − ½·0.96^(t·ψ)), the product of the μ kept as a float32 scalar
// (mu_product), the Nesterov step from the gradient and the first moment.
class NAdam : public Optimizer {
 public:
  NAdam(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<NAdam>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override {
    return {"exp_avg", "exp_avg_sq", "mu_product"};
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    return key == "mu_product" ? std::vector<int64_t>{} : space_[i].shape;
  }
  std::optional<at::ScalarType> slot_dtype(size_t, const std::string& key) const override {
    return key == "mu_product" ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt;
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    at::Tensor m = slot(i, "exp_avg", g), v = slot(i, "exp_avg_sq", g);
    at::Tensor mu_product = slot(i, "mu_product", g);
    if (t == 1) mu_product.fill_(1.0);  // torch starts the product at one
    const double step = static_cast<double>(t);
    const double bias2 = 1 - std::pow(c.beta2, step);
    auto [after, d] = rules::weight_decayed(theta, g, c.weight_decay, c.decoupled, c.lr);
    const double mu = c.beta1 * (1.0 - 0.5 * std::pow(0.96, step * c.momentum_decay));
    const double mu_next = c.beta1 * (1.0 - 0.5 * std::pow(0.96, (step + 1) * c.momentum_decay));
    mu_product.mul_(mu);
    m.lerp_(d, 1 - c.beta1);
    v.mul_(c.beta2).addcmul_(d, d, 1 - c.beta2);
    at::Tensor denom = v.div(bias2).sqrt();
    const double product = mu_product.item<double>();
    const double product_next = product * mu_next;
    denom.add_(c.eps);
    after.addcdiv_(d, denom, -c.lr * (1.0 - mu) / (1.0 - product));
    after.addcdiv_(m, denom, (-c.lr * mu_next) / (1.0 - product_next));
    return after - theta;
  }
};

// torch.optim.RAdam: Adam's step times the rectification r(ρₜ) while ρₜ > 5, the bias-corrected
// momentum alone before.
class RAdam : public Optimizer {
 public:
  RAdam(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<RAdam>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override { return {"exp_avg", "exp_avg_sq"}; }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    at::Tensor m = slot(i, "exp_avg", g), v = slot(i, "exp_avg_sq", g);
    const double step = static_cast<double>(t);
    auto [after, d] = rules::weight_decayed(theta, g, c.weight_decay, c.decoupled, c.lr);
    m.lerp_(d, 1 - c.beta1);
    v.mul_(c.beta2).addcmul_(d, d, 1 - c.beta2);
    const double bias1 = 1 - std::pow(c.beta1, step);
    const double bias2 = 1 - std::pow(c.beta2, step);
    const at::Tensor corrected = m / bias1;
    const double rho_inf = 2 / (1 - c.beta2) - 1;
    const double rho_t = rho_inf - 2 * step * std::pow(c.beta2, step) / bias2;
    if (rho_t > 5.0) {
      const double rect = std::pow(
          (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0.5);
      // Python's float / Tensor is the tensor's reciprocal times the float.
      const at::Tensor adaptive = v.sqrt().add_(c.eps).reciprocal() * std::pow(bias2, 0.5);
      after.add_(corrected * c.lr * adaptive * rect, -1.0);
    } else {
      after.add_(corrected * c.lr, -1.0);
    }
    return after - theta;
  }
};

// torch.optim.Adafactor: row and column second moments for tensors of two or more dimensions (a
// full one for vectors), β₂ₜ = 1 − t^beta2_decay, the step relative to the parameter's RMS and
// clipped to RMS ≤ d.
class Adafactor : public Optimizer {
 public:
  Adafactor(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Adafactor>(*this); }

 protected:
  std::vector<std::string> slots(size_t i) const override {
    if (space_[i].shape.size() > 1) return {"row_var", "col_var"};
    return {"variance"};
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    std::vector<int64_t> shape = space_[i].shape;
    if (key == "row_var") shape.back() = 1;
    if (key == "col_var") shape[shape.size() - 2] = 1;
    return shape;
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    const double step = static_cast<double>(t);
    const double numel = static_cast<double>(theta.numel());
    const double eps1 = c.eps > 0
                            ? c.eps
                            : (theta.scalar_type() == at::kDouble
                                   ? std::numeric_limits<double>::epsilon()
                                   : static_cast<double>(std::numeric_limits<float>::epsilon()));
    const double weight = std::pow(step, c.beta2_decay);
    const double rho = std::min(c.lr, 1 / std::pow(step, 0.5));
    const double alpha =
        std::max(c.eps2, at::linalg_vector_norm(theta, 2).item<double>() / std::pow(numel, 0.5)) *
        rho;
    at::Tensor after = theta.clone();
    if (c.weight_decay != 0) after.mul_(1 - c.lr * c.weight_decay);
    at::Tensor estimate;
    if (g.dim() > 1) {
      at::Tensor row = slot(i, "row_var", g), col = slot(i, "col_var", g);
      row.lerp_(at::linalg_vector_norm(g, 2, at::IntArrayRef{-1}, true).square_().div_(g.size(-1)),
                weight);
      col.lerp_(at::linalg_vector_norm(g, 2, at::IntArrayRef{-2}, true).square_().div_(g.size(-2)),
                weight);
      estimate = at::matmul(row, col);
      estimate.div_(row.mean({-2}, true).clamp_(eps1));
    } else {
      at::Tensor variance = slot(i, "variance", g);
      variance.lerp_(g * g, weight);
      estimate = variance.clone();
    }
    at::Tensor u = estimate.clamp_(eps1 * eps1).rsqrt_();
    u.mul_(g);
    const double denom = std::max(1.0, at::linalg_vector_norm(u, 2).item<double>() /
                                           (std::pow(numel, 0.5) * c.clip_threshold));
    after.add_(u, -alpha / denom);
    return after - theta;
  }
};

// pytorch-optimizer's AdEMAMix (its foreach path, the default): Adam's moments plus a slow EMA
// (β₃) added with weight α; α and β₃ warm up over t_alpha_beta3 steps when it is set.
class AdEMAMix : public Optimizer {
 public:
  AdEMAMix(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<AdEMAMix>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override {
    return {"exp_avg", "exp_avg_sq", "exp_avg_slow"};
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    at::Tensor m = slot(i, "exp_avg", g), v = slot(i, "exp_avg_sq", g);
    at::Tensor slow = slot(i, "exp_avg_slow", g);
    const double step = static_cast<double>(t);
    const double bias1 = 1.0 - std::pow(c.beta1, step);
    const double bias2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, step));
    double alpha = c.alpha, beta3 = c.beta3;
    if (c.t_alpha_beta3 > 0) {
      const double T = c.t_alpha_beta3;
      alpha = std::min(step * c.alpha / T, c.alpha);
      const double log1 = std::log(c.beta1), log3 = std::log(c.beta3);
      beta3 =
          std::min(std::exp(log1 * log3 / ((1.0 - step / T) * log3 + (step / T) * log1)), c.beta3);
    }
    auto [after, d] =
        rules::weight_decayed(theta, g, c.weight_decay, c.decoupled, c.fixed_decay ? 1.0 : c.lr);
    m.lerp_(d, 1.0 - c.beta1);
    v.mul_(c.beta2).addcmul_(d, d, 1.0 - c.beta2);
    slow.lerp_(d, 1.0 - beta3);
    at::Tensor denom = v.sqrt();
    denom.div_(bias2_sqrt).add_(c.eps);
    at::Tensor u = m.div(bias1);
    u.add_(slow, alpha);
    after.addcdiv_(u, denom, -c.lr);
    return after - theta;
  }
};

// schedulefree's AdamWScheduleFree (adamw_schedulefree.py, its foreach path), in train mode: the
// parameters are y, where the gradient is taken; z is the base iterate and the average
// x = (y − (1 − β₁)z)/β₁ is implicit. The group's running weight_sum and lr_max advance once per
// step, before its first parameter.
class AdamWScheduleFree : public Optimizer {
 public:
  AdamWScheduleFree(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override {
    return std::make_unique<AdamWScheduleFree>(*this);
  }

 protected:
  std::vector<std::string> slots(size_t) const override { return {"z", "exp_avg_sq"}; }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    auto& c = config_;
    const double k = static_cast<double>(t - 1);
    const double sched =
        t - 1 < c.warmup_steps ? (k + 1) / static_cast<double>(c.warmup_steps) : 1.0;
    const double lr = c.lr * sched;
    if (advanced_ != t) {
      // The group's scalars, once per step.
      c.lr_max = std::max(lr, c.lr_max);
      weight_ = std::pow(k + 1, c.r) * std::pow(c.lr_max, c.weight_lr_power);
      c.weight_sum = c.weight_sum + weight_;
      advanced_ = t;
    }
    const double ckp1 = c.weight_sum == 0 ? 0.0 : weight_ / c.weight_sum;
    const double bias2 = 1 - std::pow(c.beta2, k + 1);
    at::Tensor z = slot(i, "z", g), v = slot(i, "exp_avg_sq", g);
    if (t == 1) z.copy_(theta);  // the reference starts z at the parameters
    v.mul_(c.beta2).addcmul_(g, g, 1 - c.beta2);
    at::Tensor denom = v.div(bias2);
    denom.sqrt_().add_(c.eps);
    at::Tensor normalized = g.div(denom);
    if (c.weight_decay != 0) normalized.add_(theta, c.weight_decay);
    at::Tensor after = theta.clone();
    after.lerp_(z, ckp1);
    after.add_(normalized, lr * (c.beta1 * (1 - ckp1) - 1));
    z.sub_(normalized, lr);
    return after - theta;
  }

 private:
  int64_t advanced_ = 0;
  double weight_ = 0;
};

}  // namespace

namespace rules {

std::pair<at::Tensor, at::Tensor> weight_decayed(const at::Tensor& theta, const at::Tensor& g,
                                                 double wd, bool decoupled, double scale) {
  at::Tensor after = theta.clone(), d = g;
  if (wd != 0) {
    if (decoupled) {
      after.mul_(1.0 - wd * scale);
    } else {
      d = g.add(theta, wd);
    }
  }
  return {after, d};
}

}  // namespace rules

namespace {

template <typename Rule>
std::unique_ptr<Optimizer> make(const OptimizerConfig& c, const ParamSpace& s) {
  return std::make_unique<Rule>(c, s);
}

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> torch_muon(const OptimizerConfig& c, const ParamSpace& s,
                                      const ModelStructure& structure) {
  return std::make_unique<TorchMuon>(c, s, structure);
}
std::unique_ptr<Optimizer> nadam(const OptimizerConfig& c, const ParamSpace& s,
                                 const ModelStructure&) {
  return make<NAdam>(c, s);
}
std::unique_ptr<Optimizer> radam(const OptimizerConfig& c, const ParamSpace& s,
                                 const ModelStructure&) {
  return make<RAdam>(c, s);
}
std::unique_ptr<Optimizer> adafactor(const OptimizerConfig& c, const ParamSpace& s,
                                     const ModelStructure&) {
  return make<Adafactor>(c, s);
}
std::unique_ptr<Optimizer> ademamix(const OptimizerConfig& c, const ParamSpace& s,
                                    const ModelStructure&) {
  return make<AdEMAMix>(c, s);
}
std::unique_ptr<Optimizer> adamw_schedulefree(const OptimizerConfig& c, const ParamSpace& s,
                                              const ModelStructure&) {
  return make<AdamWScheduleFree>(c, s);
}

}  // namespace rules

}  // namespace curv
