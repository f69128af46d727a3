// pytorch-optimizer's SCION (pytorch_optimizer/optimizer/scion.py, 4.1), operation for operation
// as its foreach path (the default) takes a step: the gradient (plus wd·θ as an L2 term) mixed
// into d by d ← d + momentum·(g − d), then the linear minimisation oracle of d, scaled by the
// radius `scale`, is the step: θ' = θ − lr · scale · lmo(d) (θ(1 − lr·wd) first with decoupled
// decay, θ(1 − lr) with constraint). The oracles (norm_type and its norm_kwargs):
//   auto (1)      bias RMS for vectors, spectral for matrices, spectral of a convolution for 3 and
//   4
//                 dimensions, each with its defaults
//   spectral (2)  Newton–Schulz in bfloat16 (ns_steps), times sqrt(d_out/d_in) (normalize, the
//                 default) or sqrt(d_out), at least 1 with max_scale
//   conv (3)      the same on (d_out, −1), times sqrt(d_out/d_in) / kernel volume
//   sign (4)      sign(d), divided by d_in (normalize, the default)
//   bias (5)      d / (RMS(d over dimension 0) + 1e-8)
//   column (6)    d / (column norms / sqrt(d_in), times d_out with normalize (default off) + 1e-8)
//   row (7)       d / (row norms, times sqrt(row length) with normalize (default on) + 1e-8)
//   none (0)      d
// Spectral oracles return bfloat16, and their scaling is bfloat16 arithmetic, as in the reference.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "curv/core/error.h"
#include "optim/rules.h"

namespace curv {

namespace {

enum Oracle : int64_t { kNone, kAuto, kSpectral, kConv, kSign, kBias, kColumn, kRow };

constexpr double kEps = 1e-8;

class Scion : public Optimizer {
 public:
  Scion(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Scion>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override { return {"d"}; }

  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t) override {
    const auto& c = config_;
    at::Tensor after = theta, grad = g;
    if (!c.constraint && c.weight_decay > 0) {
      std::tie(after, grad) = rules::weight_decayed(theta, g, c.weight_decay, c.decoupled, c.lr);
    }
    at::Tensor d = slot(i, "d", g);
    d.lerp_(grad, c.momentum);
    at::Tensor u = oracle(oracle_of(i), d);
    u.mul_(c.scale);
    if (c.constraint) after = after.mul(1.0 - c.lr);
    return after.add(u, -c.lr) - theta;
  }

 private:
  // The oracle parameter i takes (auto resolved by its number of dimensions); InvalidArgument for
  // a shape it cannot take.
  Oracle oracle_of(size_t i) const {
    const auto& shape = space_[i].shape;
    const int64_t n = static_cast<int64_t>(shape.size());
    Oracle o = static_cast<Oracle>(config_.lmo);
    if (o == kAuto) o = n <= 1 ? kBias : n == 2 ? kSpectral : kConv;
    const bool matrix_only = o == kSpectral || o == kSign || o == kColumn;
    if ((matrix_only && n != 2) || (o == kConv && n != 3 && n != 4) || (o == kRow && n < 1)) {
      throw InvalidArgument(
          fmt::format("optimizer scion: parameter '{}' has {} dimensions, which its oracle "
                      "(lmo = {}) does not take",
                      space_[i].name, n, config_.lmo));
    }
    return o;
  }

  // The oracle's normalize option: the config's, or the oracle's own default.
  bool normalize(bool fallback) const {
    return config_.lmo_normalize < 0 ? fallback : config_.lmo_normalize == 1;
  }

  at::Tensor oracle(Oracle o, const at::Tensor& d) const {
    const auto& c = config_;
    const bool configured = c.lmo != kAuto;  // auto takes each oracle with its defaults
    switch (o) {
      case kSpectral:
      case kConv: {
        const int64_t steps = configured ? c.ns_steps : 5;
        at::Tensor x =
            rules::newton_schulz_bf16(d.reshape({d.size(0), -1}), steps, 3.4445, -4.7750, 2.0315)
                .reshape(d.sizes());
        const double ratio = static_cast<double>(d.size(0)) / static_cast<double>(d.size(1));
        double scale = std::sqrt(ratio);
        if (o == kConv) {
          scale /= static_cast<double>(d.numel() / (d.size(0) * d.size(1)));
        } else {
          if (configured && !normalize(true)) scale = std::sqrt(static_cast<double>(d.size(0)));
          if (configured && c.lmo_max_scale) scale = std::max(1.0, scale);
        }
        return x.mul_(scale);
      }
      case kSign: {
        at::Tensor s = at::sign(d);
        return normalize(true) ? s.div_(static_cast<double>(d.size(1))) : s;
      }
      case kBias:
        return d / at::sqrt(d.pow(2).mean(at::IntArrayRef{0}, true)).add_(kEps);
      case kColumn:
      case kRow: {
        const at::Tensor x = c.lmo_transpose ? d.transpose(0, 1) : d;
        at::Tensor rms;
        if (o == kColumn) {
          rms = at::sqrt(x.pow(2).sum(at::IntArrayRef{0}, true)) /
                std::sqrt(static_cast<double>(x.size(0)));
          if (normalize(false)) rms.mul_(static_cast<double>(x.size(1)));
        } else {
          rms = at::sqrt(x.pow(2).sum(at::IntArrayRef{-1}, true));
          if (normalize(true)) rms.mul_(std::sqrt(static_cast<double>(x.size(-1))));
        }
        const at::Tensor y = x / rms.add_(kEps);
        return c.lmo_transpose ? y.transpose(0, 1) : y;
      }
      default:
        return d.clone();
    }
  }
};

}  // namespace

namespace rules {

std::unique_ptr<Optimizer> scion(const OptimizerConfig& c, const ParamSpace& s,
                                 const ModelStructure&) {
  return std::make_unique<Scion>(c, s);
}

}  // namespace rules

}  // namespace curv
