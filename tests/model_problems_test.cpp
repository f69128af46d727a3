#include "curv/models/model_problems.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <Eigen/Eigenvalues>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>

#include "curv/analysis/taylor.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/optim/optimizers.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

QuadraticConfig small_quadratic(const std::string& basis) {
  QuadraticConfig c;
  c.rows = 6;
  c.cols = 4;
  c.alpha = 0.5;  // k = 2 of r = 4 diagonal modes
  c.w_high = 7.5;
  c.w_low = 0.3;
  c.d_high = 0.8;
  c.d_low = 1.7;
  c.basis = basis;
  c.basis_seed = 5;
  return c;
}

ModelConfig as_model(const QuadraticConfig& q) { return ModelConfig("quadratic", q); }

ModelConfig as_model(const MemoryConfig& c) { return ModelConfig("memory", c); }

double nds_along(CurvatureEngine& engine, const at::Tensor& u) {
  auto blocks = BlockPartition::by_rule(engine.space(), BlockRule::kWhole);
  return taylor_audit(engine, ParamVector{u}, blocks).nds;
}

// A batch where class c appears counts[c] times.
Batch batch_with_counts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> ids;
  for (size_t c = 0; c < counts.size(); ++c)
    ids.insert(ids.end(), counts[c], static_cast<int64_t>(c));
  at::Tensor x = at::tensor(ids, at::kLong).reshape({-1, 1});
  return Batch{x, x.clone()};
}

at::Tensor shares(const std::vector<int64_t>& counts) {
  std::vector<double> p(counts.begin(), counts.end());
  at::Tensor t = at::tensor(p, at::kDouble);
  return t / t.sum();
}

}  // namespace

TEST_CASE(
    "structured quadratic: Hessian spectrum, HVP and the closed-form NDS of Muon and "
    "gradient steps",
    "[model_problems]") {
  for (const std::string basis : {"random", "identity"}) {
    INFO("basis " << basis);
    const QuadraticConfig c = small_quadratic(basis);
    QuadraticProblem problem(c);
    auto model = make_model(as_model(c), ModelInit{0, at::kDouble});
    CurvatureEngine engine(*model, dummy_probe(1, 1));
    REQUIRE(engine.space().size() == 1);
    REQUIRE(engine.space()[0].name == "quadratic.weight");

    // U and V orthogonal; the model starts at W_0 = U diag(d) Vᵀ.
    CHECK(at::allclose(at::matmul(problem.left_basis().t(), problem.left_basis()),
                       at::eye(6, at::kDouble), 0, 1e-13));
    CHECK(at::allclose(at::matmul(problem.right_basis().t(), problem.right_basis()),
                       at::eye(4, at::kDouble), 0, 1e-13));
    const at::Tensor w0 = model->parameters()[0].detach();
    CHECK(at::allclose(w0, problem.initial_weight(), 0, 1e-14));
    CHECK(engine.loss() == Approx(problem.loss(w0)).epsilon(1e-13));

    // Dense Hessian: k² = 4 eigenvalues w_H, the other 20 w_L.
    Eigen::MatrixXd h = dense_hessian(engine);
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(h);
    const auto& values = eig.eigenvalues();
    for (int i = 0; i < 20; ++i) CHECK(values(i) == Approx(c.w_low).epsilon(1e-12));
    for (int i = 20; i < 24; ++i) CHECK(values(i) == Approx(c.w_high).epsilon(1e-12));

    // HVP along a random matrix equals the closed form.
    at::Tensor z = at::randn({6, 4}, at::kDouble);
    at::Tensor hz = engine.hvp(ParamVector{z})[0];
    CHECK(at::allclose(hz, problem.hvp(z), 0, 1e-12));
    CHECK(nds_along(engine, z) == Approx(problem.nds(z)).epsilon(1e-12));

    // The exact Muon step −polar(G): NDS = α w_H + (1 − α) w_L, and α of its energy is sharp.
    at::Tensor g = engine.gradient()[0].detach();
    CHECK(at::allclose(g, problem.gradient(w0), 0, 1e-12));
    at::Tensor muon = -polar_factor(g);
    CHECK(problem.high_share(muon) == Approx(c.alpha).epsilon(1e-12));
    CHECK(nds_along(engine, muon) == Approx(problem.muon_step_nds()).epsilon(1e-12));
    CHECK(problem.muon_step_nds() == Approx(0.5 * 7.5 + 0.5 * 0.3));
    // The gradient step's NDS follows the gradient's alignment with the sharp modes.
    const double a =
        2 * std::pow(7.5 * 0.8, 2) / (2 * std::pow(7.5 * 0.8, 2) + 2 * std::pow(0.3 * 1.7, 2));
    CHECK(problem.gradient_step_nds() == Approx(0.3 + (7.5 - 0.3) * a).epsilon(1e-14));
    CHECK(nds_along(engine, -g) == Approx(problem.gradient_step_nds()).epsilon(1e-12));
  }
}

TEST_CASE("structured quadratic: configs are validated", "[model_problems]") {
  QuadraticConfig c = small_quadratic("random");
  c.alpha = 0.3;  // 1.2 modes
  CURV_CHECK_THROWS(validate_quadratic(c), InvalidArgument, Catch::Contains("alpha = 0.3"));
  c = small_quadratic("random");
  c.basis = "diagonal";
  CURV_CHECK_THROWS(validate_quadratic(c), InvalidArgument, Catch::Contains("basis 'diagonal'"));
  c = small_quadratic("random");
  c.d_low = 0;
  CURV_CHECK_THROWS(validate_quadratic(c), InvalidArgument, Catch::Contains("d_low = 0"));
  CURV_CHECK_THROWS(ModelConfig::from_json(R"({"arch": "quadratic", "row": 3})", "q.json"),
                    FormatError, Catch::Contains("unknown model config key 'row'"));
  const ModelConfig round = ModelConfig::from_json(as_model(small_quadratic("identity")).to_json());
  CHECK(round.as<QuadraticConfig>().d_low == 1.7);
  CHECK(round.as<QuadraticConfig>().basis == "identity");
  CHECK(round.describe() == as_model(small_quadratic("identity")).describe());
}

TEST_CASE(
    "associative memory: closed-form NDS of gradient and Muon steps at zero, and the "
    "per-class loss after a gradient step",
    "[model_problems]") {
  MemoryConfig c;
  c.classes = 6;
  c.dim = 9;
  c.embedding_seed = 3;
  auto model = make_model(as_model(c), ModelInit{0, at::kDouble});
  REQUIRE(model->space()[0].name == "memory.weight");
  const std::vector<int64_t> counts = {20, 9, 5, 3, 2, 1};  // a power-law-like batch
  const at::Tensor p = shares(counts);
  ProbeSet probe({batch_with_counts(counts)});
  CurvatureEngine engine(*model, probe);

  // At W = 0 every class has loss log K.
  CHECK(engine.loss() == Approx(std::log(6.0)).epsilon(1e-14));
  at::Tensor g = engine.gradient()[0].detach();
  CHECK(nds_along(engine, -g) == Approx(memory_gradient_nds_at_zero(p)).epsilon(1e-11));
  CHECK(nds_along(engine, -polar_factor(g)) == Approx(memory_polar_nds_at_zero(p)).epsilon(1e-10));
  // Imbalance makes the gradient step sharper than the orthogonalised one; balanced they agree.
  CHECK(memory_gradient_nds_at_zero(p) > 2 * memory_polar_nds_at_zero(p));
  const at::Tensor uniform = at::full({6}, 1.0 / 6, at::kDouble);
  CHECK(memory_gradient_nds_at_zero(uniform) ==
        Approx(memory_polar_nds_at_zero(uniform)).epsilon(1e-14));
  CHECK(memory_gradient_nds_at_zero(uniform) == Approx(1.0 / 36).epsilon(1e-14));

  // One gradient step of size lr: class c's margin grows by lr·p_c.
  const double lr = 3.0;
  load_parameters(*model, ParamVector{-lr * g});
  at::Tensor per_class = model->token_losses(memory_all_classes(6)).reshape({-1});
  CHECK(at::allclose(per_class, memory_class_loss_after_gradient_step(p, lr), 0, 1e-12));
}

TEST_CASE(
    "associative memory: an orthogonalised step lowers the tail loss more than a gradient "
    "step of the same norm",
    "[model_problems]") {
  MemoryConfig c;
  c.classes = 32;
  c.dim = 32;
  auto model = make_model(as_model(c), ModelInit{0, at::kDouble});
  const Batch batch = sample_memory_batch(32, 1.0, 4096, 11);
  CurvatureEngine engine(*model, ProbeSet({batch}));
  at::Tensor g = engine.gradient()[0].detach();
  at::Tensor muon = -polar_factor(g);
  at::Tensor sgd = -g * (muon.norm() / g.norm());
  const at::Tensor buckets = memory_class_buckets(32, 1.0);
  auto tail_loss = [&](const at::Tensor& step) {
    load_parameters(*model, ParamVector{step});
    at::Tensor losses = model->token_losses(memory_all_classes(32)).reshape({-1});
    return losses.masked_select(buckets == 1).mean().item<double>();
  };
  const double tail_muon = tail_loss(muon), tail_sgd = tail_loss(sgd);
  INFO("tail loss after the Muon step " << tail_muon << ", after the gradient step " << tail_sgd);
  CHECK(tail_muon < tail_sgd - 0.1);
}

TEST_CASE("associative memory: class sampling follows the power law, buckets split the mass",
          "[model_problems]") {
  const int64_t K = 16, n = 200000;
  const at::Tensor p = memory_class_probabilities(K, 1.0);
  CHECK(p[0].item<double>() / p[3].item<double>() == Approx(4.0).epsilon(1e-14));
  const Batch b = sample_memory_batch(K, 1.0, n, 7);
  CHECK(at::equal(b.inputs, sample_memory_batch(K, 1.0, n, 7).inputs));
  at::Tensor observed = at::bincount(b.inputs.reshape({-1}), {}, K).to(at::kDouble);
  // Pearson chi-square with K − 1 = 15 degrees of freedom: 99.9% quantile 37.7.
  const double chi2 = ((observed - n * p).pow(2) / (n * p)).sum().item<double>();
  CHECK(chi2 < 37.7);
  const at::Tensor buckets = memory_class_buckets(K, 1.0);
  const double head_mass = p.masked_select(buckets == 0).sum().item<double>();
  CHECK(head_mass >= 0.5);
  CHECK(head_mass - p[buckets.eq(0).sum().item<int64_t>() - 1].item<double>() < 0.5);
  CHECK(buckets.eq(0).sum().item<int64_t>() == 3);  // at s = 1, K = 16: 3 classes hold 0.54
  CHECK(memory_class_buckets(K, 0.0).eq(0).sum().item<int64_t>() == 8);
  CURV_CHECK_THROWS(memory_gradient_nds_at_zero(at::tensor({0.5, 0.6}, at::kDouble)),
                    InvalidArgument, Catch::Contains("summing to 1"));
  MemoryConfig bad;
  bad.classes = 10;
  bad.dim = 4;
  CURV_CHECK_THROWS(validate_memory(bad), InvalidArgument,
                    Catch::Contains("dim = 4, classes = 10"));
  auto model = make_model(as_model(MemoryConfig{}), ModelInit{});
  at::Tensor ids = at::full({2, 1}, 64, at::kLong);
  CURV_CHECK_THROWS(model->loss(Batch{ids, ids}), ModelError, Catch::Contains("outside [0, 64)"));
}

TEST_CASE("the model problems form one block per module under the layer rule", "[model_problems]") {
  auto memory = make_model(as_model(MemoryConfig{}), ModelInit{});
  CHECK(BlockPartition::by_rule(memory->space(), BlockRule::kLayer).names() ==
        std::vector<std::string>{"memory"});
  auto quadratic = make_model(as_model(small_quadratic("random")), ModelInit{});
  CHECK(BlockPartition::by_rule(quadratic->space(), BlockRule::kLayer).names() ==
        std::vector<std::string>{"quadratic"});
}

TEST_CASE(
    "curvtrain and ndsprobe on the quadratic: every exact Muon step has NDS "
    "α w_H + (1 − α) w_L, the gradient's NDS is the closed form at each checkpoint",
    "[model_problems][tools]") {
  TempDir dir;
  const QuadraticConfig c = small_quadratic("random");
  const std::string config = dir.path() + "/quadratic.json";
  std::ofstream(config) << as_model(c).to_json();
  const std::string run = dir.path() + "/run";
  run_tool("curvtrain",
           fmt::format("--model {} --optimizer muon:lr=0.05,exact_polar=1,weight_decay=0 "
                       "--steps 6 --save-every 2 --dtype float64 -o {}",
                       config, run));
  const std::string out = dir.path() + "/probe.h5";
  run_tool("ndsprobe",
           fmt::format("{} --data {}/probe.safetensors --directions muon,gradient,delta "
                       "--dtype float64 -o {}",
                       run, run, out));
  QuadraticProblem problem(c);
  std::map<int64_t, at::Tensor> weights;
  for (const auto& info : list_checkpoints(run)) {
    weights[info.step] = load_checkpoint(info).model.at(0).second.to(at::kDouble);
  }
  REQUIRE(weights.size() == 4);
  const Table taylor = H5Reader(out).table("/taylor");
  int checked = 0;
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (taylor.strings("block")[i] != "total") continue;
    const std::string direction = taylor.strings("direction")[i];
    const int64_t step = taylor.int64s("step")[i];
    const double nds = taylor.doubles("nds")[i];
    INFO(direction << " at step " << step);
    if (direction == "muon" || direction == "delta") {
      CHECK(nds == Approx(problem.muon_step_nds()).epsilon(1e-10));
    } else {
      CHECK(nds == Approx(problem.nds(problem.gradient(weights.at(step)))).epsilon(1e-10));
      if (step == 0) CHECK(nds == Approx(problem.gradient_step_nds()).epsilon(1e-10));
    }
    ++checked;
  }
  CHECK(checked == 4 + 4 + 3);  // delta has no successor at the last checkpoint
}

TEST_CASE(
    "curvtrain and ndsprobe on the memory: at W = 0 the gradient and exact Muon directions "
    "have the closed-form NDS of the probe batch's class shares",
    "[model_problems][tools]") {
  TempDir dir;
  MemoryConfig c;
  c.classes = 8;
  c.dim = 8;
  const std::string config = dir.path() + "/memory.json";
  std::ofstream(config) << as_model(c).to_json();
  const std::string run = dir.path() + "/run";
  run_tool("curvtrain", fmt::format("--model {} --optimizer muon:exact_polar=1,weight_decay=0 "
                                    "--zipf-s 1 --steps 4 --batch-size 32 --save-every 4 "
                                    "--dtype float64 -o {}",
                                    config, run));
  // The log carries head and tail validation loss: at s = 1, 2 of 8 classes are the head.
  std::ifstream log(run + "/log.csv");
  std::string header, row;
  std::getline(log, header);
  std::getline(log, row);
  CHECK(header == "step,lr,train_loss,val_loss,val_head_loss,val_tail_loss");
  CHECK(row.find("nan") == std::string::npos);

  const std::vector<int64_t> counts = {13, 7, 4, 3, 2, 2, 1, 1};
  const Batch probe = batch_with_counts(counts);
  write_safetensors(dir.path() + "/imbalanced.safetensors",
                    {{"inputs", probe.inputs}, {"targets", probe.targets}});
  const std::string out = dir.path() + "/probe.h5";
  run_tool("ndsprobe", fmt::format("{} --data {}/imbalanced.safetensors --steps 0 "
                                   "--directions muon,gradient --dtype float64 -o {}",
                                   run, dir.path(), out));
  const Table taylor = H5Reader(out).table("/taylor");
  const at::Tensor p = shares(counts);
  int checked = 0;
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (taylor.strings("block")[i] != "total") continue;
    const std::string direction = taylor.strings("direction")[i];
    INFO(direction);
    const double expected =
        direction == "muon" ? memory_polar_nds_at_zero(p) : memory_gradient_nds_at_zero(p);
    CHECK(taylor.doubles("nds")[i] == Approx(expected).epsilon(1e-10));
    ++checked;
  }
  CHECK(checked == 2);
}
