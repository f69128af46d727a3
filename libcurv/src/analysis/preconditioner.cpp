// Adam's preconditioner read from a checkpoint's saved state, the Hessian it scales
// (ScaledOperator) for the preconditioned sharpness, and the overlap of a direction with the top
// eigenspace: the parts of spectrum.h that read optimizer state and parameter-space vectors.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

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

ScaledOperator::ScaledOperator(LinearOperator& inner, Eigen::VectorXd d)
    : inner_(inner), d_(std::move(d)), scratch_(inner.rows()) {
  if (d_.size() != inner_.rows()) {
    throw InvalidArgument(fmt::format("ScaledOperator: scaling has {} entries, operator {} rows",
                                      d_.size(), inner_.rows()));
  }
}

void ScaledOperator::apply(const double* x, double* y) {
  scratch_ = d_.cwiseProduct(Eigen::Map<const Eigen::VectorXd>(x, d_.size()));
  inner_.apply(scratch_.data(), y);
  Eigen::Map<Eigen::VectorXd> out(y, d_.size());
  out = out.cwiseProduct(d_);
  ++applies_;
}

double AdamPreconditioner::edge_of_stability() const {
  return (2.0 + 2.0 * beta1) / ((1.0 - beta1) * lr);
}

std::string adam_preconditioner(const SavedOptimizer& saved, const ParamSpace& space,
                                AdamPreconditioner* out) {
  const std::string& name = saved.record.name;
  if (name != "adam" && name != "adamw") {
    return name.empty() ? "meta.json names no optimizer"
                        : fmt::format(
                              "saved by optimizer '{}', which keeps no Adam second moment "
                              "for every parameter",
                              name);
  }
  if (saved.tensors.empty()) return "the checkpoint has no optimizer.safetensors";
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

Overlap direction_overlap(const ParamVector& u, const std::vector<Eigen::VectorXd>& eigenvectors,
                          const ParamVector& gradient) {
  int64_t n = 0;
  for (const auto& t : u) n += t.numel();
  Eigen::VectorXd flat_u(n), flat_g(n);
  to_flat(u, flat_u.data());
  to_flat(gradient, flat_g.data());
  Overlap out;
  const double uu = flat_u.squaredNorm();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& v : eigenvectors) {
    if (v.size() != n) {
      throw InvalidArgument(
          fmt::format("direction_overlap: eigenvector of length {}, direction {}", v.size(), n));
    }
    const double c = v.dot(flat_u);
    out.per_vector.push_back(uu > 0 ? c * c / uu : nan);
  }
  out.eigenspace_share =
      uu > 0 ? std::accumulate(out.per_vector.begin(), out.per_vector.end(), 0.0) : nan;
  const double gg = flat_g.squaredNorm();
  out.gradient_cosine = uu > 0 && gg > 0 ? flat_g.dot(flat_u) / std::sqrt(uu * gg) : nan;
  return out;
}

}  // namespace curv
