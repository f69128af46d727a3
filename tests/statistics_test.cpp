// Standard errors over probe batches and paired comparisons, against a recomputation from
// independent per-batch audits (one engine per batch) with the formulas written out here.
#include "curv/core/statistics.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "curv/analysis/taylor.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// sqrt(B/(B−1) Σ w_b² (x_b − Σ w x)²), written out.
double expected_stderr(const std::vector<double>& x, const std::vector<double>& w) {
  double mean = 0.0;
  for (size_t b = 0; b < x.size(); ++b) mean += w[b] * x[b];
  double sum = 0.0;
  for (size_t b = 0; b < x.size(); ++b) sum += w[b] * w[b] * (x[b] - mean) * (x[b] - mean);
  const double B = static_cast<double>(x.size());
  return std::sqrt(B / (B - 1.0) * sum);
}

// The delta method for a ratio of means R = ā/c̄: sqrt(Var(a) − 2R Cov(a,c) + R² Var(c)) / |c̄|
// with the weighted batch (co)variances B/(B−1) Σ w_b² (a_b − ā)(c_b − c̄).
double expected_ratio_stderr(const std::vector<double>& a, const std::vector<double>& c,
                             const std::vector<double>& w) {
  double am = 0.0, cm = 0.0;
  for (size_t b = 0; b < a.size(); ++b) {
    am += w[b] * a[b];
    cm += w[b] * c[b];
  }
  const double B = static_cast<double>(a.size());
  double vaa = 0.0, vac = 0.0, vcc = 0.0;
  for (size_t b = 0; b < a.size(); ++b) {
    vaa += w[b] * w[b] * (a[b] - am) * (a[b] - am);
    vac += w[b] * w[b] * (a[b] - am) * (c[b] - cm);
    vcc += w[b] * w[b] * (c[b] - cm) * (c[b] - cm);
  }
  const double f = B / (B - 1.0), r = am / cm;
  return std::sqrt(f * (vaa - 2.0 * r * vac + r * r * vcc)) / std::abs(cm);
}

void check_close(double actual, double expected, const char* what) {
  INFO(what << ": " << actual << " vs " << expected);
  CHECK(std::abs(actual - expected) <= 1e-10 * std::max(1e-12, std::abs(expected)));
}

// Audits of u on each batch alone, with an engine of its own.
std::vector<TaylorResult> per_batch_audits(Objective& model, const ProbeSet& probe,
                                           const ParamVector& u, const BlockPartition& blocks,
                                           const TaylorOptions& options) {
  std::vector<TaylorResult> out;
  for (size_t b = 0; b < probe.size(); ++b) {
    CurvatureEngine engine(model, ProbeSet({probe[b]}));
    out.push_back(taylor_audit(engine, u, blocks, options));
  }
  return out;
}

template <typename F>
std::vector<double> each(const std::vector<TaylorResult>& rs, F f) {
  std::vector<double> out;
  for (const auto& r : rs) out.push_back(f(r));
  return out;
}

}  // namespace

TEST_CASE("batch statistics: mean, standard error and ratio by their formulas", "[statistics]") {
  const std::vector<double> x = {1.0, 4.0, -2.0}, c = {2.0, 3.0, 2.5}, w = {0.5, 0.3, 0.2};
  CHECK(batch_mean(x, w) == Approx(0.5 + 1.2 - 0.4).epsilon(1e-15));
  check_close(batch_stderr(x, w), expected_stderr(x, w), "stderr");
  check_close(ratio_stderr(x, c, w), expected_ratio_stderr(x, c, w), "ratio stderr");
  // Equal batches: the textbook s / sqrt(B).
  const std::vector<double> y = {1.0, 2.0, 6.0, 3.0}, q(4, 0.25);
  const double m = 3.0, s2 = (4.0 + 1.0 + 9.0 + 0.0) / 3.0;
  check_close(batch_stderr(y, q), std::sqrt(s2 / 4.0), "equal batches");
  CHECK(std::isnan(batch_stderr({2.0}, {1.0})));
  CHECK(std::isnan(ratio_stderr({1.0, 2.0}, {1.0, -1.0}, {0.5, 0.5})));  // c̄ = 0
  CHECK_THROWS_AS(batch_stderr({1.0, 2.0}, {1.0}), InvalidArgument);
  (void)m;
}

TEST_CASE("standard errors equal a per-batch recomputation on uneven batches", "[statistics]") {
  int finite_eta_star = 0;
  for (const auto coupling : {CouplingMode::kFull, CouplingMode::kNone}) {
    for (const auto method : {HvpMethod::kExact, HvpMethod::kFiniteDifference}) {
      for (const uint64_t seed : {11, 12, 13, 14}) {
        INFO("coupling " << to_string(coupling) << ", fd "
                         << (method == HvpMethod::kFiniteDifference) << ", seed " << seed);
        auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
        const ProbeSet probe = gpt_probe(7, 7, 3);  // batches of 3, 3 and 1 sequences
        REQUIRE(probe.size() == 3);
        const ParamVector u = scaled(random_direction(*model, seed), 1e-2);
        const auto blocks = BlockPartition::by_rule(model->space(), BlockRule::kTensor);
        TaylorOptions options;
        options.coupling = coupling;
        options.step_multipliers = {0.5, 2.0};
        EngineOptions engine_options;
        engine_options.hvp_method = method;
        CurvatureEngine engine(*model, probe, engine_options);
        const TaylorResult r = taylor_audit(engine, u, blocks, options);
        // The finite-difference per-batch audits compare against the exact HVP per batch: the
        // engine's FD terms agree with them to the FD error only, so use exact references there.
        const auto parts = per_batch_audits(*model, probe, u, blocks, options);
        std::vector<double> w;
        for (size_t b = 0; b < probe.size(); ++b) w.push_back(probe.weight(b));
        REQUIRE(r.batches.weight == w);
        const double u_sq = r.update_norm * r.update_norm;
        const bool exact = method == HvpMethod::kExact;
        auto check_se = [&](double actual, const std::vector<double>& xs, const char* what) {
          if (exact) {
            check_close(actual, expected_stderr(xs, w), what);
          } else {
            INFO(what);
            CHECK(actual == Approx(expected_stderr(xs, w)).epsilon(1e-4));
          }
        };
        check_close(r.loss_stderr, expected_stderr(each(parts, [](auto& p) { return p.loss; }), w),
                    "loss");
        check_close(r.first_order_stderr,
                    expected_stderr(each(parts, [](auto& p) { return p.first_order; }), w),
                    "first order");
        check_se(r.curvature_stderr, each(parts, [](auto& p) { return p.curvature; }), "curvature");
        check_se(r.nds_stderr, each(parts, [&](auto& p) { return p.curvature / u_sq; }), "nds");
        check_se(r.predicted_stderr, each(parts, [](auto& p) { return p.predicted; }), "predicted");
        check_close(r.realized_stderr,
                    expected_stderr(each(parts, [](auto& p) { return p.realized; }), w),
                    "realized");
        for (size_t k = 0; k < r.multipliers.size(); ++k) {
          check_se(r.multipliers[k].predicted_stderr,
                   each(parts, [&](auto& p) { return p.multipliers[k].predicted; }), "η predicted");
          check_close(
              r.multipliers[k].realized_stderr,
              expected_stderr(each(parts, [&](auto& p) { return p.multipliers[k].realized; }), w),
              "η realized");
        }
        // η* = −g·u / uᵀHu exists only where uᵀHu > 0 (some of the seeds).
        if (std::isfinite(r.eta_star)) {
          const auto a = each(parts, [](auto& p) { return -p.first_order; });
          const auto c = each(parts, [](auto& p) { return p.curvature; });
          if (exact) check_close(r.eta_star_stderr, expected_ratio_stderr(a, c, w), "η*");
          ++finite_eta_star;
        } else {
          CHECK(std::isnan(r.eta_star_stderr));
        }
        for (size_t l = 0; l < blocks.size(); ++l) {
          INFO("block " << blocks[l].name);
          const auto& b = r.blocks[l];
          check_close(
              b.first_order_stderr,
              expected_stderr(each(parts, [&](auto& p) { return p.blocks[l].first_order; }), w),
              "block first order");
          check_se(b.row_sum_stderr, each(parts, [&](auto& p) { return p.blocks[l].row_sum; }),
                   "block row sum");
          if (coupling == CouplingMode::kFull) {
            check_se(b.curvature_stderr,
                     each(parts, [&](auto& p) { return p.blocks[l].curvature; }), "block C_ll");
            if (b.sq_norm > 0) CHECK(b.nds_stderr == Approx(b.curvature_stderr / b.sq_norm));
          } else {
            CHECK(std::isnan(b.curvature_stderr));
          }
        }
        if (coupling == CouplingMode::kFull) {
          const auto within = each(parts, [](auto& p) {
            double s = 0;
            for (const auto& b : p.blocks) s += b.curvature;
            return s;
          });
          check_se(r.s_within_stderr, each(parts, [&](auto& p) { return p.s_within; }), "S_within");
          if (exact) {
            check_close(
                r.rho_within_stderr,
                expected_ratio_stderr(within, each(parts, [](auto& p) { return p.curvature; }), w),
                "ρ_within");
          }
        } else {
          CHECK(std::isnan(r.rho_within_stderr));
        }
        // Per-batch terms average to the probe-set values.
        CHECK(batch_mean(r.batches.curvature, w) == Approx(r.curvature).epsilon(1e-12));
        CHECK(batch_mean(r.batches.first_order, w) == Approx(r.first_order).epsilon(1e-12));
        CHECK(batch_mean(r.batches.loss, w) == Approx(r.loss).epsilon(1e-12));
        CHECK(batch_mean(r.batches.realized, w) == Approx(r.realized).epsilon(1e-12));
      }
    }
  }
  CHECK(finite_eta_star > 0);
}

TEST_CASE("one probe batch gives NaN standard errors", "[statistics]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(7, 4, 4));
  const auto blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  const TaylorResult r = taylor_audit(engine, random_direction(*model, 2), blocks);
  CHECK(std::isfinite(r.nds));
  CHECK(std::isnan(r.nds_stderr));
  CHECK(std::isnan(r.loss_stderr));
  CHECK(std::isnan(r.blocks.front().curvature_stderr));
}

TEST_CASE("a paired NDS comparison has the delta-method standard error of its batch pairs",
          "[statistics]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  const ProbeSet probe = gpt_probe(5, 8, 3);  // 3, 3, 2
  const auto blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  CurvatureEngine engine(*model, probe);
  TaylorOptions options;
  options.coupling = CouplingMode::kNone;
  const ParamVector ua = random_direction(*model, 21), ub = scaled(random_direction(*model, 22), 3);
  const TaylorResult a = taylor_audit(engine, ua, blocks, options);
  const TaylorResult b = taylor_audit(engine, ub, blocks, options);
  const NdsComparison c = compare_nds(a, b);
  std::vector<double> w, na, nb, d;
  for (size_t i = 0; i < probe.size(); ++i) {
    CurvatureEngine one(*model, ProbeSet({probe[i]}));
    const double x = taylor_audit(one, ua, blocks, options).nds;
    const double y = taylor_audit(one, ub, blocks, options).nds;
    w.push_back(probe.weight(i));
    na.push_back(x);
    nb.push_back(y);
    d.push_back(x - y);
  }
  CHECK(c.ratio == Approx(a.nds / b.nds).epsilon(1e-14));
  CHECK(c.difference == Approx(a.nds - b.nds).epsilon(1e-14));
  check_close(c.difference_stderr, expected_stderr(d, w), "difference");
  check_close(c.ratio_stderr, expected_ratio_stderr(na, nb, w), "ratio");
  // Audits on other batches cannot be paired.
  CurvatureEngine other(*model, gpt_probe(5, 8, 4));
  CHECK_THROWS_AS(compare_nds(a, taylor_audit(other, ub, blocks, options)), InvalidArgument);
}
