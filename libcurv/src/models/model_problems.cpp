#include "curv/models/model_problems.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "core/fmt_torch.h"
#include "curv/core/error.h"
#include "curv/core/frequency_buckets.h"
#include "models/architecture.h"

namespace curv {

// JSON fields of the model problems' configs: absent keys keep the defaults.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(QuadraticConfig, rows, cols, alpha, w_high, w_low,
                                                d_high, d_low, basis, basis_seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(MemoryConfig, classes, dim, embeddings,
                                                embedding_seed)

namespace {

at::TensorOptions f64() { return at::TensorOptions().dtype(at::kDouble); }

// A Haar-random orthogonal n × n matrix: QR of a Gaussian with R's diagonal made positive, so
// the result is a function of the seed alone.
at::Tensor random_orthogonal(int64_t n, at::Generator& gen) {
  at::Tensor a = at::normal(0.0, 1.0, {n, n}, gen, f64());
  auto qr = at::linalg_qr(a);
  at::Tensor q = std::get<0>(qr), r = std::get<1>(qr);
  return q * at::sign(r.diagonal()).unsqueeze(0);
}

// Objectives with a single matrix parameter and fixed buffers.
class SingleMatrixObjective : public Objective {
 public:
  const ParamSpace& space() const override { return space_; }
  ParamVector parameters() override { return {weight_}; }

 protected:
  void init_weight(const std::string& name, at::Tensor value) {
    weight_ = value.set_requires_grad(true);
    space_ = ParamSpace({name}, {weight_});
  }
  at::Tensor weight_;

 private:
  ParamSpace space_;
};

class QuadraticObjective : public SingleMatrixObjective {
 public:
  QuadraticObjective(const QuadraticConfig& c, const ModelInit& init) : config_(c) {
    QuadraticProblem problem(c);
    const int64_t k = c.high_modes();
    const c10::Device device(init.device);
    u_high_ = problem.left_basis().narrow(1, 0, k).to(device, init.dtype);
    v_high_ = problem.right_basis().narrow(1, 0, k).to(device, init.dtype);
    init_weight("quadratic.weight", problem.initial_weight().to(device, init.dtype));
  }

  at::Tensor loss(const Batch&) override {
    at::Tensor sharp = at::matmul(at::matmul(u_high_.t(), weight_), v_high_);
    return 0.5 * config_.w_low * weight_.pow(2).sum() +
           0.5 * (config_.w_high - config_.w_low) * sharp.pow(2).sum();
  }

  // The loss does not depend on the data: every target carries the full loss, so per-token
  // means equal it.
  at::Tensor token_losses(const Batch& batch) override {
    return loss(batch).detach().expand(batch.targets.sizes()).clone();
  }

  std::string describe() const override { return ModelConfig("quadratic", config_).describe(); }

 private:
  QuadraticConfig config_;
  at::Tensor u_high_, v_high_;
};

class MemoryObjective : public SingleMatrixObjective {
 public:
  MemoryObjective(const MemoryConfig& c, const ModelInit& init) : config_(c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(c.embedding_seed);
    auto embeddings = [&] {
      if (c.embeddings == "orthonormal")
        return random_orthogonal(c.dim, gen).narrow(0, 0, c.classes);
      return at::normal(0.0, 1.0, {c.classes, c.dim}, gen, f64()) /
             std::sqrt(static_cast<double>(c.dim));
    };
    const c10::Device device(init.device);
    keys_ = embeddings().to(device, init.dtype);
    outputs_ = embeddings().to(device, init.dtype);
    init_weight("memory.weight", at::zeros({c.dim, c.dim}, f64()).to(device, init.dtype));
  }

  at::Tensor loss(const Batch& batch) override {
    check(batch);
    return at::nll_loss(at::log_softmax(forward(batch.inputs), -1), batch.targets.reshape({-1}));
  }

  at::Tensor logits(const Batch& batch) override {
    check(batch);
    return forward(batch.inputs);
  }

  at::Tensor token_losses(const Batch& batch) override {
    check(batch);
    return at::nll_loss(at::log_softmax(forward(batch.inputs), -1), batch.targets.reshape({-1}), {},
                        at::Reduction::None)
        .reshape(batch.targets.sizes());
  }

  std::string describe() const override { return ModelConfig("memory", config_).describe(); }

 private:
  void check(const Batch& batch) const {
    for (const auto* t : {&batch.inputs, &batch.targets}) {
      if (t->scalar_type() != at::kLong) {
        throw ModelError(fmt::format("memory: inputs and targets must be int64 class ids; got {}",
                                     t->scalar_type()));
      }
      if (t->numel() == 0) continue;
      const int64_t lo = t->min().item<int64_t>(), hi = t->max().item<int64_t>();
      if (lo < 0 || hi >= config_.classes) {
        throw ModelError(fmt::format("memory: class ids span [{}, {}], outside [0, {})", lo, hi,
                                     config_.classes));
      }
    }
    if (!batch.targets.sizes().equals(batch.inputs.sizes())) {
      throw ModelError(fmt::format("memory: targets of shape {} do not match inputs of shape {}",
                                   batch.targets.sizes(), batch.inputs.sizes()));
    }
  }

  // Logits E_out·W·e_in(c) for every input class, one row per input.
  at::Tensor forward(const at::Tensor& inputs) const {
    at::Tensor keys = at::embedding(keys_, inputs.reshape({-1}));
    return at::matmul(at::matmul(keys, weight_.t()), outputs_.t());
  }

  MemoryConfig config_;
  at::Tensor keys_, outputs_;
};

}  // namespace

int64_t QuadraticConfig::high_modes() const {
  return std::llround(alpha * static_cast<double>(std::min(rows, cols)));
}

void validate_quadratic(const QuadraticConfig& c) {
  if (c.rows <= 0 || c.cols <= 0) {
    throw InvalidArgument(
        fmt::format("model config: quadratic rows = {}, cols = {} must be > 0", c.rows, c.cols));
  }
  const double r = static_cast<double>(std::min(c.rows, c.cols));
  if (!(c.alpha > 0 && c.alpha <= 1) || std::abs(c.alpha * r - std::round(c.alpha * r)) > 1e-9) {
    throw InvalidArgument(
        fmt::format("model config: quadratic alpha = {} must be in (0, 1] and "
                    "alpha·min(rows, cols) = {} a whole number of modes",
                    c.alpha, c.alpha * r));
  }
  if (!std::isfinite(c.w_high) || !std::isfinite(c.w_low)) {
    throw InvalidArgument(fmt::format(
        "model config: quadratic w_high = {}, w_low = {} must be finite", c.w_high, c.w_low));
  }
  if (!std::isfinite(c.d_high) || !std::isfinite(c.d_low) || c.d_high == 0 || c.d_low == 0) {
    throw InvalidArgument(
        fmt::format("model config: quadratic d_high = {}, d_low = {} must be "
                    "finite and non-zero",
                    c.d_high, c.d_low));
  }
  if (c.basis != "random" && c.basis != "identity") {
    throw InvalidArgument(
        fmt::format("model config: quadratic basis '{}': expected random or identity", c.basis));
  }
}

void validate_memory(const MemoryConfig& c) {
  if (c.classes < 2 || c.dim <= 0) {
    throw InvalidArgument(fmt::format(
        "model config: memory classes = {} must be >= 2 and dim = {} > 0", c.classes, c.dim));
  }
  if (c.embeddings != "orthonormal" && c.embeddings != "gaussian") {
    throw InvalidArgument(
        fmt::format("model config: memory embeddings '{}': expected orthonormal or "
                    "gaussian",
                    c.embeddings));
  }
  if (c.embeddings == "orthonormal" && c.dim < c.classes) {
    throw InvalidArgument(
        fmt::format("model config: memory embeddings orthonormal need dim >= classes; "
                    "got dim = {}, classes = {} (use \"gaussian\")",
                    c.dim, c.classes));
  }
}

std::unique_ptr<Objective> make_quadratic_problem(const QuadraticConfig& config,
                                                  const ModelInit& init) {
  validate_quadratic(config);
  return std::make_unique<QuadraticObjective>(config, init);
}

std::unique_ptr<Objective> make_memory_problem(const MemoryConfig& config, const ModelInit& init) {
  validate_memory(config);
  return std::make_unique<MemoryObjective>(config, init);
}

// ---------------------------------------------------------------------------------------------
// Registry entries: every config field is a JSON key.

namespace {

class QuadraticArchitecture : public JsonConfigArchitecture<QuadraticConfig> {
 public:
  std::string name() const override { return "quadratic"; }
  void validate_config(const QuadraticConfig& c) const override { validate_quadratic(c); }
  std::string describe_config(const QuadraticConfig& q) const override {
    return fmt::format(
        "quadratic(rows={}, cols={}, alpha={}, w_high={}, w_low={}, d_high={}, "
        "d_low={}, basis={}, basis_seed={})",
        q.rows, q.cols, q.alpha, q.w_high, q.w_low, q.d_high, q.d_low, q.basis, q.basis_seed);
  }
  std::unique_ptr<Objective> build(const QuadraticConfig& c, const ModelInit& init) const override {
    return make_quadratic_problem(c, init);
  }
  ModelData data_of(const QuadraticConfig&) const override { return {}; }  // kNone
};

class MemoryArchitecture : public JsonConfigArchitecture<MemoryConfig> {
 public:
  std::string name() const override { return "memory"; }
  void validate_config(const MemoryConfig& c) const override { validate_memory(c); }
  std::string describe_config(const MemoryConfig& m) const override {
    return fmt::format("memory(classes={}, dim={}, embeddings={}, embedding_seed={})", m.classes,
                       m.dim, m.embeddings, m.embedding_seed);
  }
  std::unique_ptr<Objective> build(const MemoryConfig& c, const ModelInit& init) const override {
    return make_memory_problem(c, init);
  }
  ModelData data_of(const MemoryConfig& c) const override {
    ModelData d;
    d.kind = ModelData::Kind::kClasses;
    d.classes = c.classes;
    return d;
  }
};

}  // namespace

std::shared_ptr<const Architecture> quadratic_architecture() {
  return std::make_shared<QuadraticArchitecture>();
}

std::shared_ptr<const Architecture> memory_architecture() {
  return std::make_shared<MemoryArchitecture>();
}

// ---------------------------------------------------------------------------------------------
// Structured quadratic

QuadraticProblem::QuadraticProblem(const QuadraticConfig& config) : config_(config) {
  validate_quadratic(config_);
  if (config_.basis == "identity") {
    u_ = at::eye(config_.rows, f64());
    v_ = at::eye(config_.cols, f64());
  } else {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(config_.basis_seed);
    u_ = random_orthogonal(config_.rows, gen);
    v_ = random_orthogonal(config_.cols, gen);
  }
}

at::Tensor QuadraticProblem::initial_weight() const {
  const int64_t r = std::min(config_.rows, config_.cols), k = config_.high_modes();
  at::Tensor d = at::full({r}, config_.d_low, f64());
  d.narrow(0, 0, k).fill_(config_.d_high);
  return at::matmul(u_.narrow(1, 0, r) * d.unsqueeze(0), v_.narrow(1, 0, r).t());
}

at::Tensor QuadraticProblem::hvp(const at::Tensor& z) const {
  const int64_t k = config_.high_modes();
  at::Tensor uk = u_.narrow(1, 0, k), vk = v_.narrow(1, 0, k);
  at::Tensor z64 = z.to(at::kCPU, at::kDouble);
  at::Tensor sharp = at::matmul(at::matmul(uk, at::matmul(at::matmul(uk.t(), z64), vk)), vk.t());
  return config_.w_low * z64 + (config_.w_high - config_.w_low) * sharp;
}

at::Tensor QuadraticProblem::gradient(const at::Tensor& w) const { return hvp(w); }

double QuadraticProblem::loss(const at::Tensor& w) const {
  return 0.5 * (w.to(at::kCPU, at::kDouble) * hvp(w)).sum().item<double>();
}

double QuadraticProblem::high_share(const at::Tensor& z) const {
  const int64_t k = config_.high_modes();
  at::Tensor z64 = z.to(at::kCPU, at::kDouble);
  at::Tensor sharp = at::matmul(at::matmul(u_.narrow(1, 0, k).t(), z64), v_.narrow(1, 0, k));
  return sharp.pow(2).sum().item<double>() / z64.pow(2).sum().item<double>();
}

double QuadraticProblem::nds(const at::Tensor& z) const {
  return config_.w_low + (config_.w_high - config_.w_low) * high_share(z);
}

double QuadraticProblem::muon_step_nds() const {
  return config_.alpha * config_.w_high + (1 - config_.alpha) * config_.w_low;
}

double QuadraticProblem::gradient_step_nds() const {
  const double k = static_cast<double>(config_.high_modes());
  const double r = static_cast<double>(std::min(config_.rows, config_.cols));
  const double high = k * std::pow(config_.w_high * config_.d_high, 2);
  const double low = (r - k) * std::pow(config_.w_low * config_.d_low, 2);
  return config_.w_low + (config_.w_high - config_.w_low) * high / (high + low);
}

// ---------------------------------------------------------------------------------------------
// Associative memory

at::Tensor memory_class_probabilities(int64_t classes, double s) {
  if (classes < 1 || !(s >= 0) || !std::isfinite(s)) {
    throw InvalidArgument(
        fmt::format("memory class frequencies: classes = {} must be >= 1 and "
                    "s = {} finite and >= 0",
                    classes, s));
  }
  at::Tensor p = at::pow(at::arange(1, classes + 1, f64()), -s);
  return p / p.sum();
}

Batch sample_memory_batch(int64_t classes, double s, int64_t n, uint64_t seed) {
  if (n < 1) throw InvalidArgument(fmt::format("memory batch: {} examples requested", n));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor ids =
      at::multinomial(memory_class_probabilities(classes, s), n, true, gen).reshape({n, 1});
  return Batch{ids, ids.clone()};
}

Batch memory_all_classes(int64_t classes) {
  at::Tensor ids = at::arange(classes, at::TensorOptions().dtype(at::kLong)).reshape({classes, 1});
  return Batch{ids, ids.clone()};
}

at::Tensor memory_class_buckets(int64_t classes, double s, double head_mass) {
  at::Tensor p = memory_class_probabilities(classes, s);
  return head_tail_buckets(
      std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + classes), head_mass,
      "memory buckets");
}

namespace {

at::Tensor checked_shares(const at::Tensor& freq, const char* what) {
  at::Tensor p = freq.to(at::kCPU, at::kDouble);
  if (p.dim() != 1 || p.size(0) < 2 || !(p.min().item<double>() > 0) ||
      std::abs(p.sum().item<double>() - 1) > 1e-9) {
    throw InvalidArgument(
        fmt::format("{}: class shares must be a vector of >= 2 positive values "
                    "summing to 1; got shape {}",
                    what, freq.sizes()));
  }
  return p;
}

}  // namespace

double memory_gradient_nds_at_zero(const at::Tensor& freq) {
  at::Tensor p = checked_shares(freq, "memory_gradient_nds_at_zero");
  return (p.pow(3).sum() / p.pow(2).sum()).item<double>() / static_cast<double>(p.size(0));
}

double memory_polar_nds_at_zero(const at::Tensor& freq) {
  at::Tensor p = checked_shares(freq, "memory_polar_nds_at_zero");
  const double k = static_cast<double>(p.size(0));
  at::Tensor q = p.reciprocal();
  q = q / q.norm();
  return (p * (1 - q.pow(2))).sum().item<double>() / (k * (k - 1));
}

at::Tensor memory_class_loss_after_gradient_step(const at::Tensor& freq, double lr) {
  at::Tensor p = checked_shares(freq, "memory_class_loss_after_gradient_step");
  const double k = static_cast<double>(p.size(0));
  return at::log1p((k - 1) * at::exp(-lr * p));
}

}  // namespace curv
