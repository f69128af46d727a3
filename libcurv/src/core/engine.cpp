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

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/core/gauss_newton.h"
#include "curv/core/runtime.h"

namespace curv {

HvpMethod parse_hvp_method(const std::string& text) {
  if (text == "exact") return HvpMethod::kExact;
  if (text == "fd") return HvpMethod::kFiniteDifference;
  throw InvalidArgument(fmt::format("hvp method '{}': expected exact or fd", text));
}

void EngineOptions::validate() const {
  if (max_kept_graphs < 0) {
    throw InvalidOption("{0} must be >= 0",
                        {{"EngineOptions.max_kept_graphs", fmt::format("{}", max_kept_graphs)}});
  }
  if (micro_batch < 0) {
    throw InvalidOption("{0} must be >= 0 (0 = whole batches)",
                        {{"EngineOptions.micro_batch", fmt::format("{}", micro_batch)}});
  }
  if (max_memory < 0) {
    throw InvalidOption("{0} must be >= 0 (0 = no bound)",
                        {{"EngineOptions.max_memory", fmt::format("{}", max_memory)}});
  }
  if (!(fd_step >= 0.0) || !std::isfinite(fd_step)) {
    throw InvalidOption("{0} must be finite and >= 0",
                        {{"EngineOptions.fd_step", fmt::format("{}", fd_step)}});
  }
}

std::string EngineCounters::brief() const {
  return fmt::format(
      "{} forwards, {} backwards, {} second backwards, {} gradients, {} HVPs, {:.3f} s{}", forwards,
      backwards, second_backwards, gradients, hvps, seconds,
      graphs_over_budget > 0
          ? fmt::format(", {} graphs not kept (memory budget)", graphs_over_budget)
          : std::string());
}

namespace {

class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

const char* kTwiceDifferentiableHint =
    "is the loss twice differentiable? Some operations (fused or flash attention kernels, "
    "in-place ops on saved tensors) have no double backward; use plain softmax attention";

// Undefined gradients (parameters the loss does not depend on) become zeros.
ParamVector fill_undefined(ParamVector grads, const ParamVector& params) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) grads[i] = at::zeros_like(params[i]);
  }
  return grads;
}

// Adds w·t to the accumulator `acc`, where t is a fresh result that the caller may give away.
// The first term becomes the accumulator itself (scaled in place when nothing else holds t), so a
// sum over batches holds one parameter-sized buffer beside the current term, and a single batch
// none; 0 + w·t rounds as w·t, so the sum is the same to the bit.
void accumulate(at::Tensor& acc, at::Tensor t, double w) {
  if (acc.defined()) {
    acc.add_(t, w);
  } else if (t.use_count() == 1 && t.storage().use_count() == 1) {
    acc = w == 1.0 ? std::move(t) : t.mul_(w);
  } else {
    acc = t * w;
  }
}

// Parameters no batch's term reached get zeros.
void fill_zeros(ParamVector& acc, const ParamVector& params) {
  for (size_t i = 0; i < acc.size(); ++i) {
    if (!acc[i].defined()) acc[i] = at::zeros_like(params[i], at::MemoryFormat::Contiguous);
  }
}

double machine_epsilon(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return std::numeric_limits<double>::epsilon();
    case at::kFloat:
      return std::numeric_limits<float>::epsilon();
    default:
      return 1e-3;  // half precision types
  }
}

// A run of consecutive examples of a probe batch and its share of the batch's loss.
struct Slice {
  Batch batch;
  double share = 1.0;
};

// `batch` in slices of at most `size` examples (one slice, the batch itself, when size is 0 or
// covers it). Integer targets: a slice's share is its count of targets other than kIgnoreIndex
// over the batch's (what a mean cross-entropy averages over); otherwise its examples over the
// batch's. Slices of share 0 (every target ignored) are left out.
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

}  // namespace

struct CurvatureEngine::State {
  ParamVector params;  // the objective's live leaf tensors
  bool have_first_order = false;
  double loss = 0.0;
  std::vector<double> batch_losses;
  ParamVector grad;
  std::vector<std::vector<Slice>> slices;  // per batch (EngineOptions::micro_batch)
  // Per batch and slice: the create_graph gradient, or empty.
  std::vector<std::vector<ParamVector>> kept;
  // The kept graphs belong to the current parameters (even when the budget kept none).
  bool graphs_current = false;
};

CurvatureEngine::CurvatureEngine(Objective& objective, ProbeSet probe, EngineOptions options)
    : objective_(objective),
      probe_(std::move(probe)),
      options_(options),
      state_(std::make_unique<State>()) {
  options_.validate();
  if (probe_.empty()) throw InvalidArgument("CurvatureEngine: the probe set has no batches");
  state_->params = objective_.parameters();
  if (state_->params.empty()) {
    throw InvalidArgument(
        fmt::format("CurvatureEngine: {} has no parameters", objective_.describe()));
  }
  device_ = state_->params.front().device();
  probe_ = probe_.to(state_->params.front().scalar_type(), device_);
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

ParamVector CurvatureEngine::parameters() const { return clone(state_->params); }

void CurvatureEngine::set_parameters(const ParamVector& theta) {
  load_parameters(objective_, theta);
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
    if (x[i].is_floating_point() && !at::isfinite(x[i]).all().item<bool>()) {
      throw NumericalError(fmt::format(
          "{} holds NaN or Inf in parameter '{}' of {} (hint: check the checkpoint for NaN "
          "weights, lower the probe dtype's risk by using float64, or check that the loss is "
          "finite on every probe batch)",
          what, space()[i].name, objective_.describe()));
    }
  }
}

const char* CurvatureEngine::pass_name(Pass pass) {
  switch (pass) {
    case Pass::kFirstOrder:
      return "loss and gradient";
    case Pass::kHvp:
      return "Hessian-vector product";
    case Pass::kGradientAtOffset:
      return "gradient at a displaced θ";
    case Pass::kLossAt:
      return "loss at θ + u";
    case Pass::kGaussNewton:
      return "Gauss-Newton product";
  }
  return "probe pass";
}

OutOfMemory CurvatureEngine::out_of_memory(Pass pass, size_t batch, const std::exception& e) {
  // What the allocator held when it failed, before anything is released.
  const DeviceMemory m = device_memory(device_);
  release_graphs();
  release_free_memory(device_);
  std::string held = fmt::format("{} in use", format_bytes(m.in_use));
  if (m.reserved >= 0) held += fmt::format(", {} reserved", format_bytes(m.reserved));
  if (m.peak >= 0) held += fmt::format(", peak {}", format_bytes(m.peak));
  return OutOfMemory(fmt::format(
      "{} ran out of {} memory in the {} of probe batch {} ({}{}): lower what a pass holds with "
      "--micro-batch (smaller slices of each batch), --max-memory or --max-kept-graphs (fewer "
      "kept graphs), --coupling none (one HVP per direction) or a smaller --batch-size. {}",
      objective_.describe(), device_.str(), pass_name(pass), batch, held,
      options_.max_memory > 0 ? fmt::format("; --max-memory {}", format_bytes(options_.max_memory))
                              : std::string(),
      brief_what(e)));
}

void CurvatureEngine::for_each_batch(Pass pass, const std::function<void(size_t, double)>& body) {
  std::exception_ptr failure;
  for (size_t b = first_batch_; b < last_batch_ && !failure; ++b) {
    try {
      body(b, probe_.weight(b));
    } catch (const Error&) {
      failure = std::current_exception();
    } catch (const c10::OutOfMemoryError& e) {
      failure = std::make_exception_ptr(out_of_memory(pass, b, e));
    } catch (const std::exception& e) {
      // LibTorch 1.13's CPU allocator reports exhaustion as a plain c10::Error.
      if (std::string(e.what()).find("not enough memory") != std::string::npos) {
        failure = std::make_exception_ptr(out_of_memory(pass, b, e));
        continue;
      }
      // Only the HVP needs a second derivative: the hint would mislead for the other passes.
      failure = std::make_exception_ptr(ModelError(fmt::format(
          "{}: {} failed on probe batch {}{}: {}", objective_.describe(), pass_name(pass), b,
          pass == Pass::kHvp || pass == Pass::kGaussNewton
              ? fmt::format(" ({})", kTwiceDifferentiableHint)
              : std::string(),
          brief_what(e))));
    }
  }
  // With several ranks, a failure on one stops all of them with the same error.
  raise_if_any_rank_failed(*communicator_, failure);
}

void CurvatureEngine::sum_over_ranks(double* data, size_t n) {
  communicator_->all_reduce_sum(data, n);
}

void CurvatureEngine::reduce(ParamVector& x, std::vector<double>& scalars) {
  if (!communicator_->distributed()) return;
  const auto& params = state_->params;
  int64_t total = static_cast<int64_t>(scalars.size());
  for (const auto& p : params) total += p.numel();
  at::Tensor buffer = at::empty({total}, at::TensorOptions().dtype(at::kDouble));
  std::copy(scalars.begin(), scalars.end(), buffer.data_ptr<double>());
  int64_t offset = static_cast<int64_t>(scalars.size());
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
  communicator_->all_reduce_sum(buffer.data_ptr<double>(), static_cast<size_t>(total));
  std::copy(buffer.data_ptr<double>(), buffer.data_ptr<double>() + scalars.size(), scalars.begin());
  offset = static_cast<int64_t>(scalars.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    // In float64 on the CPU a view into the buffer; otherwise a converted copy. Never written
    // in place: a kept graph's gradient may share x[i]'s storage.
    x[i] = buffer.narrow(0, offset, n)
               .view(params[i].sizes())
               .to(params[i].device(), params[i].scalar_type());
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
      at::Tensor loss_s = objective_.loss(slice.batch);
      ++counters_.forwards;
      const double value = loss_s.item<double>();
      if (options_.check_finite && !std::isfinite(value)) {
        throw NumericalError(
            fmt::format("loss of {} is {} on probe batch {} (hint: check the "
                        "checkpoint and the batch for NaN, or token ids out of range)",
                        objective_.describe(), value, b));
      }
      ParamVector g =
          fill_undefined(torch::autograd::grad({loss_s}, s.params, {}, /*retain_graph=*/keep,
                                               /*create_graph=*/keep, /*allow_unused=*/true),
                         s.params);
      ++counters_.backwards;
      if (keep && over_memory_budget()) {
        // Dropping the only references to the create_graph gradients frees their graph.
        for (auto& t : g) t = t.detach();
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
            accumulate(grad[i], std::move(g[i]), w);
          } else if (grad[i].defined()) {
            grad[i].add_(g[i].detach(), w);
          } else {
            grad[i] = w == 1.0 ? g[i].detach() : g[i].detach() * w;
          }
        }
      }
      s.kept[b][k] = keep ? std::move(g) : ParamVector{};
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
  fill_zeros(grad, s.params);
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

ParamVector CurvatureEngine::hvp(const ParamVector& v, const BatchObserver& observer) {
  return options_.hvp_method == HvpMethod::kExact ? hvp_exact_on(v, nullptr, observer)
                                                  : hvp_finite_difference(v, 0.0, observer);
}

ParamVector CurvatureEngine::hvp(const ParamVector& v, const std::vector<size_t>& support,
                                 const BatchObserver& observer) {
  if (v.size() != state_->params.size()) {
    throw InvalidArgument(fmt::format("hvp: vector of {} tensors for {} parameters", v.size(),
                                      state_->params.size()));
  }
  for (size_t i : support) {
    if (i >= v.size()) {
      throw InvalidArgument(
          fmt::format("hvp: support index {} for {} parameters", i, state_->params.size()));
    }
  }
  // Ascending and unique: the gradients enter the second backward in parameter order, as in hvp().
  std::vector<size_t> sorted = support;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (options_.hvp_method == HvpMethod::kExact) return hvp_exact_on(v, &sorted, observer);
  ParamVector padded = zeros_like(state_->params);
  for (size_t i : sorted) padded[i] = v[i];
  return hvp_finite_difference(padded, 0.0, observer);
}

ParamVector CurvatureEngine::hvp_exact(const ParamVector& v) {
  return hvp_exact_on(v, nullptr, {});
}

ParamVector CurvatureEngine::hvp_exact_on(const ParamVector& v_in,
                                          const std::vector<size_t>* support,
                                          const BatchObserver& observer) {
  auto& s = *state_;
  if (v_in.size() != s.params.size()) {
    throw InvalidArgument(
        fmt::format("hvp: vector of {} tensors for {} parameters", v_in.size(), s.params.size()));
  }
  if (!s.have_first_order || (options_.reuse_graph && !s.graphs_current)) {
    compute_first_order(options_.reuse_graph);
  }
  Stopwatch timer(counters_.seconds);
  // v on the parameters' device and dtype; undefined outside the support.
  ParamVector v(v_in.size());
  std::vector<size_t> all;
  if (support == nullptr) {
    for (size_t i = 0; i < v_in.size(); ++i) all.push_back(i);
    support = &all;
  }
  for (size_t i : *support) {
    if (!v_in[i].defined() || !v_in[i].sizes().equals(s.params[i].sizes())) {
      throw InvalidArgument(fmt::format(
          "hvp: tensor for '{}' has shape {}, the parameter {}", space()[i].name,
          v_in[i].defined() ? fmt::format("{}", v_in[i].sizes()) : std::string("(undefined)"),
          s.params[i].sizes()));
    }
    v[i] = v_in[i].detach().to(s.params[i].device(), s.params[i].scalar_type());
  }
  ParamVector result(s.params.size());
  for_each_batch(Pass::kHvp, [&](size_t b, double w_b) {
    const auto& slices = s.slices[b];
    // Batch b's H_b v (and, for an observer, g_b): the share-weighted sum over its slices; a
    // batch of one slice is its slice's terms themselves.
    ParamVector hv_b(s.params.size()), g_b;
    if (observer && slices.size() > 1) g_b.resize(s.params.size());
    for (size_t k = 0; k < slices.size(); ++k) {
      release_graphs_over_budget();
      ParamVector fresh;
      const bool kept = !s.kept[b][k].empty();
      if (!kept) {
        at::Tensor loss_s = objective_.loss(slices[k].batch);
        ++counters_.forwards;
        fresh = fill_undefined(torch::autograd::grad({loss_s}, s.params, {}, true, true, true),
                               s.params);
        ++counters_.backwards;
      }
      const ParamVector& g = kept ? s.kept[b][k] : fresh;
      // Only gradient entries that depend on the parameters carry a graph; the others have a
      // zero Hessian row and contribute nothing.
      std::vector<at::Tensor> outputs, grad_outputs;
      for (size_t i : *support) {
        if (g[i].requires_grad()) {
          outputs.push_back(g[i]);
          grad_outputs.push_back(v[i]);
        }
      }
      ParamVector hv(s.params.size());
      if (!outputs.empty()) {
        hv = torch::autograd::grad(outputs, s.params, grad_outputs, /*retain_graph=*/kept,
                                   /*create_graph=*/false, /*allow_unused=*/true);
        ++counters_.second_backwards;
      }
      c10::NoGradGuard no_grad;
      if (slices.size() == 1) {
        hv_b = std::move(hv);
        if (observer) g_b = detached(g);
        fresh.clear();
        release_graphs_over_budget();
        break;
      }
      const double share = slices[k].share;
      for (size_t i = 0; i < hv.size(); ++i) {
        if (hv[i].defined()) accumulate(hv_b[i], std::move(hv[i]), share);
      }
      if (observer) {
        for (size_t i = 0; i < g.size(); ++i) accumulate(g_b[i], g[i].detach(), share);
      }
      fresh.clear();
      release_graphs_over_budget();
    }
    c10::NoGradGuard no_grad;
    if (observer) observer(BatchTerms{b, w_b, &g_b, &hv_b});
    for (size_t i = 0; i < hv_b.size(); ++i) {
      if (hv_b[i].defined()) accumulate(result[i], std::move(hv_b[i]), w_b);
    }
  });
  std::vector<double> none;
  reduce(result, none);
  fill_zeros(result, s.params);
  ++counters_.hvps;
  check(result, "the Hessian-vector product");
  return result;
}

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
  Stopwatch timer(counters_.seconds);
  auto& s = *state_;
  ParamVector saved = clone(s.params);
  double loss = 0.0;
  if (batch_losses) batch_losses->assign(probe_.size(), 0.0);
  {
    c10::NoGradGuard no_grad;
    // variable_data(): same storage, separate version counter, so the kept graphs survive the
    // excursion; the exact restore below makes them valid again.
    for (size_t i = 0; i < s.params.size(); ++i) {
      s.params[i].variable_data().add_(u.at(i).to(s.params[i].scalar_type()));
    }
    try {
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
      for (size_t i = 0; i < s.params.size(); ++i) s.params[i].variable_data().copy_(saved[i]);
      throw;
    }
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i].variable_data().copy_(saved[i]);
  }
  if (options_.check_finite && std::isnan(loss)) {
    throw NumericalError(
        fmt::format("loss of {} at θ + u is NaN (‖u‖ = {:.4g}); hint: the step "
                    "leaves the region where the model is finite",
                    objective_.describe(), norm(u)));
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

ParamVector CurvatureEngine::batch_gradient_at(size_t b, const ParamVector& saved,
                                               const ParamVector* offset) {
  auto& s = *state_;
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < s.params.size(); ++i) {
      auto data = s.params[i].variable_data();
      data.copy_(saved[i]);
      if (offset) data.add_((*offset)[i].to(s.params[i].scalar_type()));
    }
  }
  ParamVector g(s.params.size());
  for (const Slice& slice : s.slices[b]) {
    at::Tensor loss_s = objective_.loss(slice.batch);
    ++counters_.forwards;
    auto g_s =
        fill_undefined(torch::autograd::grad({loss_s}, s.params, {}, false, false, true), s.params);
    ++counters_.backwards;
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < g.size(); ++i) accumulate(g[i], std::move(g_s[i]), slice.share);
  }
  return g;
}

ParamVector CurvatureEngine::hvp_finite_difference(const ParamVector& v, double step,
                                                   const BatchObserver& observer) {
  Stopwatch timer(counters_.seconds);
  auto& s = *state_;
  const double v_norm = norm(v);
  if (v_norm == 0.0 && !observer) return zeros_like(s.params);
  if (step <= 0.0) step = options_.fd_step;
  if (step <= 0.0) {
    const double eps = machine_epsilon(s.params.front().scalar_type());
    // Scale by the parameters' RMS, not their norm: the norm grows with the parameter count while
    // the curvature scale per coordinate does not, and an oversized step turns truncation error
    // into the dominant term (measured: 1e-2 relative error on a tiny float32 GPT).
    const double rms = norm(s.params) / std::sqrt(static_cast<double>(space().numel()));
    step = std::cbrt(eps) * std::max(1.0, rms);
  }
  const double h = v_norm > 0.0 ? step / v_norm : 0.0;
  const ParamVector plus = scaled(v, h), minus = scaled(v, -h);
  // Per batch, so that each batch's H_b v exists for an observer; θ is written back exactly from
  // `saved` before every evaluation and after the last.
  const ParamVector saved = clone(s.params);
  auto restore = [&] {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i].variable_data().copy_(saved[i]);
  };
  ParamVector result(s.params.size());
  try {
    for_each_batch(Pass::kGradientAtOffset, [&](size_t b, double w) {
      ParamVector hv;
      if (v_norm > 0.0) {
        hv = batch_gradient_at(b, saved, &plus);
        ParamVector g_minus = batch_gradient_at(b, saved, &minus);
        c10::NoGradGuard no_grad;
        for (size_t i = 0; i < hv.size(); ++i) hv[i].sub_(g_minus[i]).div_(2.0 * h);
      } else {
        hv = zeros_like(s.params);
      }
      if (observer) {
        ParamVector g_b = batch_gradient_at(b, saved, nullptr);
        observer(BatchTerms{b, w, &g_b, &hv});
      }
      for (size_t i = 0; i < hv.size(); ++i) accumulate(result[i], std::move(hv[i]), w);
    });
    std::vector<double> none;
    reduce(result, none);
  } catch (...) {
    restore();
    throw;
  }
  restore();
  fill_zeros(result, s.params);
  ++counters_.hvps;
  check(result, "the finite-difference Hessian-vector product");
  return result;
}

}  // namespace curv
