// pytorch-optimizer's Shampoo (pytorch_optimizer/optimizer/shampoo.py, 4.1), operation for
// operation: per dimension k a statistic Lₖ (pre_cond_k, from matrix_eps·I) accumulating G₍ₖ₎G₍ₖ₎ᵀ
// and its inverse 2·order-th root (inv_pre_cond_k, by an SVD every precondition_frequency steps);
// the gradient, mixed with the last preconditioned step by momentum, is multiplied by each root
// along its dimension. pytorch-optimizer keeps preconditioning_compute_steps outside the
// state_dict: it is precondition_frequency here, 1 (its default) unless named.
#include <ATen/ATen.h>

#include <cmath>

#include "optim/rules.h"

namespace curv {

namespace {

// pytorch-optimizer's compute_power_svd: U diag(s^(−1/power)) Vᵀ of a symmetric matrix.
at::Tensor inverse_root(const at::Tensor& matrix, double power) {
  const at::ScalarType dtype = matrix.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto [u, s, vh] = at::linalg_svd(matrix.to(dtype), /*full_matrices=*/false);
  s.pow_(-1.0 / power);
  return at::matmul(u * s.unsqueeze(-2), vh).to(matrix.scalar_type());
}

class Shampoo : public Optimizer {
 public:
  Shampoo(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Shampoo>(*this); }

 protected:
  std::vector<std::string> slots(size_t i) const override {
    std::vector<std::string> out;
    if (config_.momentum > 0) out.push_back("momentum_buffer");
    for (size_t k = 0; k < space_[i].shape.size(); ++k) {
      out.push_back("pre_cond_" + std::to_string(k));
      out.push_back("inv_pre_cond_" + std::to_string(k));
    }
    return out;
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    if (key == "momentum_buffer") return space_[i].shape;
    const int64_t n = space_[i].shape[std::stoul(key.substr(key.rfind('_') + 1))];
    return {n, n};
  }

  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    const int64_t order = g.dim();
    auto stat = [&](const char* key, int64_t k) -> at::Tensor& {
      return slot(i, key + std::to_string(k), g);
    };
    if (t == 1) {
      // The reference's first step starts the statistics at matrix_eps·I and the momentum at g.
      if (c.momentum > 0) slot(i, "momentum_buffer", g).copy_(g);
      for (int64_t k = 0; k < order; ++k) {
        stat("pre_cond_", k).copy_(at::eye(g.size(k), g.options()).mul_(c.matrix_eps));
      }
    }
    at::Tensor mixed = g.clone();
    if (c.momentum > 0) mixed.lerp_(slot(i, "momentum_buffer", g), c.momentum);
    auto [after, d] = rules::weight_decayed(theta, mixed, c.weight_decay, c.decoupled,
                                            c.fixed_decay ? 1.0 : c.lr);
    const at::Tensor statistics = d;
    const auto original = d.sizes().vec();
    at::Tensor x = d;
    for (int64_t k = 0; k < order; ++k) {
      const int64_t n = g.size(k);
      const at::Tensor unfolded = statistics.movedim(k, 0).reshape({n, -1});
      at::Tensor& pre = stat("pre_cond_", k);
      pre.addmm_(unfolded, unfolded.t());
      x = x.transpose(0, k).contiguous();
      const auto transposed = x.sizes().vec();
      x = x.view({n, -1});
      at::Tensor& inv = stat("inv_pre_cond_", k);
      if (t % c.precondition_frequency == 0) {
        inv.copy_(inverse_root(pre, 2.0 * static_cast<double>(order)));
      }
      x = k == order - 1 ? at::matmul(x.t(), inv).view(original)
                         : at::matmul(inv, x).view(transposed);
    }
    if (c.momentum > 0) slot(i, "momentum_buffer", g) = x;
    after.add_(x, -c.lr);
    return after - theta;
  }
};

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> shampoo(const OptimizerConfig& c, const ParamSpace& s,
                                   const ModelStructure&) {
  return std::make_unique<Shampoo>(c, s);
}

}  // namespace rules

}  // namespace curv
