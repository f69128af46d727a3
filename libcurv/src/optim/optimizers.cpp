#include "curv/optim/optimizers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/fmt_torch.h"
#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/core/structure.h"
#include "optim/rules.h"

namespace curv {

// ---------------------------------------------------------------------------------------------
// Shared machinery

double muon_scale(int64_t rows, int64_t cols, bool rms_scale) {
  if (rms_scale) return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
  return std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
}

at::Tensor newton_schulz(const at::Tensor& g, int64_t steps) {
  return newton_schulz(g, steps, 3.4445, -4.7750, 2.0315);
}

at::Tensor newton_schulz(const at::Tensor& g, int64_t steps, double a, double b, double c) {
  at::Tensor x = g.reshape({g.size(0), -1});
  x = x / (x.norm() + 1e-7);
  const bool transposed = x.size(0) > x.size(1);
  if (transposed) x = x.t();
  for (int64_t k = 0; k < steps; ++k) {
    at::Tensor A = at::mm(x, x.t());
    at::Tensor B = b * A + c * at::mm(A, A);
    x = a * x + at::mm(B, x);
  }
  if (transposed) x = x.t();
  return x.reshape(g.sizes()).contiguous();
}

at::Tensor polar_factor(const at::Tensor& g) {
  const at::Tensor m = g.reshape({g.size(0), -1});
  auto svd = at::linalg_svd(m, /*full_matrices=*/false);
  const at::Tensor& sigma = std::get<1>(svd);
  // Singular directions of a (numerically) zero singular value are arbitrary; like Newton–Schulz,
  // whose odd polynomial maps 0 to 0, the polar factor keeps them at zero: U diag(σ > tol) Vᵀ
  // with numpy's matrix_rank tolerance.
  const double tol =
      sigma.numel() == 0
          ? 0.0
          : sigma.max().item<double>() * static_cast<double>(std::max(m.size(0), m.size(1))) *
                (m.scalar_type() == at::kDouble ? 2.220446049250313e-16 : 1.1920929e-07);
  const at::Tensor keep = (sigma > tol).to(m.scalar_type());
  return at::mm(std::get<0>(svd) * keep.unsqueeze(0), std::get<2>(svd))
      .reshape(g.sizes())
      .contiguous();
}

Optimizer::Optimizer(OptimizerConfig config, const ParamSpace& space)
    : config_(std::move(config)), space_(space), state_(space.size()) {
  config_.validate();
}

std::vector<int64_t> Optimizer::slot_shape(size_t i, const std::string&) const {
  return space_[i].shape;
}

at::Tensor& Optimizer::slot(size_t i, const std::string& key, const at::Tensor& like) {
  auto& state = state_[i];
  // Every missing slot of the parameter is created at once, before any reference is returned:
  // the update rules hold references to two slots in one call (adamw_update(...,
  // slot(i, "exp_avg", g), slot(i, "exp_avg_sq", g), ...)), and adding the second later would
  // move the vector under the first (with clang's left-to-right argument order, m was a
  // moved-from, undefined tensor).
  auto options = [&](const std::string& k) {
    const auto own = slot_dtype(i, k);
    return own ? like.options().dtype(*own) : like.options();
  };
  for (const auto& k : slots(i)) {
    if (!has_slot(i, k)) state.emplace_back(k, at::zeros(slot_shape(i, k), options(k)));
  }
  if (!has_slot(i, key)) state.emplace_back(key, at::zeros(slot_shape(i, key), options(key)));
  for (auto& [k, t] : state) {
    if (k != key) continue;
    // Saved state may come in another dtype or device than the model probing it; a slot with a
    // dtype of its own keeps the one it was saved in.
    const bool own_dtype = slot_dtype(i, key).has_value();
    if ((!own_dtype && t.scalar_type() != like.scalar_type()) || t.device() != like.device()) {
      t = t.to(own_dtype ? like.options().dtype(t.scalar_type()) : like.options());
    }
    return t;
  }
  throw std::logic_error("Optimizer::slot: slot '" + key + "' was just created");
}

bool Optimizer::has_slot(size_t i, const std::string& key) const {
  return std::any_of(state_[i].begin(), state_[i].end(),
                     [&key](const auto& kv) { return kv.first == key; });
}

void Optimizer::check_step_arguments(const ParamVector& theta, const ParamVector& grad) const {
  if (theta.size() != space_.size() || grad.size() != space_.size()) {
    throw InvalidArgument(
        fmt::format("optimizer {}: {} parameters and {} gradients for a model "
                    "of {}",
                    config_.name, theta.size(), grad.size(), space_.size()));
  }
}

ParamVector Optimizer::step(const ParamVector& theta, const ParamVector& grad) {
  check_step_arguments(theta, grad);
  c10::NoGradGuard no_grad;
  ++step_count_;
  ParamVector u;
  u.reserve(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) {
    u.push_back(update(i, theta[i].detach(), grad[i].detach(), step_count_));
  }
  return u;
}

ParamVector Optimizer::peek(const ParamVector& theta, const ParamVector& grad) const {
  auto copy = clone();
  return copy->step(theta, grad);
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  for (size_t i = 0; i < state_.size(); ++i) {
    for (const auto& [key, t] : state_[i]) out.emplace_back(space_[i].name + "." + key, t);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Optimizer::saved_slots(
    size_t i, const TensorSource& saved, int64_t step_count, const std::string& source,
    const std::optional<at::TensorOptions>& options) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& key : slots(i)) {
    const std::string name = space_[i].name + "." + key;
    const TensorEntry* entry = saved.find(name);
    // Before the first update the state is empty: slots start at zero when first used.
    if (entry == nullptr && step_count == 0) continue;
    if (entry == nullptr) {
      throw InvalidArgument(fmt::format(
          "{}: optimizer state '{}' is missing: {} ({}) needs '{}' for parameter '{}' (was the "
          "checkpoint saved by another optimizer?)",
          source, name, config_.name, rule(i), key, space_[i].name));
    }
    const auto want = slot_shape(i, key);
    if (entry->shape != want) {
      throw InvalidArgument(fmt::format(
          "{}: optimizer state '{}' has shape {}, expected {} for "
          "parameter '{}'",
          source, name, shape_string(entry->shape), shape_string(want), space_[i].name));
    }
    at::TensorOptions read_as = options.value_or(at::TensorOptions(entry->dtype));
    if (slot_dtype(i, key)) read_as = read_as.dtype(entry->dtype);
    at::Tensor t = at::empty(entry->shape, read_as);
    saved.read_into(name, {}, t);
    out.emplace_back(key, std::move(t));
  }
  return out;
}

void Optimizer::load_state(const NamedTensors& tensors, int64_t step_count,
                           const std::string& source) {
  const auto saved = memory_tensor_source(tensors, source);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> state(space_.size());
  for (size_t i = 0; i < space_.size(); ++i) {
    state[i] = saved_slots(i, *saved, step_count, source, std::nullopt);
  }
  state_ = std::move(state);
  step_count_ = step_count;
}

ParamVector Optimizer::step_from_saved(const ParamVector& theta, const ParamVector& grad,
                                       const TensorSource& state, int64_t step_count,
                                       const std::string& source) {
  check_step_arguments(theta, grad);
  c10::NoGradGuard no_grad;
  state_.assign(space_.size(), {});
  step_count_ = step_count + 1;
  ParamVector u;
  u.reserve(theta.size());
  // Set for the loop, and cleared however it ends.
  state_dropped_ = true;
  note_.clear();
  struct Clear {
    bool& flag;
    ~Clear() { flag = false; }
  } clear{state_dropped_};
  for (size_t i = 0; i < theta.size(); ++i) {
    state_[i] = saved_slots(i, state, step_count, source, theta[i].options());
    u.push_back(update(i, theta[i].detach(), grad[i].detach(), step_count_));
    state_[i].clear();
  }
  return u;
}

std::string Optimizer::meta_json() const {
  nlohmann::json j = nlohmann::json::parse(config_.to_json());
  j["step_count"] = step_count_;
  for (size_t i = 0; i < space_.size(); ++i) j["partition"][space_[i].name] = rule(i);
  return j.dump();
}

bool Optimizer::needs_saved_state() const {
  for (size_t i = 0; i < space_.size(); ++i) {
    if (!slots(i).empty()) return true;
  }
  return false;
}

std::vector<std::string> Optimizer::partition() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < space_.size(); ++i) out.push_back(rule(i));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Rules

namespace rules {

at::Tensor adamw_update(const at::Tensor& theta, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
                        int64_t t, double lr, double b1, double b2, double eps, double wd) {
  m.mul_(b1).add_(g, 1 - b1);
  v.mul_(b2).addcmul_(g, g, 1 - b2);
  const double bias1 = 1 - std::pow(b1, static_cast<double>(t));
  const double bias2 = 1 - std::pow(b2, static_cast<double>(t));
  const double step_size = lr / bias1;
  at::Tensor denom = (v.sqrt() / std::sqrt(bias2)).add_(eps);
  return theta * (-lr * wd) - step_size * (m / denom);
}

std::vector<bool> muon_partition(const OptimizerConfig& config, const ParamSpace& space,
                                 const ModelStructure& structure) {
  structure.validate(space);
  std::regex pattern(config.muon_params.empty() ? "." : config.muon_params);
  std::vector<bool> muon;
  for (size_t i = 0; i < space.size(); ++i) {
    muon.push_back(config.muon_params.empty()
                       ? structure.is_hidden_matrix(i, space)
                       : space[i].shape.size() >= 2 && std::regex_search(space[i].name, pattern));
  }
  return muon;
}

}  // namespace rules

namespace {

// AdamW, and PyTorch's Adam ("adam": decoupled_weight_decay=False), whose weight decay is an L2
// term added to the gradient before both moments instead of AdamW's decoupled −lr·wd·θ.
class AdamW : public Optimizer {
 public:
  AdamW(OptimizerConfig c, const ParamSpace& s)
      : Optimizer(std::move(c), s), coupled_(config_.name == "adam") {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<AdamW>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override { return {"exp_avg", "exp_avg_sq"}; }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    const bool l2 = coupled_ && c.weight_decay != 0;
    const at::Tensor d = l2 ? g + c.weight_decay * theta : g;
    return rules::adamw_update(theta, d, slot(i, "exp_avg", g), slot(i, "exp_avg_sq", g), t, c.lr,
                               c.beta1, c.beta2, c.eps, coupled_ ? 0.0 : c.weight_decay);
  }

 private:
  bool coupled_;
};

class Sgd : public Optimizer {
 public:
  Sgd(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Sgd>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override {
    return config_.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                                 : std::vector<std::string>{};
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t) override {
    const auto& c = config_;
    at::Tensor d = c.weight_decay != 0 ? g + c.weight_decay * theta : g;
    if (c.momentum != 0) {
      const bool fresh = !has_slot(i, "momentum_buffer");
      at::Tensor& buf = slot(i, "momentum_buffer", g);
      // torch.optim.SGD starts the buffer at the first gradient, undamped.
      if (fresh) {
        buf.copy_(d);
      } else {
        buf.mul_(c.momentum).add_(d, 1 - c.dampening);
      }
      d = c.nesterov ? d + c.momentum * buf : buf.clone();
    }
    return d * -c.lr;
  }
};

class SignSgd : public Optimizer {
 public:
  SignSgd(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<SignSgd>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override { return {}; }
  at::Tensor update(size_t, const at::Tensor& theta, const at::Tensor& g, int64_t) override {
    return -config_.lr * (at::sign(g) + config_.weight_decay * theta);
  }
};

class Signum : public Optimizer {
 public:
  Signum(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Signum>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override { return {"momentum_buffer"}; }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t) override {
    at::Tensor& m = slot(i, "momentum_buffer", g);
    m.mul_(config_.momentum).add_(g, 1 - config_.momentum);
    return -config_.lr * (at::sign(m) + config_.weight_decay * theta);
  }
};

class Lion : public Optimizer {
 public:
  Lion(OptimizerConfig c, const ParamSpace& s) : Optimizer(std::move(c), s) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<Lion>(*this); }

 protected:
  std::vector<std::string> slots(size_t) const override { return {"exp_avg"}; }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t) override {
    const auto& c = config_;
    at::Tensor& m = slot(i, "exp_avg", g);
    at::Tensor direction = at::sign(m * c.beta1 + g * (1 - c.beta1));
    m.mul_(c.beta2).add_(g, 1 - c.beta2);
    return -c.lr * (direction + c.weight_decay * theta);
  }
};

// Muon and NorMuon on their partition, AdamW (adam_* fields) elsewhere.
class MuonFamily : public Optimizer {
 public:
  MuonFamily(OptimizerConfig config, const ParamSpace& space, const ModelStructure& structure)
      : Optimizer(std::move(config), space),
        muon_(rules::muon_partition(config_, space_, structure)) {}
  std::unique_ptr<Optimizer> clone() const override { return std::make_unique<MuonFamily>(*this); }

 protected:
  std::string rule(size_t i) const override { return muon_[i] ? config_.name : "adamw"; }
  std::vector<std::string> slots(size_t i) const override {
    if (!muon_[i]) return {"exp_avg", "exp_avg_sq"};
    if (config_.name == "normuon") return {"momentum_buffer", "second_momentum_buffer"};
    return {"momentum_buffer"};
  }
  std::vector<int64_t> slot_shape(size_t i, const std::string& key) const override {
    // NorMuon keeps one second moment per row (neuron) of the matrix view.
    if (key == "second_momentum_buffer") return {space_[i].shape[0], 1};
    return space_[i].shape;
  }
  at::Tensor update(size_t i, const at::Tensor& theta, const at::Tensor& g, int64_t t) override {
    const auto& c = config_;
    if (!muon_[i]) {
      return rules::adamw_update(theta, g, slot(i, "exp_avg", g), slot(i, "exp_avg_sq", g), t,
                                 c.adam_lr, c.adam_beta1, c.adam_beta2, c.adam_eps,
                                 c.adam_weight_decay);
    }
    at::Tensor& buf = slot(i, "momentum_buffer", g);
    at::Tensor d;
    if (c.sum_momentum) {
      buf.mul_(c.momentum).add_(g);
      d = c.nesterov ? g + c.momentum * buf : buf.clone();
    } else {
      buf.lerp_(g, 1 - c.momentum);
      d = c.nesterov ? g.lerp(buf, c.momentum) : buf.clone();
    }
    const int64_t rows = d.size(0), cols = d.numel() / rows;
    at::Tensor o =
        (c.exact_polar ? polar_factor(d) : newton_schulz(d, c.ns_steps, c.ns_a, c.ns_b, c.ns_c))
            .reshape({rows, cols});
    if (c.name == "normuon") {
      const at::Tensor n = o.norm();
      at::Tensor& v = slot(i, "second_momentum_buffer", g);
      v.mul_(c.beta2).add_(o.square().mean(-1, /*keepdim=*/true), 1 - c.beta2);
      o = o / (v.sqrt() + 1e-10);
      o = o * (n / o.norm().clamp_min(1e-30));
    }
    const double scale = muon_scale(rows, cols, c.rms_scale);
    return theta * (-c.lr * c.weight_decay) - (c.lr * scale) * o.reshape(theta.sizes());
  }

 private:
  std::vector<bool> muon_;
};

}  // namespace

namespace rules {

// Only the Muon family reads the model's structure (its partition).
std::unique_ptr<Optimizer> adamw(const OptimizerConfig& c, const ParamSpace& s,
                                 const ModelStructure&) {
  return std::make_unique<AdamW>(c, s);
}
std::unique_ptr<Optimizer> muon_family(const OptimizerConfig& c, const ParamSpace& s,
                                       const ModelStructure& structure) {
  return std::make_unique<MuonFamily>(c, s, structure);
}
std::unique_ptr<Optimizer> sgd(const OptimizerConfig& c, const ParamSpace& s,
                               const ModelStructure&) {
  return std::make_unique<Sgd>(c, s);
}
std::unique_ptr<Optimizer> signsgd(const OptimizerConfig& c, const ParamSpace& s,
                                   const ModelStructure&) {
  return std::make_unique<SignSgd>(c, s);
}
std::unique_ptr<Optimizer> signum(const OptimizerConfig& c, const ParamSpace& s,
                                  const ModelStructure&) {
  return std::make_unique<Signum>(c, s);
}
std::unique_ptr<Optimizer> lion(const OptimizerConfig& c, const ParamSpace& s,
                                const ModelStructure&) {
  return std::make_unique<Lion>(c, s);
}

}  // namespace rules

}  // namespace curv
