#include "curv/analysis/taylor.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// u restricted to a block, as a flat vector.
Eigen::VectorXd block_flat(const ParamVector& u, const Block& block, int64_t n) {
  return flat(masked(u, block.params), n);
}

}  // namespace

TEST_CASE("on a quadratic the predicted change equals the realized one and NDS is exact",
          "[taylor]") {
  QuadraticObjective q(11);
  CurvatureEngine engine(q, dummy_probe(3, 2));
  const int64_t n = engine.space().numel();
  Eigen::Map<const Eigen::MatrixXd> a(q.hessian().contiguous().data_ptr<double>(), n, n);
  auto blocks = BlockPartition::by_rule(engine.space(), BlockRule::kTensor);
  ParamVector u = random_direction(q, 4);
  TaylorOptions options;
  options.step_multipliers = {0.5, 2.0, -1.0};
  TaylorResult r = taylor_audit(engine, u, blocks, options);
  Eigen::VectorXd uf = flat(u, n);
  const double uhu = uf.dot(a * uf);
  CHECK(r.curvature == Approx(uhu).epsilon(1e-13));
  CHECK(r.nds == Approx(uhu / uf.squaredNorm()).epsilon(1e-13));
  CHECK(std::abs(r.realized - r.predicted) <= 1e-12 * std::max(1.0, std::abs(r.predicted)));
  for (const auto& m : r.multipliers) {
    INFO("eta " << m.eta);
    CHECK(std::abs(m.realized - m.predicted) <= 1e-12 * std::max(1.0, std::abs(m.predicted)));
  }
  CHECK(r.update_norm == Approx(uf.norm()).epsilon(1e-14));
  if (uhu > 0) {
    CHECK(r.eta_star == Approx(-r.first_order / uhu));
  } else {
    CHECK(std::isnan(r.eta_star));
  }
}

TEST_CASE("the coupling matrix is symmetric, sums to uᵀHu and has the dense block forms",
          "[taylor]") {
  for (const auto& config : {tiny_gpt_config(), tiny_mlp_config()}) {
    auto model = make_model(config, ModelInit{2, at::kDouble});
    ProbeSet probe = config.arch() == "mlp" ? mlp_probe(5, 20, 8) : gpt_probe(5, 6, 3);
    CurvatureEngine engine(*model, probe);
    const int64_t n = engine.space().numel();
    Eigen::MatrixXd h = dense_hessian(engine);
    auto blocks = BlockPartition::by_rule(
        engine.space(), config.arch() == "mlp" ? BlockRule::kTensor : BlockRule::kLayer);
    REQUIRE(blocks.size() >= 3);
    ParamVector u = random_direction(*model, 8);
    TaylorResult r = taylor_audit(engine, u, blocks);
    const Eigen::MatrixXd& c = r.coupling;
    INFO(config.describe());
    CHECK((c - c.transpose()).norm() <= 1e-12 * c.norm());
    CHECK(c.sum() == Approx(r.curvature).epsilon(1e-12));
    const double uhu = flat(u, n).dot(h * flat(u, n));
    CHECK(r.curvature == Approx(uhu).epsilon(1e-10));
    for (size_t l = 0; l < blocks.size(); ++l) {
      for (size_t m = 0; m < blocks.size(); ++m) {
        const double dense = block_flat(u, blocks[l], n).dot(h * block_flat(u, blocks[m], n));
        INFO("C(" << blocks[l].name << ", " << blocks[m].name << ") = " << c(l, m) << ", dense "
                  << dense);
        CHECK(std::abs(c(l, m) - dense) <= 1e-10 * std::max(1.0, std::abs(dense)));
      }
      CHECK(r.blocks[l].curvature == c(l, l));
      CHECK(r.blocks[l].row_sum == Approx(c.row(l).sum()).epsilon(1e-10).margin(1e-14));
      CHECK(r.blocks[l].nds == Approx(c(l, l) / r.blocks[l].sq_norm));
    }
    CHECK(r.s_within + r.s_cross == Approx(r.nds).epsilon(1e-12));
    CHECK(r.rho_within == Approx(r.s_within / r.nds));
    CHECK(r.hvps == static_cast<int64_t>(blocks.size()));
    // Each block's HVP is formed on the blocks after it only; the per-batch row sums, completed by
    // symmetry, equal u_lᵀ(H_b u)_l of one HVP along the whole of u.
    TaylorOptions direct_options;
    direct_options.coupling = CouplingMode::kNone;
    const TaylorResult direct = taylor_audit(engine, u, blocks, direct_options);
    const Eigen::MatrixXd& rows = r.batches.block_row_sum;
    const Eigen::MatrixXd& direct_rows = direct.batches.block_row_sum;
    CHECK((rows - direct_rows).norm() <= 1e-10 * direct_rows.norm());
    for (size_t b = 0; b < r.batches.curvature.size(); ++b) {
      CHECK(r.batches.curvature[b] == Approx(direct.batches.curvature[b]).epsilon(1e-10));
    }
    // The per-batch diagonal averages to C_ll.
    for (size_t l = 0; l < blocks.size(); ++l) {
      double mean = 0.0;
      for (size_t b = 0; b < r.batches.weight.size(); ++b) {
        mean += r.batches.weight[b] * r.batches.block_curvature(static_cast<Eigen::Index>(b),
                                                                static_cast<Eigen::Index>(l));
      }
      CHECK(mean == Approx(c(l, l)).epsilon(1e-10).margin(1e-14));
    }
    CHECK(r.curvature == Approx(direct.curvature).epsilon(1e-12));
  }
}

TEST_CASE("the randomized coupling estimate is unbiased within its standard error", "[taylor]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{2, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(5, 6, 6));
  auto blocks = BlockPartition::by_rule(engine.space(), BlockRule::kTensor);
  ParamVector u = random_direction(*model, 8);
  TaylorResult exact = taylor_audit(engine, u, blocks);
  TaylorOptions options;
  options.coupling = CouplingMode::kRandomized;
  options.coupling_samples = 64;
  options.seed = 3;
  TaylorResult est = taylor_audit(engine, u, blocks, options);
  CHECK(est.curvature == Approx(exact.curvature).epsilon(1e-12));
  int outside = 0;
  for (size_t l = 0; l < blocks.size(); ++l) {
    const double err = std::abs(est.blocks[l].curvature - exact.blocks[l].curvature);
    if (err > 4 * est.blocks[l].curvature_stderr + 1e-12) ++outside;
    CHECK(est.blocks[l].row_sum == Approx(exact.blocks[l].row_sum).epsilon(1e-10).margin(1e-14));
  }
  // 4 standard errors: an unbiased estimator leaves none of ~16 blocks outside but by rare chance.
  CHECK(outside <= 1);
  CHECK(est.hvps == 65);
  CHECK(est.coupling.size() == 0);

  options.coupling = CouplingMode::kNone;
  TaylorResult none = taylor_audit(engine, u, blocks, options);
  CHECK(none.hvps == 1);
  CHECK(std::isnan(none.blocks[0].curvature));
  CHECK(none.nds == Approx(exact.nds).epsilon(1e-12));
}

TEST_CASE("a zero direction is an audit with exact zeros, NaN ratios and a status", "[taylor]") {
  // A learning rate of 0 at the end of a schedule, identical checkpoints: u = 0.
  QuadraticObjective q(6);
  CurvatureEngine engine(q, dummy_probe(3, 1));
  const auto blocks = BlockPartition::by_rule(engine.space(), BlockRule::kTensor);
  const double loss = engine.loss();
  for (const CouplingMode mode :
       {CouplingMode::kFull, CouplingMode::kRandomized, CouplingMode::kNone}) {
    INFO(to_string(mode));
    TaylorOptions options;
    options.coupling = mode;
    options.step_multipliers = {0.5, 2.0};
    options.ggn = false;
    const int64_t forwards = engine.counters().forwards;
    const TaylorResult r = taylor_audit(engine, zeros_like(q.parameters()), blocks, options);
    CHECK(r.status == AuditStatus::kZeroDirection);
    CHECK(to_string(r.status) == "zero_direction");
    CHECK(r.loss == loss);
    CHECK(r.update_norm == 0.0);
    CHECK(r.first_order == 0.0);
    CHECK(r.curvature == 0.0);
    CHECK(r.predicted == 0.0);
    CHECK(r.realized == 0.0);
    CHECK(r.first_order_stderr == 0.0);
    for (const double ratio :
         {r.nds, r.eta_star, r.s_within, r.s_cross, r.rho_within, r.nds_stderr}) {
      CHECK(std::isnan(ratio));
    }
    CHECK(r.hvps == 0);
    CHECK(engine.counters().forwards == forwards);  // L(θ) was known: no pass at all
    REQUIRE(r.blocks.size() == blocks.size());
    for (const auto& b : r.blocks) {
      CHECK(b.sq_norm == 0.0);
      CHECK(b.first_order == 0.0);
      CHECK(std::isnan(b.nds));
    }
    CHECK(r.batches.size() == 3);
    CHECK(r.batches.curvature == std::vector<double>(3, 0.0));
    REQUIRE(r.multipliers.size() == 2);
    CHECK(r.multipliers[1].realized == 0.0);
    CHECK(r.coupling.size() == (mode == CouplingMode::kFull ? blocks.size() * blocks.size() : 0));
  }
}

TEST_CASE("taylor options and inputs are validated", "[taylor]") {
  QuadraticObjective q(1);
  CurvatureEngine engine(q, dummy_probe(1, 1));
  auto blocks = BlockPartition::by_rule(engine.space(), BlockRule::kWhole);
  ParamVector nan = zeros_like(q.parameters());
  nan[0].fill_(std::nan(""));
  CURV_CHECK_THROWS(taylor_audit(engine, nan, blocks), InvalidArgument,
                    Catch::Matchers::Contains("nan"));
  TaylorOptions options;
  options.coupling = CouplingMode::kRandomized;
  options.coupling_samples = 1;
  CURV_CHECK_THROWS(options.validate(), InvalidArgument,
                    Catch::Matchers::Contains("coupling_samples"));
  CHECK(parse_coupling_mode("random") == CouplingMode::kRandomized);
  CHECK_THROWS_AS(parse_coupling_mode("exact"), InvalidArgument);
}
