// pytorch-optimizer's Kron, PSGD with Kronecker-factored preconditioners
// (pytorch_optimizer/optimizer/psgd.py, 4.1), operation for operation: the bias-corrected momentum
// m̂ is multiplied along each dimension k by Q_kᵀQ_k (Q_k upper triangular, Q.k) or by q_k² (a
// diagonal factor: a dimension of size 1 or above max_size_triangular, a tensor of fewer than
// min_ndim_triangular dimensions, or one memory_save_mode makes diagonal), scaled to an RMS of at
// most 1.1, plus decoupled weight decay on matrices.
//
// The factors are fitted every 1/p steps (p the update probability: a constant, or the default
// schedule of the step count) against a Gaussian probe vector drawn from the global generator,
// which no state_dict holds. So a step rebuilt from saved state uses the saved factors as they are,
// and says so (step_note) when the reference would have fitted them first; curvtrain's training
// steps fit them as the reference does.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "optim/rules.h"

namespace curv {

namespace {

// The number of steps since the last fit at which Kron fits its factors again: 1/p, with p
// pytorch-optimizer's precondition_update_prob_schedule (its defaults) at step n, in float32 as the
// reference computes both, or a constant p (a Python float) in float64; infinite when p is 0.
double fit_threshold(double constant, int64_t n) {
  if (constant >= 0) return constant > 0 ? 1.0 / constant : std::numeric_limits<double>::infinity();
  const at::Tensor p =
      at::exp(at::scalar_tensor(static_cast<double>(n), at::kFloat).sub(500.0).mul(-0.001))
          .clamp(0.03, 1.0);
  return p.reciprocal().item<double>();
}

// psgd's norm_lower_bound: a lower bound on the spectral norm of a (square) matrix from one
// power-iteration step along its largest row or column.
at::Tensor norm_lower_bound(at::Tensor a) {
  const at::Tensor max_abs = a.abs().max();
  const double tiny = a.scalar_type() == at::kDouble ? std::numeric_limits<double>::min()
                                                     : std::numeric_limits<float>::min();
  a = a / at::where(max_abs > 0, max_abs, at::ones_like(max_abs));
  const at::Tensor aa = a * a;
  const auto [value0, i] = aa.sum(0).max(0);
  const auto [value1, j] = aa.sum(1).max(0);
  const at::Tensor x0 = at::matmul(a.index_select(1, i.reshape({1})).flatten(), a);
  const at::Tensor bound0 = at::linalg_vector_norm(
      at::matmul(x0 / at::linalg_vector_norm(x0, 2).clamp_min(tiny), a.t()), 2);
  const at::Tensor x1 = at::matmul(a, a.index_select(0, j.reshape({1})).flatten());
  const at::Tensor bound1 = at::linalg_vector_norm(
      at::matmul(a.t(), x1 / at::linalg_vector_norm(x1, 2).clamp_min(tiny)), 2);
  return max_abs * at::where(value0 > value1, bound0, bound1);
}

// x with `m` applied along dimension k: m (n×n) times the mode-k unfolding, or a vector m (n)
// scaling each slice.
at::Tensor along(const at::Tensor& x, int64_t k, const at::Tensor& m) {
  if (m.dim() < 2) {
    std::vector<int64_t> shape(x.dim(), 1);
    shape[k] = m.size(0);
    return x * m.view(shape);
  }
  at::Tensor moved = x.movedim(k, 0);
  const auto sizes = moved.sizes().vec();
  return at::matmul(m, moved.reshape({sizes[0], -1})).view(sizes).movedim(0, k);
}

class Kron : public Optimizer {
 public:
  Kron(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Kron>(*this); }

 protected:
  std::vector<std::string> slots(size_t i) const override {
    std::vector<std::string> out = {"momentum_buffer"};
    for (size_t k = 0; k < std::max<size_t>(1, space_[i].shape.size()); ++k) {
      out.push_back("Q." + std::to_string(k));
    }
    return out;
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    const auto& shape = space_[i].shape;
    if (key == "momentum_buffer" || shape.empty()) return shape;
    const size_t k = std::stoul(key.substr(2));
    if (diagonal(i)[k]) return {shape[k]};
    return {shape[k], shape[k]};
  }
  std::optional<at::ScalarType> slot_dtype(size_t, const std::string& key) const override {
    if (key == "momentum_buffer" || config_.precondition_dtype == 0) return std::nullopt;
    return config_.precondition_dtype == 64 ? at::kDouble : at::kFloat;
  }

  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    if (t != decided_at_) decide(t);
    const bool matrix = theta.dim() >= 2;
    at::Tensor grad = g;
    if (matrix && !c.decoupled && c.weight_decay != 0) grad = g.add(theta, c.weight_decay);
    const bool fresh = !has_slot(i, "momentum_buffer");
    at::Tensor m = slot(i, "momentum_buffer", g);
    std::vector<at::Tensor> q = factors(i, g, fresh);
    m.mul_(c.momentum).add_(grad, 1.0 - c.momentum);
    const at::ScalarType dtype = q[0].scalar_type();
    const at::Tensor debiased =
        (m / (1.0 - std::pow(c.momentum, static_cast<double>(t)))).to(dtype);
    if (fit_ && !state_dropped()) {
      if (matrix && balance_) balance(q);
      fit(q, debiased, c.momentum_into_precondition_update ? debiased : grad.to(dtype));
    }
    if (fit_ && state_dropped()) {
      note_ =
          "the saved preconditioner used without the fit the reference makes at this step (its "
          "probe vector is drawn from the global generator, which the state does not hold)";
    }
    at::Tensor x = debiased;
    for (int64_t k = 0; k < std::max<int64_t>(1, x.dim()); ++k) {
      x = x.dim() == 0 ? x * q[0] * q[0]
                       : along(along(x, k, q[k]), k, q[k].dim() < 2 ? q[k] : q[k].t());
    }
    x = x.to(theta.scalar_type());
    const at::Tensor rms = x.square().mean().sqrt() + 1e-6;
    // Python's 1.1 / t is t.reciprocal() * 1.1.
    x.mul_(at::clamp_max(rms.reciprocal().mul(1.1), 1.0));
    if (matrix && c.decoupled && c.weight_decay != 0) x.add_(theta, c.weight_decay);
    return theta.add(x, -c.lr) - theta;
  }

 private:
  // Which of parameter i's dimensions keep a diagonal factor (psgd's initialize_q_expressions).
  std::vector<bool> diagonal(size_t i) const {
    const auto& shape = space_[i].shape;
    const int64_t n = static_cast<int64_t>(shape.size());
    std::vector<bool> diag(shape.size(), false);
    if (n == 0) return diag;
    // numpy's argsort of a small array keeps ties in order, so the last largest dimension is
    // the one memory_save_mode makes diagonal.
    int64_t largest = 0;
    for (int64_t k = 0; k < n; ++k) {
      if (shape[k] >= shape[largest]) largest = k;
    }
    std::vector<int64_t> sorted = shape;
    std::sort(sorted.begin(), sorted.end());
    const int64_t mode = config_.memory_save_mode;
    if (mode == 1 || (mode == 2 && n >= 2 && sorted[n - 1] > sorted[n - 2])) diag[largest] = true;
    for (int64_t k = 0; k < n; ++k) {
      diag[k] = diag[k] || mode == 3 || shape[k] == 1 || shape[k] > config_.max_size_triangular ||
                n < config_.min_ndim_triangular;
    }
    return diag;
  }

  // Parameter i's factors, set to scale^(1/ndim)·I (or ·1) when its state is fresh.
  std::vector<at::Tensor> factors(size_t i, const at::Tensor& g, bool fresh) {
    const auto keys = slots(i);
    const auto diag = diagonal(i);
    const double scale = g.dim() == 0 ? config_.precondition_init_scale
                                      : std::pow(config_.precondition_init_scale,
                                                 1.0 / static_cast<double>(g.dim()));
    std::vector<at::Tensor> q;
    for (size_t k = 1; k < keys.size(); ++k) {
      at::Tensor& f = slot(i, keys[k], g);
      if (fresh) {
        if (f.dim() == 2) {
          f.copy_(at::eye(f.size(0), f.options()).mul_(scale));
        } else {
          f.fill_(scale);
        }
      }
      q.push_back(f);
    }
    return q;
  }

  // The step's fit and balance decisions, made once per step from the first group's counter.
  void decide(int64_t t) {
    auto& c = config_;
    const int64_t counter = c.update_counter + 1;
    fit_ = static_cast<double>(counter) >= fit_threshold(c.update_probability, t - 1);
    c.update_counter = fit_ ? 0 : counter;
    balance_ = fit_ && !state_dropped() && at::rand({1}, at::kDouble).item<double>() < 0.01;
    decided_at_ = t;
  }

  // psgd's balance_q: the factors' largest entries made equal to their geometric mean.
  static void balance(std::vector<at::Tensor>& q) {
    std::vector<at::Tensor> norms;
    for (const auto& f : q) norms.push_back(f.abs().max());
    const at::Tensor all = at::stack(norms);
    const at::Tensor mean = all.prod().pow(1.0 / static_cast<double>(q.size()));
    for (size_t k = 0; k < q.size(); ++k) q[k].mul_(mean / all[k]);
  }

  // psgd's update_precondition: one step of the factors' fit to the pair (probe v, m̂).
  void fit(std::vector<at::Tensor>& q, const at::Tensor& debiased, const at::Tensor& target) {
    const at::Tensor v = at::randn_like(debiased);
    const double eps = 1.1754943508222875e-38;  // torch.finfo(torch.bfloat16).tiny
    at::Tensor a = target, b = v;
    if (target.dim() == 0) {
      a = target * q[0];
      b = v / q[0];
    }
    for (int64_t k = 0; k < target.dim(); ++k) {
      a = along(a, k, q[k]);
      // b ← b along k by Q_k⁻ᵀ (the reference's solves run in float32).
      if (q[k].dim() < 2) {
        b = along(b, k, 1.0 / q[k]);
      } else {
        at::Tensor moved = b.movedim(k, 0);
        const auto sizes = moved.sizes().vec();
        const at::Tensor solved = at::linalg_solve_triangular(
            q[k].t().to(at::kFloat), moved.reshape({sizes[0], -1}).to(at::kFloat), false);
        b = solved.to(b.scalar_type()).view(sizes).movedim(0, k);
      }
    }
    for (int64_t k = 0; k < static_cast<int64_t>(q.size()); ++k) {
      auto gram = [&](const at::Tensor& x) {
        if (x.dim() == 0) return x * x;
        const at::Tensor u = x.movedim(k, 0).reshape({x.size(k), -1});
        return q[k].dim() < 2 ? u.square().sum(1) : at::matmul(u, u.t());
      };
      const at::Tensor term1 = gram(a), term2 = gram(b);
      at::Tensor step = (term1 - term2) * config_.precondition_lr;
      if (q[k].dim() < 2) {
        step.mul_(q[k]).div_((term1 + term2).abs().max().add(eps));
      } else {
        step = at::triu(step).div_(norm_lower_bound(term1 + term2).add(eps));
        step = at::matmul(step, q[k]);
      }
      q[k].sub_(step);
    }
  }

  int64_t decided_at_ = -1;
  bool fit_ = false, balance_ = false;
};

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> kron(const OptimizerConfig& c, const ParamSpace& s,
                                const ModelStructure&) {
  return std::make_unique<Kron>(c, s);
}

}  // namespace rules

}  // namespace curv
