// pytorch-optimizer's SOAP (pytorch_optimizer/optimizer/soap.py, 4.1), operation for operation:
// Adam's second moment kept in the eigenbases Q of Shampoo's Kronecker factors GG, one per
// dimension of at most max_precondition_dim. The saved state holds GG and Q as lists
// (state['GG'][k], state['Q'][k]); libcurv names them GG.k and Q.k. The step at count t uses
// the Q saved with the state; the refresh (an eigendecomposition at the first step, one power
// iteration and a QR every precondition_frequency steps) comes after the parameter moves, so it
// shapes the next step, as in the reference. merge_dims is not read (recognition refuses it).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "optim/rules.h"

namespace curv {

namespace {

// The eigenvectors of a Kronecker factor, ascending, as the reference finds them: in its dtype, or
// in float64 when that fails (LAPACK's float32 workspace query overflows past a few thousand
// rows on some builds), cast back.
at::Tensor eigenbasis(const at::Tensor& gg) {
  try {
    return std::get<1>(at::linalg_eigh(gg + 1e-30 * at::eye(gg.size(0), gg.options())));
  } catch (const c10::Error&) {
    const at::Tensor wide = gg.to(at::kDouble);
    return std::get<1>(at::linalg_eigh(wide + 1e-30 * at::eye(gg.size(0), wide.options())))
        .to(gg.scalar_type());
  }
}

class Soap : public Optimizer {
 public:
  Soap(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Soap>(*this); }

 protected:
  // The dimensions of parameter i that get a Kronecker factor.
  std::vector<size_t> preconditioned(size_t i) const {
    const auto& shape = space_[i].shape;
    std::vector<size_t> dims;
    if (shape.size() == 1 && !config_.precondition_1d) return dims;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] <= config_.max_precondition_dim) dims.push_back(k);
    }
    return dims;
  }
  std::vector<std::string> slots(size_t i) const override {
    std::vector<std::string> out = {"exp_avg", "exp_avg_sq"};
    for (size_t k : preconditioned(i)) {
      out.push_back("GG." + std::to_string(k));
      out.push_back("Q." + std::to_string(k));
    }
    return out;
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    const auto dot = key.find('.');
    if (dot == std::string::npos) return space_[i].shape;
    const int64_t n = space_[i].shape[std::stoul(key.substr(dot + 1))];
    return {n, n};
  }

  // x in (forward) or out of (backward) the eigenbases: tensordot over each dimension in turn,
  // which also cycles the dimensions back to their order; a dimension without a factor is only
  // cycled.
  at::Tensor project(size_t i, at::Tensor x, bool forward) {
    const auto dims = preconditioned(i);
    const int64_t n = x.dim();
    for (int64_t k = 0; k < n; ++k) {
      if (std::find(dims.begin(), dims.end(), static_cast<size_t>(k)) != dims.end()) {
        const at::Tensor& q = slot(i, "Q." + std::to_string(k), x);
        const int64_t side = forward ? 0 : 1;
        x = at::tensordot(x, q, at::IntArrayRef{0}, at::IntArrayRef{side});
      } else {
        std::vector<int64_t> order;
        for (int64_t d = 1; d < n; ++d) order.push_back(d);
        order.push_back(0);
        x = x.permute(order);
      }
    }
    return x;
  }

  // GG ← lerp(GG, G_k G_kᵀ, 1 − shampoo_beta) for each factor; Q from an eigendecomposition the
  // first time, by one power iteration and a QR (in float32) every precondition_frequency steps.
  void update_preconditioner(size_t i, const at::Tensor& g, int64_t step, bool first) {
    const auto& c = config_;
    const double beta = c.shampoo_beta > 0 ? c.shampoo_beta : c.beta2;
    const auto dims = preconditioned(i);
    for (size_t k : dims) {
      at::Tensor& gg = slot(i, "GG." + std::to_string(k), g);
      at::Tensor outer;
      if (g.dim() == 1) {
        outer = at::matmul(g.unsqueeze(1), g.unsqueeze(0));
      } else {
        std::vector<int64_t> others;
        for (int64_t d = 0; d < g.dim(); ++d) {
          if (d != static_cast<int64_t>(k)) others.push_back(d);
        }
        outer = at::tensordot(g, g, others, others);
      }
      gg.lerp_(outer.to(gg.scalar_type()), 1.0 - beta);
    }
    if (first) {
      for (size_t k : dims) {
        const at::Tensor& gg = slot(i, "GG." + std::to_string(k), g);
        slot(i, "Q." + std::to_string(k), g) = at::flip(eigenbasis(gg), {1});
      }
    } else if (step > 0 && step % c.precondition_frequency == 0) {
      at::Tensor exp_avg_sq = slot(i, "exp_avg_sq", g);
      std::vector<at::Tensor> fresh;
      for (size_t k : dims) {
        const at::Tensor& gg = slot(i, "GG." + std::to_string(k), g);
        const at::Tensor& q = slot(i, "Q." + std::to_string(k), g);
        const at::Tensor product = at::matmul(gg, q);
        const at::Tensor estimate = (q * product).sum(0);
        const at::Tensor order = at::argsort(estimate, /*dim=*/0, /*descending=*/true);
        exp_avg_sq = exp_avg_sq.index_select(static_cast<int64_t>(k), order);
        const at::Tensor power = product.index_select(1, order);
        fresh.push_back(std::get<0>(at::linalg_qr(power.to(at::kFloat))).to(power.scalar_type()));
      }
      slot(i, "exp_avg_sq", g) = exp_avg_sq;
      for (size_t n = 0; n < dims.size(); ++n)
        slot(i, "Q." + std::to_string(dims[n]), g) = fresh[n];
    }
  }

  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    if (t == 1) {
      // The first call sets the factors and their eigenbases up and leaves θ where it is.
      if (state_dropped()) return at::zeros_like(theta);
      slot(i, "exp_avg", g);
      update_preconditioner(i, g, 0, true);
      return at::zeros_like(theta);
    }
    const int64_t step = t - 1;
    double step_size = c.lr;
    if (c.correct_bias) {
      const double bias1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
      const double bias2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, static_cast<double>(step)));
      step_size *= bias2_sqrt / bias1;
    }
    const at::Tensor projected = project(i, g, true);
    at::Tensor& m = slot(i, "exp_avg", g);
    at::Tensor& v = slot(i, "exp_avg_sq", g);
    m.lerp_(g, 1.0 - c.beta1);
    v.lerp_(projected.square(), 1.0 - c.beta2);
    const at::Tensor denom = v.sqrt().add_(c.eps);
    const at::Tensor m_projected = project(i, m, true);
    at::Tensor direction = project(i, m_projected / denom, false);
    if (c.normalize_gradient) {
      direction.div_(at::mean(direction.square()).sqrt_().add_(c.eps));
    }
    at::Tensor after = theta.clone();
    after.add_(direction, -step_size);
    if (c.weight_decay != 0) after.mul_(1.0 - c.weight_decay * c.lr);
    // The factors and bases this step leaves shape the next step only.
    if (!state_dropped()) update_preconditioner(i, g, step, false);
    return after - theta;
  }
};

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> soap(const OptimizerConfig& c, const ParamSpace& s,
                                const ModelStructure&) {
  return std::make_unique<Soap>(c, s);
}

}  // namespace rules

}  // namespace curv
