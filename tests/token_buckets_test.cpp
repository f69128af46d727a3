// Token-frequency buckets: the assignment of ids to buckets, and the bucket audits against the
// totals and against an independent double-backward computation of each bucket's loss.
#include "curv/analysis/token_buckets.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/frequency_buckets.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

std::vector<int64_t> as_vector(const at::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

struct Restricted {
  double loss = 0, first_order = 0, curvature = 0, loss_at_step = 0;
};

// The bucket's share of the probe loss, Σ_b w_b Σ_{i ∈ b, bucket(y_i) = k} ℓ_i / n_b, with its
// gradient and u-curvature by plain autograd on the model's per-token losses: no engine involved.
Restricted restricted_audit(Objective& model, const ProbeSet& probe, const at::Tensor& bucket_of,
                            int64_t k, const ParamVector& u) {
  auto params = model.parameters();
  auto restricted_loss = [&]() {
    at::Tensor total = at::zeros({}, at::kDouble);
    for (size_t b = 0; b < probe.size(); ++b) {
      const at::Tensor l = model.token_losses(probe[b]);
      const at::Tensor in = bucket_of.index({probe[b].targets.reshape({-1})})
                                .reshape(probe[b].targets.sizes())
                                .eq(k)
                                .to(at::kDouble);
      total = total + probe.weight(b) * (l * in).sum() / static_cast<double>(l.numel());
    }
    return total;
  };
  Restricted r;
  at::Tensor loss = restricted_loss();
  r.loss = loss.item<double>();
  auto g = torch::autograd::grad({loss}, params, {}, true, true, true);
  at::Tensor gu = at::zeros({}, at::kDouble);
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].defined()) gu = gu + (g[i] * u[i]).sum();
  }
  r.first_order = gu.item<double>();
  auto hu = torch::autograd::grad({gu}, params, {}, false, false, true);
  for (size_t i = 0; i < hu.size(); ++i) {
    if (hu[i].defined()) r.curvature += (hu[i] * u[i]).sum().item<double>();
  }
  const ParamVector theta = snapshot_parameters(model);
  load_parameters(model, add(theta, u));
  {
    c10::NoGradGuard no_grad;
    r.loss_at_step = restricted_loss().item<double>();
  }
  load_parameters(model, theta);
  return r;
}

void check_close(double a, double b, double tol, const char* what) {
  INFO(what << ": " << a << " vs " << b);
  CHECK(std::abs(a - b) <= tol * std::max(1.0, std::abs(b)));
}

}  // namespace

TEST_CASE("quantile buckets cut the ranked ids at equal shares of the mass", "[buckets]") {
  // Ranked by mass: id 3 (0.4), 0 (0.3), 2 (0.2), 1 (0.1); id 4 has none. The middles of their
  // mass lie at 0.2, 0.55, 0.8 and 0.95 of the total.
  const std::vector<double> p = {0.3, 0.1, 0.2, 0.4, 0.0};
  CHECK(as_vector(quantile_buckets(p, 2, "t")) == std::vector<int64_t>{1, 1, 1, 0, 1});
  CHECK(as_vector(quantile_buckets(p, 4, "t")) == std::vector<int64_t>{2, 3, 3, 0, 3});
  // Eight equal ids in four buckets: two each.
  CHECK(as_vector(quantile_buckets(std::vector<double>(8, 1.0), 4, "t")) ==
        std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3});
  CHECK_THROWS_AS(quantile_buckets(p, 1, "t"), InvalidArgument);
  CHECK_THROWS_AS(quantile_buckets({0.0, 0.0}, 2, "t"), InvalidArgument);
}

TEST_CASE("token bucket specs parse or are refused by name", "[buckets]") {
  CHECK(TokenBucketOptions::parse("head").head_mass == 0.5);
  CHECK(TokenBucketOptions::parse("head:0.8").head_mass == 0.8);
  CHECK(TokenBucketOptions::parse("quantiles:5").quantiles == 5);
  for (const char* bad : {"head:1", "head:0", "head:x", "quantiles", "quantiles:1", "tail"}) {
    INFO(bad);
    CHECK_THROWS_AS(TokenBucketOptions::parse(bad), InvalidArgument);
  }
}

TEST_CASE("bucket audits sum to the totals and equal the restricted loss's own audit",
          "[buckets]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  const ProbeSet probe = gpt_probe(9, 7, 3);  // batches of 3, 3 and 1 sequences
  const ParamVector u = scaled(random_direction(*model, 5), 1e-2);
  const auto blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  for (const char* spec : {"head:0.5", "quantiles:3"}) {
    INFO(spec);
    const TokenBuckets buckets = make_token_buckets(TokenBucketOptions::parse(spec), probe);
    CurvatureEngine engine(*model, probe);
    TaylorOptions options;
    options.coupling = CouplingMode::kNone;
    const TaylorResult total = taylor_audit(engine, u, blocks, options);
    TokenBucketAudit audit(*model, probe, buckets, EngineOptions{});
    const auto results = audit.audit(u, blocks, options);
    REQUIRE(results.size() == buckets.names.size());
    double loss = 0, first = 0, curvature = 0, realized = 0, nds = 0, share = 0;
    for (size_t k = 0; k < results.size(); ++k) {
      const TaylorResult& t = results[k].taylor;
      loss += t.loss;
      first += t.first_order;
      curvature += t.curvature;
      realized += t.realized;
      nds += t.nds;
      share += results[k].share;
      const Restricted ref =
          restricted_audit(*model, probe, buckets.bucket_of_id, static_cast<int64_t>(k), u);
      check_close(t.loss, ref.loss, 1e-12, "bucket loss");
      check_close(t.first_order, ref.first_order, 1e-10, "bucket g·u");
      check_close(t.curvature, ref.curvature, 1e-10, "bucket uᵀHu");
      check_close(t.realized, ref.loss_at_step - ref.loss, 1e-10, "bucket realized");
      CHECK(std::isfinite(t.nds_stderr));
    }
    check_close(loss, total.loss, 1e-12, "Σ loss");
    check_close(first, total.first_order, 1e-12, "Σ g·u");
    check_close(curvature, total.curvature, 1e-12, "Σ uᵀHu");
    check_close(realized, total.realized, 1e-12, "Σ realized");
    check_close(nds, total.nds, 1e-12, "Σ NDS");
    check_close(share, 1.0, 1e-12, "Σ share");
  }
}

TEST_CASE("token counts files are read by id and refused clearly", "[buckets]") {
  TempDir dir;
  const ProbeSet probe = gpt_probe(9, 4, 2);  // ids 0..4
  TokenBucketOptions options = TokenBucketOptions::parse("head:0.5");
  options.counts_path = dir.file("counts.json");
  std::ofstream(options.counts_path) << R"({"counts": [100, 1, 1, 1, 50]})";
  const TokenBuckets b = make_token_buckets(options, probe);
  CHECK(as_vector(b.bucket_of_id) == std::vector<int64_t>{0, 1, 1, 1, 1});
  CHECK(b.count_share[0] == Approx(100.0 / 153.0));
  std::ofstream(options.counts_path) << "[3, 2]";
  CHECK_THROWS_WITH(make_token_buckets(options, probe), Catch::Matchers::Contains("counts.json") &&
                                                            Catch::Matchers::Contains("target id"));
  std::ofstream(options.counts_path) << "[3, -2, 1, 1, 1]";
  CHECK_THROWS_WITH(
      make_token_buckets(options, probe),
      Catch::Matchers::Contains("entry 1") && Catch::Matchers::Contains("counts.json"));
  std::ofstream(options.counts_path) << "not json";
  CHECK_THROWS_AS(make_token_buckets(options, probe), FormatError);
  options.counts_path = dir.file("missing.json");
  CHECK_THROWS_WITH(make_token_buckets(options, probe), Catch::Matchers::Contains("missing.json"));
}
