// Hessian-vector products over the probe set: by a second backward of each slice's gradient
// graph (kept or recomputed), by layer-wise passes (EngineOptions::recompute_layers), or by
// finite differences (engine_offset_passes.cpp); returned, or written into a caller's buffer.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <numeric>

#include "core/engine_internal.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

using engine_detail::accumulate;
using engine_detail::fill_undefined;
using engine_detail::fill_zeros;
using engine_detail::StageSink;
using engine_detail::Stopwatch;

namespace {

// 0, 1, …, n − 1: every parameter as a support or target list.
std::vector<size_t> every_index(size_t n) {
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  return all;
}

}  // namespace

ParamVector CurvatureEngine::hvp(const ParamVector& v, const BatchObserver& observer) {
  return options_.hvp_method == HvpMethod::kExact
             ? hvp_exact_on(v, nullptr, nullptr, observer, nullptr)
             : hvp_finite_difference(v, 0.0, observer);
}

std::vector<size_t> CurvatureEngine::parameter_subset(const std::vector<size_t>& indices,
                                                      const char* what) const {
  for (size_t i : indices) {
    if (i >= state_->params.size()) {
      throw InvalidArgument(
          fmt::format("hvp: {} index {} for {} parameters", what, i, state_->params.size()));
    }
  }
  // Ascending and unique: the gradients enter the second backward in parameter order, as in hvp().
  std::vector<size_t> sorted = indices;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  return sorted;
}

ParamVector CurvatureEngine::hvp(const ParamVector& v, const std::vector<size_t>& support,
                                 const BatchObserver& observer) {
  return hvp(v, support, every_index(state_->params.size()), observer);
}

ParamVector CurvatureEngine::hvp(const ParamVector& v, const std::vector<size_t>& support,
                                 const std::vector<size_t>& targets,
                                 const BatchObserver& observer) {
  if (v.size() != state_->params.size()) {
    throw InvalidArgument(fmt::format("hvp: vector of {} tensors for {} parameters", v.size(),
                                      state_->params.size()));
  }
  const std::vector<size_t> from = parameter_subset(support, "support");
  const std::vector<size_t> onto = parameter_subset(targets, "target");
  if (options_.hvp_method == HvpMethod::kExact) {
    return hvp_exact_on(v, &from, &onto, observer, nullptr);
  }
  // Finite differences difference whole gradients: the product everywhere, then zero off targets.
  ParamVector padded = zeros_like(state_->params);
  for (size_t i : from) padded[i] = v[i];
  BatchObserver masked_observer;
  if (observer) {
    masked_observer = [&](const BatchTerms& bt) {
      const ParamVector hv = masked(*bt.hvp, onto);
      observer(BatchTerms{bt.batch, bt.weight, bt.gradient, &hv});
    };
  }
  return masked(hvp_finite_difference(padded, 0.0, masked_observer), onto);
}

void CurvatureEngine::hvp_into(const ParamVector& v, ParamVector& out, bool add) {
  const std::vector<size_t> all = every_index(state_->params.size());
  hvp_into(v, all, all, out, add);
}

void CurvatureEngine::hvp_into(const ParamVector& v, const std::vector<size_t>& support,
                               const std::vector<size_t>& targets, ParamVector& out, bool add) {
  const auto& params = state_->params;
  if (v.size() != params.size() || out.size() != params.size()) {
    throw InvalidArgument(
        fmt::format("hvp_into: vector of {} tensors and destination of {} for {} parameters",
                    v.size(), out.size(), params.size()));
  }
  const std::vector<size_t> from = parameter_subset(support, "support");
  const std::vector<size_t> onto = parameter_subset(targets, "target");
  for (size_t i : onto) {
    const at::Tensor& t = out[i];
    if (!t.defined() || !t.is_floating_point() || t.sizes() != params[i].sizes() ||
        t.device() != device_) {
      throw InvalidArgument(fmt::format(
          "hvp_into: the destination of parameter '{}' must be a floating tensor of shape [{}] "
          "on {}",
          space()[i].name, fmt::join(params[i].sizes(), ", "), device_.str()));
    }
  }
  if (options_.hvp_method == HvpMethod::kExact) {
    hvp_exact_on(v, &from, &onto, {}, &out, add);
    return;
  }
  // Finite differences difference whole gradients; the whole operator's needs no padding.
  const bool whole = from.size() == params.size() && onto.size() == params.size();
  const ParamVector hv = whole ? hvp_finite_difference(v) : hvp(v, from, onto);
  c10::NoGradGuard no_grad;
  for (size_t i : onto) add ? out[i].add_(hv[i]) : out[i].copy_(hv[i]);
}

ParamVector CurvatureEngine::hvp_exact(const ParamVector& v) {
  return hvp_exact_on(v, nullptr, nullptr, {}, nullptr);
}

ParamVector CurvatureEngine::slice_hvp(size_t b, size_t k, const ParamVector& v,
                                       const std::vector<size_t>& support,
                                       const std::vector<size_t>* targets,
                                       const std::vector<at::Tensor>& inputs, ParamVector* gradient,
                                       const StageSink* sink) {
  auto& s = *state_;
  const engine_detail::Slice& slice = s.slices[b][k];
  if (options_.recompute_layers) {
    counters_.forwards += 2;
    ++counters_.backwards;
    ++counters_.second_backwards;
    return engine_detail::staged_slice_hvp(objective_, slice.batch, s.params, v, targets, gradient,
                                           sink);
  }
  const bool kept = !s.kept[b][k].empty();
  ParamVector fresh;
  if (!kept) {
    at::Tensor loss = objective_.loss(slice.batch);
    ++counters_.forwards;
    fresh = fill_undefined(torch::autograd::grad({loss}, s.params, {}, true, true, true), s.params);
    ++counters_.backwards;
  }
  const ParamVector& g = kept ? s.kept[b][k].grads : fresh;
  // Only gradient entries that depend on the parameters carry a graph; the others have a zero
  // Hessian row and contribute nothing.
  std::vector<at::Tensor> outputs, grad_outputs;
  for (size_t i : support) {
    if (g[i].requires_grad()) {
      outputs.push_back(g[i]);
      grad_outputs.push_back(v[i]);
    }
  }
  ParamVector hv(s.params.size());
  if (!outputs.empty() && !inputs.empty()) {
    ParamVector parts = torch::autograd::grad(outputs, inputs, grad_outputs,
                                              /*retain_graph=*/kept,
                                              /*create_graph=*/false, /*allow_unused=*/true);
    if (targets == nullptr) {
      hv = std::move(parts);
    } else {
      for (size_t j = 0; j < parts.size(); ++j) hv[(*targets)[j]] = std::move(parts[j]);
    }
    ++counters_.second_backwards;
  }
  if (gradient != nullptr) *gradient = kept ? detached(g) : std::move(fresh);
  return hv;
}

ParamVector CurvatureEngine::hvp_exact_on(const ParamVector& v_in,
                                          const std::vector<size_t>* support,
                                          const std::vector<size_t>* targets,
                                          const BatchObserver& observer, ParamVector* into,
                                          bool add) {
  auto& s = *state_;
  if (v_in.size() != s.params.size()) {
    throw InvalidArgument(
        fmt::format("hvp: vector of {} tensors for {} parameters", v_in.size(), s.params.size()));
  }
  // A layer-wise product needs no cached gradient: it forms the slice's own.
  const bool needs_first_order = !s.have_first_order || (options_.reuse_graph && !s.graphs_current);
  if (needs_first_order && !options_.recompute_layers) compute_first_order(options_.reuse_graph);
  Stopwatch timer(counters_.seconds);
  const std::vector<size_t> all = every_index(v_in.size());
  if (support == nullptr) support = &all;
  // v on the parameters' device and dtype, undefined outside the support; scaled for a float16
  // model (tangent_scale), the products divided by it per batch.
  ParamVector v(v_in.size());
  const double scale = tangent_scale(v_in, *support);
  for (size_t i : *support) v[i] = on_parameter(v_in, i, "hvp", scale);
  // The parameters the second backward differentiates toward.
  std::vector<at::Tensor> inputs;
  for (size_t i : targets == nullptr ? all : *targets) inputs.push_back(s.params[i]);
  // Each batch's weighted product is added to a destination; under layer-wise recomputation
  // with no observer (which sees a batch's product whole), each stage's share as it appears, so
  // the product is held nowhere else.
  const bool by_stage = into != nullptr && !observer && options_.recompute_layers;
  if (into != nullptr) prepare_into(*into, targets == nullptr ? all : *targets, add);
  ParamVector result(s.params.size());
  for_each_batch(Pass::kHvp, [&](size_t b, double w_b) {
    const auto& slices = s.slices[b];
    // Batch b's H v (and, for an observer, g_b): the share-weighted sum over its slices; a batch
    // of one slice is its slice's terms themselves.
    ParamVector hv_b(s.params.size()), g_b;
    for (size_t k = 0; k < slices.size(); ++k) {
      release_graphs_over_budget();
      StageSink sink;
      sink.product = [&, alpha = w_b * slices[k].share / scale](size_t i, const at::Tensor& part) {
        (*into)[i].add_(part, alpha);
      };
      ParamVector g;
      ParamVector hv = slice_hvp(b, k, v, *support, targets, inputs, observer ? &g : nullptr,
                                 by_stage ? &sink : nullptr);
      c10::NoGradGuard no_grad;
      if (slices.size() == 1) {
        hv_b = std::move(hv);
        if (observer) g_b = detached(g);
      } else {
        for (size_t i = 0; i < hv.size(); ++i) {
          if (hv[i].defined())
            accumulate(hv_b[i], std::move(hv[i]), slices[k].share, vector_dtype_);
        }
        if (observer) {
          g_b.resize(s.params.size());
          for (size_t i = 0; i < g.size(); ++i) {
            accumulate(g_b[i], g[i].detach(), slices[k].share, vector_dtype_);
          }
        }
      }
      g.clear();
      release_graphs_over_budget();
    }
    if (by_stage) return;
    c10::NoGradGuard no_grad;
    if (scale != 1.0) {
      for (auto& t : hv_b) {
        if (t.defined()) t = t.to(vector_dtype_).div_(scale);
      }
    }
    if (observer) observer(BatchTerms{b, w_b, &g_b, &hv_b});
    for (size_t i = 0; i < hv_b.size(); ++i) {
      if (!hv_b[i].defined()) continue;
      if (into != nullptr) {
        (*into)[i].add_(hv_b[i], w_b);
      } else {
        accumulate(result[i], std::move(hv_b[i]), w_b, vector_dtype_);
      }
    }
  });
  ++counters_.hvps;
  if (into != nullptr) {
    reduce_into(*into, targets == nullptr ? all : *targets);
    check(*into, "the Hessian-vector product");
    return {};
  }
  std::vector<double> none;
  reduce(result, none);
  fill_zeros(result, s.params, vector_dtype_);
  check(result, "the Hessian-vector product");
  return result;
}

void CurvatureEngine::prepare_into(ParamVector& out, const std::vector<size_t>& indices, bool add) {
  if (add && communicator_->rank() == 0) return;
  c10::NoGradGuard no_grad;
  for (size_t i : indices) out[i].zero_();
}

void CurvatureEngine::reduce_into(ParamVector& out, const std::vector<size_t>& indices) {
  if (!communicator_->distributed()) return;
  ParamVector sums(out.size());
  for (size_t i : indices) sums[i] = out[i];
  std::vector<double> none;
  reduce(sums, none);
  c10::NoGradGuard no_grad;
  for (size_t i : indices) out[i].copy_(sums[i]);
}

}  // namespace curv
