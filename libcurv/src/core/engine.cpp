#include "curv/core/engine.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "core/engine_internal.h"
#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/core/gauss_newton.h"
#include "curv/core/runtime.h"

namespace curv {

namespace engine_detail {

const char* const kTwiceDifferentiableHint =
    "is the loss twice differentiable? Some operations (fused or flash attention kernels, "
    "in-place ops on saved tensors) have no double backward; use plain softmax attention";

ParamVector fill_undefined(ParamVector grads, const ParamVector& params) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) grads[i] = at::zeros_like(params[i]);
  }
  return grads;
}

void accumulate(at::Tensor& acc, at::Tensor t, double w, at::ScalarType dtype) {
  if (t.scalar_type() != dtype) t = t.to(dtype);
  if (acc.defined()) {
    acc.add_(t, w);
  } else if (t.use_count() == 1 && t.storage().use_count() == 1) {
    acc = w == 1.0 ? std::move(t) : t.mul_(w);
  } else {
    acc = t * w;
  }
}

void fill_zeros(ParamVector& acc, const ParamVector& params, at::ScalarType dtype) {
  for (size_t i = 0; i < acc.size(); ++i) {
    if (!acc[i].defined()) {
      acc[i] =
          at::zeros_like(params[i], params[i].options().dtype(dtype), at::MemoryFormat::Contiguous);
    }
  }
}

double machine_epsilon(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return std::numeric_limits<double>::epsilon();
    case at::kFloat:
      return std::numeric_limits<float>::epsilon();
    case at::kBFloat16:
      return 0.0078125;  // 2^-7: 8 significant bits
    case at::kHalf:
      return 0.0009765625;  // 2^-10: 11 significant bits
    default:
      throw InvalidArgument(fmt::format("no machine epsilon for dtype {}", dtype_name(dtype)));
  }
}

std::vector<Slice> slices_of(const Batch& batch, int64_t size) {
  const int64_t n = batch.size();
  if (size <= 0 || size >= n) return {Slice{batch, 1.0}};
  const bool per_example_targets =
      batch.targets.defined() && batch.targets.dim() >= 1 && batch.targets.size(0) == n;
  const bool counted = per_example_targets && !batch.targets.is_floating_point();
  auto weight_of = [&](const at::Tensor& targets, int64_t examples) {
    return counted ? (targets != kIgnoreIndex).sum().item<double>() : static_cast<double>(examples);
  };
  const double total = weight_of(batch.targets, n);
  std::vector<Slice> slices;
  for (int64_t start = 0; start < n; start += size) {
    const int64_t len = std::min(size, n - start);
    Batch part{batch.inputs.narrow(0, start, len),
               per_example_targets ? batch.targets.narrow(0, start, len) : batch.targets};
    const double share = total > 0 ? weight_of(part.targets, len) / total
                                   : static_cast<double>(len) / static_cast<double>(n);
    if (share > 0) slices.push_back(Slice{std::move(part), share});
  }
  return slices;
}

}  // namespace engine_detail

using namespace engine_detail;

CurvatureEngine::CurvatureEngine(Objective& objective, ProbeSet probe, EngineOptions options)
    : objective_(objective),
      probe_(std::move(probe)),
      options_(options),
      state_(std::make_unique<State>()) {
  options_.validate();
  if (probe_.empty()) throw InvalidArgument("CurvatureEngine: the probe set has no batches");
  if (options_.recompute_layers) {
    if (objective_.loss_stages() < 2) {
      throw InvalidOption(
          fmt::format("{{0}}: {} is not computed in layer stages (the built-in transformers are)",
                      objective_.describe()),
          {{"EngineOptions.recompute_layers", ""}});
    }
    options_.reuse_graph = false;  // a kept graph would be the whole model's
  }
  state_->params = objective_.parameters();
  if (state_->params.empty()) {
    throw InvalidArgument(
        fmt::format("CurvatureEngine: {} has no parameters", objective_.describe()));
  }
  device_ = state_->params.front().device();
  const at::ScalarType params_dtype = state_->params.front().scalar_type();
  vector_dtype_ = options_.vector_dtype == at::ScalarType::Undefined
                      ? default_vector_dtype(params_dtype)
                      : options_.vector_dtype;
  if (!at::isFloatingType(vector_dtype_)) {
    throw InvalidOption(fmt::format("{{0}} {} is not a floating dtype", dtype_name(vector_dtype_)),
                        {{"EngineOptions.vector_dtype", ""}});
  }
  probe_ = probe_.to(params_dtype, device_);
  if (options_.max_memory > 0 && !options_.memory_probe && device_memory(device_).in_use < 0) {
    throw InvalidOption(fmt::format("{{0}}: the memory of {} is not known to this LibTorch (device "
                                    "statistics need LibTorch 2.9 or later)",
                                    device_.str()),
                        {{"EngineOptions.max_memory", ""}});
  }
  state_->kept.resize(probe_.size());
  for (size_t b = 0; b < probe_.size(); ++b) {
    state_->slices.push_back(slices_of(probe_[b], options_.micro_batch));
    state_->kept[b].resize(state_->slices[b].size());
  }
  communicator_ = options_.communicator ? options_.communicator : single_process();
  std::vector<double> sizes(probe_.size());
  for (size_t b = 0; b < probe_.size(); ++b) sizes[b] = probe_.weight(b);
  const std::vector<size_t> first = balanced_split(sizes, communicator_->world_size());
  first_batch_ = first[static_cast<size_t>(communicator_->rank())];
  last_batch_ = first[static_cast<size_t>(communicator_->rank()) + 1];
}

CurvatureEngine::~CurvatureEngine() = default;

const ParamSpace& CurvatureEngine::space() const { return objective_.space(); }

at::ScalarType CurvatureEngine::parameter_dtype() const {
  return state_->params.front().scalar_type();
}

ParamVector CurvatureEngine::parameters() const { return clone(state_->params); }

void CurvatureEngine::set_parameters(const ParamVector& theta) {
  load_parameters(objective_, theta);
  parameters_changed();
}

void CurvatureEngine::parameters_changed() { release_first_order(); }

void CurvatureEngine::release_first_order() {
  state_->have_first_order = false;
  state_->grad.clear();
  release_graphs();
}

void CurvatureEngine::release_graphs() {
  for (auto& batch : state_->kept) {
    for (auto& k : batch) k.clear();
  }
  state_->graphs_current = false;
}

int64_t CurvatureEngine::memory_in_use() const {
  return options_.memory_probe ? options_.memory_probe() : device_memory(device_).in_use;
}

bool CurvatureEngine::over_memory_budget() const {
  return options_.max_memory > 0 && memory_in_use() > options_.max_memory;
}

void CurvatureEngine::release_graphs_over_budget() {
  if (!over_memory_budget()) return;
  // Past the budget no graph stays: each is released (its slices are recomputed by later
  // HVPs) and the allocator's free pages go back to the system.
  for (auto& batch : state_->kept) {
    for (auto& k : batch) {
      if (!k.empty()) {
        k.clear();
        ++counters_.graphs_over_budget;
      }
    }
  }
  release_free_memory(device_);
}

size_t CurvatureEngine::kept_graphs() const {
  size_t n = 0;
  for (const auto& batch : state_->kept) {
    for (const auto& k : batch) n += k.empty() ? 0 : 1;
  }
  return n;
}

void CurvatureEngine::check(const ParamVector& x, const char* what) const {
  if (!options_.check_finite || all_finite(x)) return;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].defined() && x[i].is_floating_point() && !at::isfinite(x[i]).all().item<bool>()) {
      const bool half = parameter_dtype() == at::kHalf || vector_dtype_ == at::kHalf;
      throw NumericalError(fmt::format(
          "{} holds NaN or Inf in parameter '{}' of {} (hint: check the checkpoint for NaN "
          "weights, lower the probe dtype's risk by using float64{}, or check that the loss is "
          "finite on every probe batch)",
          what, space()[i].name, objective_.describe(),
          half ? " (float16 overflows past 65504: bfloat16 has float32's range)" : ""));
    }
  }
}

void CurvatureEngine::sum_over_ranks(double* data, size_t n) {
  communicator_->all_reduce_sum(data, n);
}

void CurvatureEngine::reduce(ParamVector& x, std::vector<double>& scalars) {
  if (!communicator_->distributed()) return;
  const auto& params = state_->params;
  const auto k = static_cast<int64_t>(scalars.size());
  int64_t total = k;
  for (const auto& p : params) total += p.numel();
  // In float64 on the parameters' device: on a GPU with NCCL the sum never leaves it.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor buffer = at::empty({total}, f64.device(device_));
  if (k > 0) {
    buffer.narrow(0, 0, k).copy_(at::from_blob(scalars.data(), {k}, f64));
  }
  int64_t offset = k;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    at::Tensor slot = buffer.narrow(0, offset, n);
    if (x[i].defined()) {
      slot.copy_(x[i].detach().reshape({-1}));
    } else {
      slot.zero_();
    }
    offset += n;
  }
  communicator_->all_reduce_sum_on_device(buffer);
  if (k > 0) {
    const at::Tensor sums = buffer.narrow(0, 0, k).cpu();
    std::copy(sums.data_ptr<double>(), sums.data_ptr<double>() + k, scalars.begin());
  }
  offset = k;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    // In float64 a view into the buffer; otherwise a converted copy. Never written in place: a
    // kept graph's gradient may share x[i]'s storage.
    x[i] =
        buffer.narrow(0, offset, n).view(params[i].sizes()).to(params[i].device(), vector_dtype_);
    offset += n;
  }
}

void CurvatureEngine::compute_first_order(bool keep_graphs) {
  Stopwatch timer(counters_.seconds);
  auto& s = *state_;
  double loss = 0.0;
  std::vector<double> batch_losses(probe_.size());
  ParamVector grad(s.params.size());
  bool over_budget = false;
  int64_t graphs = 0;
  for_each_batch(Pass::kFirstOrder, [&](size_t b, double w_b) {
    double value_b = 0.0;
    for (size_t k = 0; k < s.slices[b].size(); ++k) {
      const Slice& slice = s.slices[b][k];
      const double w = w_b * slice.share;
      bool keep = keep_graphs && !over_budget &&
                  (options_.max_kept_graphs == 0 || graphs < options_.max_kept_graphs);
      // A kept graph also lists the model's linear maps, which coupling() reads.
      std::vector<LinearUse> linears;
      StagedPass staged;
      if (options_.recompute_layers) {
        staged = staged_pass(objective_, slice.batch, s.params, nullptr, /*want_gradient=*/true);
      }
      at::Tensor loss_s = options_.recompute_layers ? staged.loss
                          : keep ? objective_.loss_listing_linears(slice.batch, linears)
                                 : objective_.loss(slice.batch);
      // A layer-wise pass runs each layer forward twice: its sweep and its recomputation.
      counters_.forwards += options_.recompute_layers ? 2 : 1;
      const double value = loss_s.item<double>();
      if (options_.check_finite && !std::isfinite(value)) {
        throw NumericalError(
            fmt::format("loss of {} is {} on probe batch {} (hint: check the "
                        "checkpoint and the batch for NaN, or token ids out of range)",
                        objective_.describe(), value, b));
      }
      GradientGraph graph;
      if (options_.recompute_layers) {
        graph.grads = fill_undefined(std::move(staged.grads), s.params);
      } else {
        graph = first_backward(loss_s, s.params, std::move(linears), keep);
      }
      ParamVector g = keep ? graph.grads : std::move(graph.grads);
      ++counters_.backwards;
      if (keep && over_memory_budget()) {
        // Dropping the only references to the create_graph gradients frees their graph.
        for (auto& t : g) t = t.detach();
        graph.clear();
        keep = false;
        over_budget = true;
        ++counters_.graphs_over_budget;
      }
      if (keep) ++graphs;
      value_b += slice.share * value;
      {
        c10::NoGradGuard no_grad;
        // A kept gradient stays as it is (its graph is reused); the sum shares it only when it
        // is the whole sum (one batch of one slice, w = 1).
        for (size_t i = 0; i < g.size(); ++i) {
          if (!keep) {
            accumulate(grad[i], std::move(g[i]), w, vector_dtype_);
          } else if (grad[i].defined()) {
            grad[i].add_(g[i].detach(), w);
          } else if (g[i].scalar_type() != vector_dtype_) {
            grad[i] = g[i].detach().to(vector_dtype_).mul_(w);
          } else {
            grad[i] = w == 1.0 ? g[i].detach() : g[i].detach() * w;
          }
        }
      }
      g.clear();
      if (keep) s.kept[b][k] = std::move(graph);
      if (over_budget) release_free_memory(device_);
    }
    loss += w_b * value_b;
    batch_losses[b] = value_b;
  });
  std::vector<double> scalars{loss};
  scalars.insert(scalars.end(), batch_losses.begin(), batch_losses.end());
  reduce(grad, scalars);
  loss = scalars[0];
  std::copy(scalars.begin() + 1, scalars.end(), batch_losses.begin());
  fill_zeros(grad, s.params, vector_dtype_);
  check(grad, "the gradient");
  s.loss = loss;
  s.batch_losses = std::move(batch_losses);
  s.grad = std::move(grad);
  s.have_first_order = true;
  s.graphs_current = keep_graphs;
  ++counters_.gradients;
}

bool CurvatureEngine::keep_graphs_by_default() const {
  // Finite differences never use the create_graph gradients: keeping them only costs memory.
  return options_.reuse_graph && options_.hvp_method == HvpMethod::kExact;
}

double CurvatureEngine::loss() {
  if (!state_->have_first_order) compute_first_order(keep_graphs_by_default());
  return state_->loss;
}

const ParamVector& CurvatureEngine::gradient() {
  if (!state_->have_first_order) compute_first_order(keep_graphs_by_default());
  return state_->grad;
}

const std::vector<double>& CurvatureEngine::batch_losses() {
  if (!state_->have_first_order) compute_first_order(keep_graphs_by_default());
  return state_->batch_losses;
}

}  // namespace curv
