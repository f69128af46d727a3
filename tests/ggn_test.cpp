#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <Eigen/Eigenvalues>
#include <catch2/catch.hpp>
#include <cmath>

#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/gauss_newton.h"
#include "curv/core/linear_operator.h"
#include "curv/models/model_problems.h"
#include "curv/models/script_objective.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// Rows of the flattened `outputs` differentiated one by one w.r.t. the flattened parameters.
Eigen::MatrixXd dense_jacobian(const at::Tensor& outputs, const ParamVector& params, int64_t n) {
  at::Tensor flat_out = outputs.reshape({-1});
  Eigen::MatrixXd j = Eigen::MatrixXd::Zero(flat_out.numel(), n);
  for (int64_t r = 0; r < flat_out.numel(); ++r) {
    auto row = torch::autograd::grad({flat_out[r]}, params, {}, true, false, true);
    int64_t offset = 0;
    for (size_t i = 0; i < row.size(); ++i) {
      if (row[i].defined()) {
        at::Tensor values = row[i].to(at::kCPU, at::kDouble).contiguous();
        j.row(r).segment(offset, values.numel()) =
            Eigen::Map<const Eigen::VectorXd>(values.data_ptr<double>(), values.numel());
      }
      offset += params[i].numel();
    }
  }
  return j;
}

// The Hessian of a scalar with a graph to the parameters, one double backward per row.
Eigen::MatrixXd dense_hessian_of(const at::Tensor& scalar, const ParamVector& params, int64_t n) {
  auto grads = torch::autograd::grad({scalar}, params, {}, true, true, true);
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < grads.size(); ++i) {
    parts.push_back(grads[i].defined() ? grads[i].reshape(-1)
                                       : at::zeros({params[i].numel()}, params[i].options()));
  }
  return dense_jacobian(at::cat(parts), params, n);
}

// H_out of the mean cross-entropy in the flattened logits, from softmax written out here:
// block-diagonal, (diag(p_i) − p_i p_iᵀ) / n for each position i whose target is not ignored.
Eigen::MatrixXd dense_output_hessian(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t c = logits.size(-1);
  at::Tensor z = logits.detach().to(at::kCPU, at::kDouble).reshape({-1, c}).contiguous();
  at::Tensor y = targets.reshape({-1}).to(at::kCPU).contiguous();
  const int64_t rows = z.size(0);
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i) n += y[i].item<int64_t>() != kIgnoreIndex;
  Eigen::MatrixXd h = Eigen::MatrixXd::Zero(rows * c, rows * c);
  for (int64_t i = 0; i < rows; ++i) {
    if (y[i].item<int64_t>() == kIgnoreIndex) continue;
    Eigen::Map<const Eigen::VectorXd> zi(z.data_ptr<double>() + i * c, c);
    Eigen::VectorXd p = (zi.array() - zi.maxCoeff()).exp();
    p /= p.sum();
    Eigen::MatrixXd block = Eigen::MatrixXd(p.asDiagonal()) - p * p.transpose();
    h.block(i * c, i * c, c, c) = block / static_cast<double>(n);
  }
  return h;
}

at::Tensor mean_cross_entropy_of(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t c = logits.size(-1);
  return at::nll_loss(at::log_softmax(logits.reshape({-1, c}), -1), targets.reshape({-1}));
}

// The dense pieces of one batch: J (flattened logits × parameters), H_out, and the functional
// part R = ∇²_θ ⟨∂L/∂z, z(θ)⟩ with ∂L/∂z held fixed, so that H = Jᵀ H_out J + R.
struct DenseBatch {
  Eigen::MatrixXd jacobian, output_hessian, functional;
  Eigen::MatrixXd gauss_newton() const { return jacobian.transpose() * output_hessian * jacobian; }
};

DenseBatch dense_batch(Objective& objective, const Batch& batch) {
  ParamVector params = objective.parameters();
  const int64_t n = objective.space().numel();
  at::Tensor z = objective.logits(batch);
  DenseBatch d;
  d.jacobian = dense_jacobian(z, params, n);
  d.output_hessian = dense_output_hessian(z, batch.targets);
  at::Tensor dz =
      torch::autograd::grad({mean_cross_entropy_of(z, batch.targets)}, {z}, {}, true)[0];
  d.functional = dense_hessian_of((dz.detach() * z).sum(), params, n);
  return d;
}

// Σ_b w_b (dense G_b), Σ_b w_b R_b over a probe set.
struct DenseProbe {
  Eigen::MatrixXd g, r;
};

DenseProbe dense_probe(Objective& objective, const ProbeSet& probe) {
  const int64_t n = objective.space().numel();
  DenseProbe out{Eigen::MatrixXd::Zero(n, n), Eigen::MatrixXd::Zero(n, n)};
  for (size_t b = 0; b < probe.size(); ++b) {
    DenseBatch d = dense_batch(objective, probe[b]);
    out.g += probe.weight(b) * d.gauss_newton();
    out.r += probe.weight(b) * d.functional;
  }
  return out;
}

// Σ_b w_b gauss_newton_coupling(batch b): the probe set's coupling, as the engine will sum it.
Eigen::MatrixXd probe_coupling(Objective& objective, const ProbeSet& probe, const ParamVector& u,
                               const std::vector<std::vector<size_t>>& supports) {
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(supports.size(), supports.size());
  for (size_t b = 0; b < probe.size(); ++b) {
    c += probe.weight(b) * gauss_newton_coupling(objective, probe[b], u, supports);
  }
  return c;
}

std::vector<size_t> all_params(const Objective& objective) {
  std::vector<size_t> all(objective.space().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

std::vector<std::vector<size_t>> supports_of(const BlockPartition& blocks) {
  std::vector<std::vector<size_t>> out;
  for (size_t l = 0; l < blocks.size(); ++l) out.push_back(blocks[l].params);
  return out;
}

double relative(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-300);
}

struct TinyCase {
  ModelConfig config;
  ProbeSet probe;
  BlockRule rule;
};

// Tiny float64 GPT and MLP with two probe batches each, and a block rule giving >= 3 blocks.
std::vector<TinyCase> tiny_cases() {
  return {{tiny_gpt_config(), gpt_probe(5, 5, 3), BlockRule::kLayer},
          {tiny_mlp_config(), mlp_probe(5, 20, 12), BlockRule::kTensor}};
}

}  // namespace

TEST_CASE("logits() give back the loss of every cross-entropy model", "[ggn]") {
  MemoryConfig memory;
  memory.classes = 5;
  memory.dim = 7;
  std::vector<std::pair<ModelConfig, Batch>> cases = {
      {tiny_gpt_config(), gpt_probe(1, 3, 3)[0]},
      {tiny_mlp_config(), mlp_probe(1, 9, 9)[0]},
      {ModelConfig("memory", memory), sample_memory_batch(5, 1.0, 12, 4)}};
  for (auto& [config, batch] : cases) {
    auto model = make_model(config, ModelInit{3, at::kDouble});
    INFO(config.describe());
    const double loss = model->loss(batch).item<double>();
    const double from_logits =
        mean_cross_entropy_of(model->logits(batch), batch.targets).item<double>();
    CHECK(relative(from_logits, loss) <= 1e-15);
  }
  // The same validation as loss(): a token outside the vocabulary.
  auto gpt = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  Batch bad = gpt_probe(1, 2, 2)[0];
  bad.inputs[0][0] = 7;
  CURV_CHECK_THROWS(gpt->logits(bad), ModelError, Catch::Matchers::Contains("vocabulary"));
}

TEST_CASE("the JVP equals the dense Jacobian times u, for all parameters and per block", "[ggn]") {
  for (const auto& c : tiny_cases()) {
    auto model = make_model(c.config, ModelInit{2, at::kDouble});
    ParamVector params = model->parameters();
    const int64_t n = model->space().numel();
    auto blocks = BlockPartition::by_rule(model->space(), c.rule);
    REQUIRE(blocks.size() >= 3);
    std::vector<std::vector<size_t>> supports = supports_of(blocks);
    supports.push_back(all_params(*model));
    ParamVector u = random_direction(*model, 8);
    const Batch& batch = c.probe[0];
    at::Tensor logits = model->logits(batch);
    const Eigen::MatrixXd j = dense_jacobian(logits, params, n);
    double worst = 0;
    // Several JVPs from one forward pass; u left undefined outside each support.
    for (const auto& support : supports) {
      ParamVector partial(params.size());
      for (size_t i : support) partial[i] = u[i];
      at::Tensor jv = jacobian_vector_product(logits, params, partial, support);
      REQUIRE(jv.sizes().equals(logits.sizes()));
      const Eigen::VectorXd want = j * flat(masked(u, support), n);
      at::Tensor got_t = jv.contiguous();
      Eigen::Map<const Eigen::VectorXd> got(got_t.data_ptr<double>(), got_t.numel());
      const double err = (got - want).norm() / want.norm();
      worst = std::max(worst, err);
      CHECK(err <= kTolFloat64);
    }
    INFO(c.config.describe() << ": max relative JVP error " << worst);
    CHECK(worst <= kTolFloat64);
  }
}

TEST_CASE("uᵀGu and the block coupling equal the dense Jᵀ H_out J forms", "[ggn]") {
  for (const auto& c : tiny_cases()) {
    auto model = make_model(c.config, ModelInit{2, at::kDouble});
    const int64_t n = model->space().numel();
    auto blocks = BlockPartition::by_rule(model->space(), c.rule);
    const DenseProbe dense = dense_probe(*model, c.probe);
    INFO(c.config.describe());
    // G itself is symmetric positive semi-definite.
    CHECK((dense.g - dense.g.transpose()).norm() <= 1e-14 * dense.g.norm());
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(dense.g);
    CHECK(eig.eigenvalues().minCoeff() >= -1e-12 * eig.eigenvalues().maxCoeff());
    for (uint64_t seed : {8, 9, 10}) {
      ParamVector u = random_direction(*model, seed);
      const Eigen::VectorXd uf = flat(u, n);
      const double ugu = uf.dot(dense.g * uf);
      // One support with every parameter: the 1 × 1 matrix uᵀGu.
      const Eigen::MatrixXd total = probe_coupling(*model, c.probe, u, {all_params(*model)});
      REQUIRE(total.rows() == 1);
      INFO("seed " << seed << ": uᵀGu " << total(0, 0) << ", dense " << ugu << ", relative error "
                   << relative(total(0, 0), ugu));
      CHECK(relative(total(0, 0), ugu) <= kTolFloat64);
      CHECK(total(0, 0) >= 0);
      // Per block: each entry is the dense (u_l)ᵀ G (u_m); the entries sum to uᵀGu.
      const Eigen::MatrixXd coupling = probe_coupling(*model, c.probe, u, supports_of(blocks));
      Eigen::MatrixXd want(blocks.size(), blocks.size());
      for (size_t l = 0; l < blocks.size(); ++l) {
        for (size_t m = 0; m < blocks.size(); ++m) {
          want(l, m) = flat(masked(u, blocks[l].params), n)
                           .dot(dense.g * flat(masked(u, blocks[m].params), n));
        }
      }
      const double entry_err = (coupling - want).cwiseAbs().maxCoeff() / want.cwiseAbs().maxCoeff();
      INFO("block coupling: max entry error / max entry " << entry_err);
      CHECK(entry_err <= kTolFloat64);
      CHECK(relative(coupling.sum(), ugu) <= kTolFloat64);
      CHECK((coupling - coupling.transpose()).norm() <= 1e-14 * coupling.norm());
      Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> ceig(coupling);
      CHECK(ceig.eigenvalues().minCoeff() >= -1e-12 * ceig.eigenvalues().maxCoeff());
    }
  }
}

TEST_CASE("the residual uᵀHu − uᵀGu is uᵀ(H − G)u, the functional Hessian part", "[ggn]") {
  for (const auto& c : tiny_cases()) {
    auto model = make_model(c.config, ModelInit{2, at::kDouble});
    const int64_t n = model->space().numel();
    CurvatureEngine engine(*model, c.probe);
    const Eigen::MatrixXd h = dense_hessian(engine);
    const DenseProbe dense = dense_probe(*model, c.probe);
    INFO(c.config.describe());
    // H = G + R: the Gauss-Newton part and ⟨∂L/∂z, ∇²z⟩ with the loss's own weights.
    const double split_err = (h - dense.g - dense.r).norm() / h.norm();
    INFO("‖H − G − R‖ / ‖H‖ = " << split_err);
    CHECK(split_err <= kTolFloat64);
    for (uint64_t seed : {8, 9}) {
      ParamVector u = random_direction(*model, seed);
      const Eigen::VectorXd uf = flat(u, n);
      const double uhu = dot(u, engine.hvp(u));
      const double ugu = probe_coupling(*model, c.probe, u, {all_params(*model)})(0, 0);
      const double want = uf.dot((h - dense.g) * uf);
      const double err = std::abs((uhu - ugu) - want) / std::max(std::abs(want), std::abs(uhu));
      INFO("seed " << seed << ": uᵀHu " << uhu << ", uᵀGu " << ugu << ", residual " << uhu - ugu
                   << ", dense uᵀ(H − G)u " << want << ", uᵀRu " << uf.dot(dense.r * uf)
                   << ", error " << err);
      CHECK(err <= kTolFloat64);
      CHECK(std::abs((uhu - ugu) - uf.dot(dense.r * uf)) <= kTolFloat64 * std::abs(uhu));
    }
  }
}

TEST_CASE("where the logits are linear in the parameters the residual vanishes", "[ggn]") {
  // The associative memory's logits E_out W e_in are linear in W: H = G exactly.
  MemoryConfig memory;
  memory.classes = 6;
  memory.dim = 8;
  auto model = make_model(ModelConfig("memory", memory), ModelInit{0, at::kDouble});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  load_parameters(*model,
                  {at::normal(0.0, 0.3, {8, 8}, gen, at::TensorOptions().dtype(at::kDouble))});
  ProbeSet probe({sample_memory_batch(6, 1.0, 40, 2)});
  CurvatureEngine engine(*model, probe);
  ParamVector u = random_direction(*model, 5);
  const double uhu = dot(u, engine.hvp(u));
  const double ugu = gauss_newton_coupling(*model, probe[0], u, {{0}})(0, 0);
  INFO("memory: uᵀHu " << uhu << ", uᵀGu " << ugu);
  CHECK(relative(ugu, uhu) <= 1e-12);
  // The MLP's last layer enters its logits linearly: its diagonal block of H is G's.
  auto mlp = make_model(tiny_mlp_config(), ModelInit{2, at::kDouble});
  ProbeSet mlp_set = mlp_probe(3, 16, 16);
  CurvatureEngine mlp_engine(*mlp, mlp_set);
  ParamVector v = masked(random_direction(*mlp, 6), {2, 3});
  const double vhv = dot(v, mlp_engine.hvp(v));
  const double vgv = gauss_newton_coupling(*mlp, mlp_set[0], v, {{2, 3}})(0, 0);
  INFO("mlp last layer: vᵀHv " << vhv << ", vᵀGv " << vgv);
  CHECK(relative(vgv, vhv) <= 1e-12);
}

TEST_CASE("targets at the ignore index drop out of H_out as they drop out of the loss", "[ggn]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{4, at::kDouble});
  const int64_t n = model->space().numel();
  Batch batch = gpt_probe(2, 3, 3)[0];
  batch.targets[0][1] = kIgnoreIndex;
  batch.targets[2][0] = kIgnoreIndex;
  batch.targets[2][3] = kIgnoreIndex;
  ProbeSet probe({batch});
  CurvatureEngine engine(*model, probe);
  const Eigen::MatrixXd h = dense_hessian(engine);
  const DenseBatch dense = dense_batch(*model, batch);
  // The identity H = G + R holds only when H_out uses the loss's positions and mean.
  const double split_err = (h - dense.gauss_newton() - dense.functional).norm() / h.norm();
  INFO("‖H − G − R‖ / ‖H‖ = " << split_err);
  CHECK(split_err <= kTolFloat64);
  ParamVector u = random_direction(*model, 3);
  const Eigen::VectorXd uf = flat(u, n);
  const double ugu = gauss_newton_coupling(*model, batch, u, {all_params(*model)})(0, 0);
  CHECK(relative(ugu, uf.dot(dense.gauss_newton() * uf)) <= kTolFloat64);
  // Every target ignored: the loss is 0/0.
  at::Tensor logits = model->logits(batch).detach();
  at::Tensor none = at::full_like(batch.targets, kIgnoreIndex);
  CURV_CHECK_THROWS(cross_entropy_gauss_newton(logits, none, logits, logits), InvalidArgument,
                    Catch::Matchers::Contains("ignore index"));
}

TEST_CASE("the output-space forms are exact across chunks of positions", "[ggn]") {
  // 1500 positions × 3000 classes: several chunks for every call.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor logits = at::normal(0.0, 3.0, {3, 500, 3000}, gen, f64);
  at::Tensor targets = at::randint(0, 3000, {3, 500}, gen, f64.dtype(at::kLong));
  targets.masked_fill_(targets.remainder(7) == 0, kIgnoreIndex);
  std::vector<at::Tensor> t = {at::normal(0.0, 1.0, logits.sizes(), gen, f64),
                               at::normal(0.0, 1.0, logits.sizes(), gen, f64),
                               at::normal(0.0, 1.0, logits.sizes(), gen, f64)};
  // Written out once over all positions: (1/n) Σ_i [Σ_c p a b − (Σ_c p a)(Σ_c p b)].
  at::Tensor kept = targets.ne(kIgnoreIndex).to(at::kDouble).unsqueeze(-1);
  at::Tensor p = at::softmax(logits, -1) * kept;
  const double n = kept.sum().item<double>();
  auto direct = [&](const at::Tensor& a, const at::Tensor& b) {
    return ((p * a * b).sum() - ((p * a).sum(-1) * (p * b).sum(-1)).sum()).item<double>() / n;
  };
  const Eigen::MatrixXd g = cross_entropy_gauss_newton_matrix(logits, targets, t);
  double worst = 0;
  for (size_t l = 0; l < t.size(); ++l) {
    for (size_t m = 0; m < t.size(); ++m) {
      const double want = direct(t[l], t[m]);
      worst = std::max(worst, std::abs(g(l, m) - want) / std::abs(direct(t[l], t[l])));
      if (l == 0 && m == 1) {
        const double form = cross_entropy_gauss_newton(logits, targets, t[0], t[1]);
        CHECK(std::abs(form - want) <= 1e-12 * std::abs(direct(t[0], t[0])));
      }
    }
  }
  INFO("max error / diagonal " << worst);
  CHECK(worst <= 1e-12);
  // No targets: every position counts.
  at::Tensor p_all = at::softmax(logits, -1);
  const double all =
      ((p_all * t[0] * t[0]).sum() - (p_all * t[0]).sum(-1).pow(2).sum()).item<double>() /
      static_cast<double>(logits.numel() / logits.size(-1));
  CHECK(relative(cross_entropy_gauss_newton(logits, at::Tensor(), t[0], t[0]), all) <= 1e-12);
}

TEST_CASE("a TorchScript model in logits mode has the exact split; in loss mode it is an error",
          "[ggn]") {
  TempDir dir;
  run_python("make_script_fixture.py", {dir.path(), "float64"});
  ProbeSet probe = load_script_fixture_probe(dir.path());
  auto model = load_script_objective(dir.file("model_logits.pt"));
  const int64_t n = model->space().numel();
  CurvatureEngine engine(*model, probe);
  const Eigen::MatrixXd h = dense_hessian(engine);
  const DenseBatch dense = dense_batch(*model, probe[0]);
  const double split_err = (h - dense.gauss_newton() - dense.functional).norm() / h.norm();
  INFO("‖H − G − R‖ / ‖H‖ = " << split_err);
  CHECK(split_err <= kTolFloat64);
  ParamVector u = random_direction(*model, 2);
  const Eigen::VectorXd uf = flat(u, n);
  const double ugu = gauss_newton_coupling(*model, probe[0], u, {all_params(*model)})(0, 0);
  CHECK(relative(ugu, uf.dot(dense.gauss_newton() * uf)) <= kTolFloat64);

  auto loss_mode = load_script_objective(dir.file("model_loss.pt"));
  CURV_CHECK_THROWS(loss_mode->logits(probe[0]), ModelError,
                    Catch::Matchers::Contains("model_loss.pt") &&
                        Catch::Matchers::Contains("returns the loss") &&
                        Catch::Matchers::Contains("logits mode"));
  CURV_CHECK_THROWS(gauss_newton_coupling(*loss_mode, probe[0], u, {all_params(*loss_mode)}),
                    ModelError, Catch::Matchers::Contains("logits mode"));
  // Targets that do not match the logits are caught as loss() catches them.
  Batch short_targets{probe[0].inputs, probe[0].targets.narrow(0, 0, 3)};
  CURV_CHECK_THROWS(model->logits(short_targets), ModelError,
                    Catch::Matchers::Contains("model_logits.pt"));
}

TEST_CASE("objectives not scored by cross-entropy on logits are ModelErrors", "[ggn]") {
  QuadraticConfig quadratic;
  quadratic.rows = 4;
  quadratic.cols = 3;
  quadratic.alpha = 1.0 / 3.0;
  auto built_in = make_model(ModelConfig("quadratic", quadratic), ModelInit{0, at::kDouble});
  auto mse =
      make_model(ModelConfig::from_json(R"({"arch": "mlp", "sizes": [3, 4, 2], "loss": "mse"})"),
                 ModelInit{0, at::kDouble});
  QuadraticObjective fixture(3);
  Batch batch{at::zeros({2, 3}, at::kDouble), at::zeros({2, 2}, at::kDouble)};
  for (Objective* objective : {built_in.get(), mse.get(), static_cast<Objective*>(&fixture)}) {
    INFO(objective->describe());
    CURV_CHECK_THROWS(objective->logits(batch), ModelError,
                      Catch::Matchers::Contains(objective->describe()) &&
                          Catch::Matchers::Contains("Gauss-Newton") &&
                          Catch::Matchers::Contains("cross-entropy on logits"));
    ParamVector u = random_direction(*objective, 1);
    CHECK_THROWS_AS(gauss_newton_coupling(*objective, batch, u, {all_params(*objective)}),
                    ModelError);
  }
}

TEST_CASE("bad JVP arguments are InvalidArguments naming the problem", "[ggn]") {
  auto model = make_model(tiny_mlp_config(), ModelInit{2, at::kDouble});
  ParamVector params = model->parameters();
  ParamVector u = random_direction(*model, 1);
  at::Tensor logits = model->logits(mlp_probe(1, 4, 4)[0]);
  CURV_CHECK_THROWS(jacobian_vector_product(logits, params, u, {0, 7}), InvalidArgument,
                    Catch::Matchers::Contains("support index 7"));
  CURV_CHECK_THROWS(jacobian_vector_product(logits, params, u, {1, 1}), InvalidArgument,
                    Catch::Matchers::Contains("twice"));
  CURV_CHECK_THROWS(jacobian_vector_product(logits, params, ParamVector(params.size()), {2}),
                    InvalidArgument, Catch::Matchers::Contains("v[2]"));
  CURV_CHECK_THROWS(jacobian_vector_product(logits.detach(), params, u, {0}), InvalidArgument,
                    Catch::Matchers::Contains("no autograd graph"));
  CHECK(jacobian_vector_product(logits, params, u, {}).abs().max().item<double>() == 0.0);
  CURV_CHECK_THROWS(cross_entropy_gauss_newton(logits, at::zeros({3}, at::kLong), logits, logits),
                    InvalidArgument, Catch::Matchers::Contains("one per row"));
  CURV_CHECK_THROWS(cross_entropy_gauss_newton(logits, at::Tensor(), logits, logits.t()),
                    InvalidArgument, Catch::Matchers::Contains("logits' shape"));
}

TEST_CASE("in float32 the coupling matches float64 and u may be of another dtype", "[ggn]") {
  auto model64 = make_model(tiny_gpt_config(), ModelInit{2, at::kDouble});
  auto model32 = make_model(tiny_gpt_config(), ModelInit{2, at::kFloat});
  const Batch batch = gpt_probe(5, 3, 3)[0];
  auto blocks = BlockPartition::by_rule(model64->space(), BlockRule::kLayer);
  ParamVector u = random_direction(*model64, 8);  // float64, read by the float32 model too
  const Eigen::MatrixXd c64 = gauss_newton_coupling(*model64, batch, u, supports_of(blocks));
  const Eigen::MatrixXd c32 = gauss_newton_coupling(*model32, batch, u, supports_of(blocks));
  const double err = (c32 - c64).norm() / c64.norm();
  INFO("float32 against float64: relative error " << err);
  CHECK(err <= kTolFloat32);
}
