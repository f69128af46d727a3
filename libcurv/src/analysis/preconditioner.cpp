// Adam's preconditioner read from a checkpoint's saved state (the scaling core's ScaledOperator
// applies for the preconditioned sharpness), and the overlap of a direction with the top
// eigenspace: the parts of spectrum.h that read optimizer state and parameter-space vectors.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "analysis/krylov.h"
#include "curv/analysis/spectrum.h"
#include "curv/core/checkpoint_meta.h"
#include "curv/core/error.h"

namespace curv {

std::string to_string(PrecondStatus status) {
  switch (status) {
    case PrecondStatus::kConverged:
      return "converged";
    case PrecondStatus::kNotConverged:
      return "not_converged";
    case PrecondStatus::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

double AdamPreconditioner::edge_of_stability() const {
  return (2.0 + 2.0 * beta1) / ((1.0 - beta1) * lr);
}

std::string adam_preconditioner(const SavedOptimizer& saved, const ParamSpace& space,
                                AdamPreconditioner* out) {
  const std::string& name = saved.record.name;
  if (name != "adam" && name != "adamw") {
    if (name.empty()) {
      return saved.record.refusal.empty() ? "meta.json names no optimizer" : saved.record.refusal;
    }
    return fmt::format(
        "saved by optimizer '{}', which keeps no Adam second moment "
        "for every parameter",
        name);
  }
  if (!saved.has_state()) return "the checkpoint has no optimizer.safetensors";
  const int64_t t = saved.step_count();
  if (t <= 0) return fmt::format("optimizer step count {} (no Adam step taken yet)", t);
  AdamPreconditioner p;
  p.step_count = t;
  p.lr = saved.hyper("lr", 1e-3);
  p.beta1 = saved.hyper("beta1", 0.9);
  p.beta2 = saved.hyper("beta2", 0.999);
  p.eps = saved.hyper("eps", 1e-8);
  if (!(p.lr > 0) || !(p.beta1 >= 0 && p.beta1 < 1) || !(p.beta2 >= 0 && p.beta2 < 1) ||
      !(p.eps >= 0)) {
    throw InvalidArgument(
        fmt::format("{}: Adam hyper-parameters lr={} beta1={} beta2={} "
                    "eps={} out of range",
                    saved.meta_file, p.lr, p.beta1, p.beta2, p.eps));
  }
  const double bias2 = 1.0 - std::pow(p.beta2, static_cast<double>(t));
  p.inverse_sqrt.resize(space.numel());
  for (size_t i = 0; i < space.size(); ++i) {
    at::Tensor v = optimizer_state(saved, space[i], "exp_avg_sq", false);
    if (!v.defined()) {
      return fmt::format("optimizer.safetensors has no exp_avg_sq for parameter '{}'",
                         space[i].name);
    }
    at::Tensor d = (v.to(at::kCPU, at::kDouble) / bias2).sqrt().add_(p.eps).rsqrt().contiguous();
    if (!at::isfinite(d).all().item<bool>()) {
      return fmt::format(
          "exp_avg_sq of '{}' gives a non-finite P^-1/2 (zero entries with eps = {})",
          space[i].name, p.eps);
    }
    std::copy_n(d.data_ptr<double>(), d.numel(), p.inverse_sqrt.data() + space[i].offset);
  }
  *out = std::move(p);
  return "";
}

Overlap direction_overlap(const ParamVector& u, const std::vector<at::Tensor>& eigenvectors,
                          const ParamVector& gradient) {
  const at::Tensor flat_u = flat_float64(u), flat_g = flat_float64(gradient);
  const int64_t n = flat_u.numel();
  using krylov::dot_value;
  Overlap out;
  const double uu = dot_value(flat_u, flat_u);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& v : eigenvectors) {
    if (v.dim() != 1 || v.numel() != n) {
      throw InvalidArgument(
          fmt::format("direction_overlap: eigenvector of length {}, direction {}", v.numel(), n));
    }
    const double c = dot_value(v.to(flat_u.device(), at::kDouble), flat_u);
    out.per_vector.push_back(uu > 0 ? c * c / uu : nan);
  }
  out.eigenspace_share =
      uu > 0 ? std::accumulate(out.per_vector.begin(), out.per_vector.end(), 0.0) : nan;
  const double gg = dot_value(flat_g, flat_g);
  out.gradient_cosine = uu > 0 && gg > 0 ? dot_value(flat_g, flat_u) / std::sqrt(uu * gg) : nan;
  return out;
}

}  // namespace curv
