// The engine's passes away from its kept graphs: L(θ + u), gradients at offset parameters for
// finite-difference HVPs, and Gauss-Newton couplings. Each restores θ exactly.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/engine_internal.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/gauss_newton.h"

namespace curv {

namespace {
// The finite-difference step of 16-bit parameters in spacings of θ per coordinate: measured on
// the built-in GPT and LLaMA in bfloat16 (bench/precision_bench --fd-scan, docs/performance.md),
// 0.5 gave 1-3% error in uᵀHu where 2 or more gave up to 10% (truncation) on the larger models
// and 0.125 up to 10% (rounding) too.
constexpr double kSixteenBitSteps = 0.5;
}  // namespace

double fd_step_for(const ParamVector& theta) {
  int64_t n = 0;
  for (const auto& t : theta) n += t.numel();
  if (n == 0) return 0.0;
  const at::ScalarType dtype = theta.front().scalar_type();
  const double eps = engine_detail::machine_epsilon(dtype);
  // Scale by the parameters' RMS, not their norm: the norm grows with the parameter count while
  // the curvature scale per coordinate does not, and an oversized step turns truncation error
  // into the dominant term (measured: 1e-2 relative error on a tiny float32 GPT).
  const double rms = norm(theta) / std::sqrt(static_cast<double>(n));
  if (!is_16_bit(dtype)) return std::cbrt(eps) * std::max(1.0, rms);
  // 16-bit parameters: θ ± hv is rounded to the parameters' dtype, so a step far below θ's
  // spacing would mostly vanish and one far above it is dominated by truncation. Each coordinate
  // moves by kSixteenBitSteps · ε · RMS(θ) on average (about that many of its spacings), a norm
  // of that times sqrt(n).
  return kSixteenBitSteps * eps * std::max(rms, 1e-3) * std::sqrt(static_cast<double>(n));
}

using namespace engine_detail;

Eigen::MatrixXd CurvatureEngine::gauss_newton(
    const ParamVector& u, const std::vector<std::vector<size_t>>& supports,
    const std::function<void(size_t, const Eigen::MatrixXd&)>& observer) {
  Stopwatch timer(counters_.seconds);
  const auto L = static_cast<Eigen::Index>(supports.size());
  Eigen::MatrixXd total = Eigen::MatrixXd::Zero(L, L);
  for_each_batch(Pass::kGaussNewton, [&](size_t b, double w) {
    Eigen::MatrixXd g_b = Eigen::MatrixXd::Zero(L, L);
    for (const Slice& slice : state_->slices[b]) {
      const Eigen::MatrixXd g_s = gauss_newton_coupling(objective_, slice.batch, u, supports);
      ++counters_.forwards;
      g_b = state_->slices[b].size() == 1 ? g_s : Eigen::MatrixXd(g_b + slice.share * g_s);
    }
    if (observer) observer(b, g_b);
    total += w * g_b;
  });
  sum_over_ranks(total.data(), static_cast<size_t>(total.size()));
  return total;
}

double CurvatureEngine::loss_at(const ParamVector& u, std::vector<double>* batch_losses) {
  return loss_away([&](size_t i, at::Tensor& data) { data.add_(u.at(i)); }, batch_losses,
                   [&] { return fmt::format("θ + u (‖u‖ = {:.4g})", norm(u)); });
}

double CurvatureEngine::loss_at_point(const ParamVector& point, std::vector<double>* batch_losses) {
  if (point.size() != state_->params.size()) {
    throw InvalidArgument(fmt::format("loss_at_point: a point of {} tensors for {} parameters",
                                      point.size(), state_->params.size()));
  }
  return loss_away([&](size_t i, at::Tensor& data) { data.copy_(point[i]); }, batch_losses,
                   [] { return std::string("the given point"); });
}

double CurvatureEngine::loss_away(const std::function<void(size_t, at::Tensor&)>& move,
                                  std::vector<double>* batch_losses,
                                  const std::function<std::string()>& where) {
  Stopwatch timer(counters_.seconds);
  auto& s = *state_;
  const ParamVector saved = saved_parameters();
  double loss = 0.0;
  if (batch_losses) batch_losses->assign(probe_.size(), 0.0);
  {
    c10::NoGradGuard no_grad;
    // variable_data(): same storage, separate version counter, so the kept graphs survive the
    // excursion; the exact restore below makes them valid again.
    auto restore = [&] { restore_parameters(saved); };
    try {
      for (size_t i = 0; i < s.params.size(); ++i) {
        at::Tensor data = s.params[i].variable_data();
        move(i, data);
      }
      for_each_batch(Pass::kLossAt, [&](size_t b, double w) {
        const double value = batch_loss_value(b);
        loss += w * value;
        if (batch_losses) (*batch_losses)[b] = value;
      });
      if (communicator_->distributed()) {
        std::vector<double> sums{loss};
        if (batch_losses) sums.insert(sums.end(), batch_losses->begin(), batch_losses->end());
        sum_over_ranks(sums.data(), sums.size());
        loss = sums[0];
        if (batch_losses) std::copy(sums.begin() + 1, sums.end(), batch_losses->begin());
      }
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }
  if (options_.check_finite && std::isnan(loss)) {
    throw NumericalError(fmt::format(
        "loss of {} at {} is NaN; hint: the step leaves the region where the model is finite",
        objective_.describe(), where()));
  }
  return loss;
}

double CurvatureEngine::routing_change(const ParamVector& u) {
  return routing_away([&](size_t i, at::Tensor& data) { data.add_(u.at(i)); });
}

double CurvatureEngine::routing_change_to_point(const ParamVector& point) {
  if (point.size() != state_->params.size()) {
    throw InvalidArgument(
        fmt::format("routing_change_to_point: a point of {} tensors for {} "
                    "parameters",
                    point.size(), state_->params.size()));
  }
  return routing_away([&](size_t i, at::Tensor& data) { data.copy_(point[i]); });
}

double CurvatureEngine::routing_away(const std::function<void(size_t, at::Tensor&)>& move) {
  Stopwatch timer(counters_.seconds);
  auto& s = *state_;
  c10::NoGradGuard no_grad;
  // The choices at θ, slice by slice; a model without routing answers with nothing at once.
  std::vector<at::Tensor> before;
  for (const auto& batch : s.slices) {
    for (const Slice& slice : batch) {
      before.push_back(objective_.expert_choices(slice.batch));
      if (!before.back().defined()) return std::numeric_limits<double>::quiet_NaN();
      ++counters_.forwards;
    }
  }
  const ParamVector saved = saved_parameters();
  auto restore = [&] { restore_parameters(saved); };
  // Changed rows and all rows, summed over the ranks' probe batches.
  std::vector<double> counts{0.0, 0.0};
  try {
    for (size_t i = 0; i < s.params.size(); ++i) {
      at::Tensor data = s.params[i].variable_data();
      move(i, data);
    }
    size_t next = 0;
    for (const auto& batch : s.slices) {
      for (const Slice& slice : batch) {
        const at::Tensor after = objective_.expert_choices(slice.batch);
        ++counters_.forwards;
        const at::Tensor& was = before[next++];
        counts[0] += static_cast<double>((after != was).any(-1).sum().item<int64_t>());
        counts[1] += static_cast<double>(was.size(0));
      }
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  if (communicator_->distributed()) sum_over_ranks(counts.data(), counts.size());
  return counts[1] > 0 ? counts[0] / counts[1] : std::numeric_limits<double>::quiet_NaN();
}

double CurvatureEngine::forward_loss() {
  if (state_->have_first_order) return state_->loss;
  Stopwatch timer(counters_.seconds);
  double loss = 0.0;
  for_each_batch(Pass::kLoss, [&](size_t b, double w) { loss += w * batch_loss_value(b); });
  sum_over_ranks(&loss, 1);
  if (options_.check_finite && !std::isfinite(loss)) {
    throw NumericalError(
        fmt::format("loss of {} is {} (hint: check the checkpoint and the probe "
                    "batches for NaN, or token ids out of range)",
                    objective_.describe(), loss));
  }
  return loss;
}

double CurvatureEngine::batch_loss_value(size_t b) {
  c10::NoGradGuard no_grad;
  double value = 0.0;
  for (const Slice& slice : state_->slices[b]) {
    const double value_s = objective_.loss(slice.batch).item<double>();
    ++counters_.forwards;
    value += slice.share * value_s;
  }
  return value;
}

ParamVector CurvatureEngine::saved_parameters() const {
  const ParamVector& params = state_->params;
  if (!options_.host_copies || params.empty() || params.front().device().is_cpu()) {
    return clone(params);
  }
  // Pinned, so that the restores' copies to a CUDA device run at the bus's full rate.
  ParamVector saved;
  saved.reserve(params.size());
  for (const auto& p : params) {
    at::Tensor host = at::empty(p.sizes(), p.options().device(at::kCPU).pinned_memory(p.is_cuda()));
    host.copy_(p.detach());
    saved.push_back(std::move(host));
  }
  return saved;
}

void CurvatureEngine::restore_parameters(const ParamVector& saved) {
  c10::NoGradGuard no_grad;
  auto& params = state_->params;
  for (size_t i = 0; i < params.size(); ++i) params[i].variable_data().copy_(saved[i]);
}

ParamVector CurvatureEngine::batch_gradient_at(size_t b, const ParamVector& saved,
                                               const ParamVector* offset, double scale) {
  auto& s = *state_;
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < s.params.size(); ++i) {
      auto data = s.params[i].variable_data();
      data.copy_(saved[i]);
      // θ + scale · offset formed in the offset's dtype and rounded once to the parameters'.
      if (offset) data.add_((*offset)[i], scale);
    }
  }
  ParamVector g(s.params.size());
  for (const Slice& slice : s.slices[b]) {
    ParamVector g_s;
    if (options_.recompute_layers) {
      g_s = staged_pass(objective_, slice.batch, s.params, nullptr, /*want_gradient=*/true).grads;
    } else {
      at::Tensor loss_s = objective_.loss(slice.batch);
      g_s = torch::autograd::grad({loss_s}, s.params, {}, false, false, true);
    }
    g_s = fill_undefined(std::move(g_s), s.params);
    counters_.forwards += options_.recompute_layers ? 2 : 1;
    ++counters_.backwards;
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < g.size(); ++i) {
      accumulate(g[i], std::move(g_s[i]), slice.share, vector_dtype_);
    }
  }
  return g;
}

ParamVector CurvatureEngine::hvp_finite_difference(const ParamVector& v, double step,
                                                   const BatchObserver& observer) {
  Stopwatch timer(counters_.seconds);
  auto& s = *state_;
  const double v_norm = norm(v);
  if (v_norm == 0.0 && !observer) return converted(zeros_like(s.params), vector_dtype_);
  if (step <= 0.0) step = options_.fd_step;
  if (step <= 0.0) step = fd_step_for(s.params);
  const double h = v_norm > 0.0 ? step / v_norm : 0.0;
  // Per batch, so that each batch's H_b v exists for an observer; θ is written back exactly from
  // `saved` before every evaluation and after the last, and θ ± h·v formed in place (no
  // perturbed copy of v is held).
  const ParamVector saved = saved_parameters();
  auto restore = [&] { restore_parameters(saved); };
  ParamVector result(s.params.size());
  try {
    for_each_batch(Pass::kGradientAtOffset, [&](size_t b, double w) {
      ParamVector hv;
      if (v_norm > 0.0) {
        hv = batch_gradient_at(b, saved, &v, h);
        ParamVector g_minus = batch_gradient_at(b, saved, &v, -h);
        c10::NoGradGuard no_grad;
        for (size_t i = 0; i < hv.size(); ++i) hv[i].sub_(g_minus[i]).div_(2.0 * h);
      } else {
        hv = converted(zeros_like(s.params), vector_dtype_);
      }
      if (observer) {
        ParamVector g_b = batch_gradient_at(b, saved, nullptr);
        observer(BatchTerms{b, w, &g_b, &hv});
      }
      for (size_t i = 0; i < hv.size(); ++i)
        accumulate(result[i], std::move(hv[i]), w, vector_dtype_);
    });
    std::vector<double> none;
    reduce(result, none);
  } catch (...) {
    restore();
    throw;
  }
  restore();
  fill_zeros(result, s.params, vector_dtype_);
  ++counters_.hvps;
  check(result, "the finite-difference Hessian-vector product");
  return result;
}

}  // namespace curv
