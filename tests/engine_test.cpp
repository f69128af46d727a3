#include "curv/core/engine.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include "curv/core/blocks.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

double relative(const Eigen::VectorXd& a, const Eigen::VectorXd& b) {
  return (a - b).norm() / b.norm();
}

}  // namespace

TEST_CASE("HVP on a quadratic objective is exactly A v", "[engine]") {
  QuadraticObjective q(7);
  CurvatureEngine engine(q, dummy_probe(5, 2));
  const int64_t n = engine.space().numel();
  Eigen::Map<const Eigen::MatrixXd> a(q.hessian().contiguous().data_ptr<double>(), n, n);
  for (uint64_t seed : {1, 2, 3}) {
    ParamVector v = random_direction(q, seed);
    Eigen::VectorXd expected = a * flat(v, n);
    Eigen::VectorXd got = flat(engine.hvp(v), n);
    INFO("seed " << seed << " relative error " << relative(got, expected));
    CHECK(relative(got, expected) <= 1e-14);
  }
  // Loss and gradient too: L = ½θᵀAθ + bᵀθ, g = Aθ + b.
  Eigen::VectorXd theta = flat(engine.parameters(), n);
  Eigen::Map<const Eigen::VectorXd> b(q.linear().data_ptr<double>(), n);
  CHECK(engine.loss() == Approx(0.5 * theta.dot(a * theta) + b.dot(theta)).epsilon(1e-14));
  CHECK(relative(flat(engine.gradient(), n), a * theta + b) <= 1e-14);
}

TEST_CASE("HVP equals the dense Hessian times v on tiny models in float64", "[engine]") {
  for (const auto& config : {tiny_mlp_config(), tiny_gpt_config()}) {
    auto model = make_model(config, ModelInit{3, at::kDouble});
    ProbeSet probe = config.arch() == "mlp" ? mlp_probe(11, 24, 10) : gpt_probe(11, 6, 4);
    CurvatureEngine engine(*model, probe);
    const int64_t n = engine.space().numel();
    Eigen::MatrixXd h = dense_hessian(engine);
    CHECK((h - h.transpose()).norm() <= 1e-12 * h.norm());
    for (uint64_t seed : {1, 2}) {
      ParamVector v = random_direction(*model, seed);
      const double err = relative(flat(engine.hvp(v), n), h * flat(v, n));
      INFO(config.describe() << " seed " << seed << " relative error " << err);
      CHECK(err <= 1e-10);
    }
  }
}

TEST_CASE("u·Hv equals v·Hu", "[engine]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{5, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(2, 8, 3));
  ParamVector u = random_direction(*model, 10), v = random_direction(*model, 20);
  const double uhv = dot(u, engine.hvp(v));
  const double vhu = dot(v, engine.hvp(u));
  INFO("u·Hv = " << uhv << ", v·Hu = " << vhu);
  CHECK(std::abs(uhv - vhu) <= 1e-12 * std::max(std::abs(uhv), 1.0));
}

TEST_CASE("finite-difference HVP agrees with the exact one on smooth models", "[engine]") {
  SECTION("float64 MLP and GPT") {
    for (const auto& config : {tiny_mlp_config(), tiny_gpt_config()}) {
      auto model = make_model(config, ModelInit{3, at::kDouble});
      ProbeSet probe = config.arch() == "mlp" ? mlp_probe(4, 32, 32) : gpt_probe(4, 8, 8);
      CurvatureEngine engine(*model, probe);
      ParamVector v = random_direction(*model, 9);
      const double err = relative_error(engine.hvp_finite_difference(v), engine.hvp_exact(v));
      INFO(config.describe() << ": relative error " << err);
      CHECK(err <= 1e-7);
    }
  }
  SECTION("float32 GPT, looser as rounding allows") {
    auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kFloat});
    CurvatureEngine engine(*model, gpt_probe(4, 8, 8));
    ParamVector v = random_direction(*model, 9);
    const double err = relative_error(engine.hvp_finite_difference(v), engine.hvp_exact(v));
    INFO("relative error " << err);
    CHECK(err <= 5e-3);
  }
  SECTION("the FD method is selectable through the options") {
    QuadraticObjective q(1);
    EngineOptions options;
    options.hvp_method = HvpMethod::kFiniteDifference;
    CurvatureEngine engine(q, dummy_probe(1, 1), options);
    ParamVector v = random_direction(q, 2);
    // Central differences are exact on a quadratic up to rounding.
    CHECK(relative_error(engine.hvp(v), engine.hvp_exact(v)) <= 1e-9);
  }
}

TEST_CASE("HVP over three uneven batches equals the HVP on their concatenation", "[engine]") {
  auto model = make_model(tiny_mlp_config(), ModelInit{8, at::kDouble});
  ProbeSet whole = mlp_probe(3, 23, 0);
  std::vector<Batch> parts;
  const auto& all = whole[0];
  int64_t start = 0;
  for (int64_t len : {5, 11, 7}) {
    parts.push_back(Batch{all.inputs.narrow(0, start, len), all.targets.narrow(0, start, len)});
    start += len;
  }
  CurvatureEngine one(*model, whole);
  ParamVector v = random_direction(*model, 4);
  ParamVector expected = one.hvp(v);
  const double expected_loss = one.loss();
  CurvatureEngine three(*model, ProbeSet(parts));
  CHECK(relative_error(three.hvp(v), expected) <= 1e-13);
  CHECK(three.loss() == Approx(expected_loss).epsilon(1e-14));
  CHECK(relative_error(three.gradient(), one.gradient()) <= 1e-13);
}

TEST_CASE("graph-reused HVPs equal recomputed ones", "[engine]") {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    auto model = make_model(tiny_gpt_config(), ModelInit{6, dtype});
    ProbeSet probe = gpt_probe(5, 9, 4);
    EngineOptions reuse, recompute, partial;
    recompute.reuse_graph = false;
    partial.max_kept_graphs = 1;
    CurvatureEngine a(*model, probe, reuse), b(*model, probe, recompute), c(*model, probe, partial);
    for (uint64_t seed : {1, 2, 3}) {
      ParamVector v = random_direction(*model, seed);
      ParamVector ha = a.hvp(v), hb = b.hvp(v), hc = c.hvp(v);
      CHECK(relative_error(ha, hb) <= 1e-12);
      CHECK(relative_error(hc, hb) <= 1e-12);
    }
    CHECK(a.kept_graphs() == 3);
    CHECK(b.kept_graphs() == 0);
    CHECK(c.kept_graphs() == 1);
    // Reuse: one forward + first backward per batch, then one second backward per batch and HVP.
    CHECK(a.counters().forwards == 3);
    CHECK(a.counters().second_backwards == 9);
    CHECK(b.counters().forwards == 3 + 9);
  }
}

TEST_CASE("loss_at restores the parameters exactly and keeps graphs valid", "[engine]") {
  QuadraticObjective q(3);
  CurvatureEngine engine(q, dummy_probe(4, 4));
  ParamVector before = engine.parameters();
  ParamVector u = random_direction(q, 5);
  ParamVector hu = engine.hvp(u);
  // Realized change on a quadratic equals g·u + ½uᵀHu exactly.
  const double predicted = dot(engine.gradient(), u) + 0.5 * dot(u, hu);
  const double realized = engine.loss_at(u) - engine.loss();
  CHECK(realized == Approx(predicted).epsilon(1e-12));
  ParamVector after = engine.parameters();
  for (size_t i = 0; i < before.size(); ++i) CHECK(at::equal(before[i], after[i]));
  CHECK(relative_error(engine.hvp(u), hu) == 0.0);
}

TEST_CASE("NaN in the loss stops with NumericalError and a hint", "[engine]") {
  auto model = make_model(tiny_mlp_config(), ModelInit{1, at::kDouble});
  ParamVector theta = snapshot_parameters(*model);
  theta[0][0][0] = std::numeric_limits<double>::quiet_NaN();
  load_parameters(*model, theta);
  CurvatureEngine engine(*model, mlp_probe(1, 4, 4));
  CURV_CHECK_THROWS(engine.loss(), NumericalError,
                    Catch::Matchers::Contains("NaN") && Catch::Matchers::Contains("hint"));
}

TEST_CASE("a batch that does not fit the model is a ModelError naming the shapes", "[engine]") {
  auto mlp = make_model(tiny_mlp_config(), ModelInit{1, at::kDouble});
  auto x = at::randn({4, 7}, at::kDouble);
  auto y = at::zeros({4}, at::kLong);
  CurvatureEngine engine(*mlp, ProbeSet::split(x, y, 4));
  CURV_CHECK_THROWS(engine.loss(), ModelError, Catch::Matchers::Contains("[4, 7]"));

  auto gpt = make_model(tiny_gpt_config(), ModelInit{1, at::kDouble});
  auto tokens = at::full({2, 4}, 9, at::kLong);  // vocabulary is 5
  CurvatureEngine bad_tokens(*gpt, ProbeSet::split(tokens, tokens, 2));
  CURV_CHECK_THROWS(bad_tokens.loss(), ModelError, Catch::Matchers::Contains("vocabulary"));
  CHECK_THROWS_AS(ProbeSet::split(at::zeros({3, 2}), at::zeros({4}), 2), InvalidArgument);
}

TEST_CASE("a loss without double backward, or without a gradient, is a ModelError", "[engine]") {
  // multi_margin_loss's backward has no derivative in ATen (torch 1.13 to 2.15; grid_sampler_2d's,
  // used here before, has one in torch 2.15): the gradient exists, the HVP does not.
  struct MultiMargin : Objective {
    MultiMargin() : p{at::randn({3, 4}, at::kDouble).set_requires_grad(true)}, s({"scores"}, p) {}
    const ParamSpace& space() const override { return s; }
    ParamVector parameters() override { return p; }
    at::Tensor loss(const Batch&) override {
      return at::multi_margin_loss(p[0], at::arange(3, at::kLong), 1, 1.0);
    }
    std::string describe() const override { return "multi-margin"; }
    ParamVector p;
    ParamSpace s;
  } multi_margin;
  CurvatureEngine engine(multi_margin, dummy_probe(2, 2));
  CHECK_NOTHROW(engine.gradient());
  CURV_CHECK_THROWS(engine.hvp(random_direction(multi_margin, 1)), ModelError,
                    Catch::Matchers::Contains("twice differentiable"));

  // A loss that does not depend on the parameters has no gradient graph at all.
  struct Detached : Objective {
    Detached() : p{at::ones({3}, at::kDouble).set_requires_grad(true)}, s({"p"}, p) {}
    const ParamSpace& space() const override { return s; }
    ParamVector parameters() override { return p; }
    at::Tensor loss(const Batch&) override { return (p[0].detach() * 2).sum(); }
    std::string describe() const override { return "detached"; }
    ParamVector p;
    ParamSpace s;
  } detached;
  CurvatureEngine detached_engine(detached, dummy_probe(2, 2));
  CURV_CHECK_THROWS(detached_engine.gradient(), ModelError, Catch::Matchers::Contains("detached"));
}

TEST_CASE("engine options are validated", "[engine]") {
  EngineOptions options;
  options.max_kept_graphs = -1;
  CURV_CHECK_THROWS(options.validate(), InvalidArgument,
                    Catch::Matchers::Contains("max_kept_graphs"));
  CHECK(parse_hvp_method("fd") == HvpMethod::kFiniteDifference);
  CHECK_THROWS_AS(parse_hvp_method("approx"), InvalidArgument);
}

TEST_CASE("an HVP restricted to a block's support equals the zero-padded HVP", "[engine]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{4, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(3, 6, 4));
  const int64_t n = engine.space().numel();
  const Eigen::MatrixXd h = dense_hessian(engine);
  const ParamVector u = random_direction(*model, 31);
  const BlockPartition blocks = BlockPartition::by_rule(engine.space(), BlockRule::kLayer);
  REQUIRE(blocks.size() >= 3);
  ParamVector total;
  for (const auto& block : blocks.blocks()) {
    // Outside the support the direction is undefined: the engine must not read it.
    ParamVector sparse(u.size());
    for (size_t i : block.params) sparse[i] = u[i];
    const ParamVector restricted = engine.hvp(sparse, block.params);
    const ParamVector padded = engine.hvp(masked(u, block.params));
    INFO("block " << block.name);
    CHECK(relative_error(restricted, padded) <= 1e-12);
    CHECK(relative(flat(restricted, n), h * flat(masked(u, block.params), n)) <= 1e-10);
    if (total.empty()) {
      total = restricted;
    } else {
      axpy(1.0, restricted, total);
    }
  }
  // By linearity the blocks' HVPs add up to H u.
  CHECK(relative_error(total, engine.hvp(u)) <= 1e-12);
  // The finite-difference method pads the direction itself.
  EngineOptions fd;
  fd.hvp_method = HvpMethod::kFiniteDifference;
  CurvatureEngine fd_engine(*model, gpt_probe(3, 6, 4), fd);
  const auto& first = blocks.blocks().front();
  ParamVector sparse(u.size());
  for (size_t i : first.params) sparse[i] = u[i];
  CHECK(relative_error(fd_engine.hvp(sparse, first.params), engine.hvp(masked(u, first.params))) <=
        1e-6);
  CHECK_THROWS_AS(engine.hvp(sparse, {u.size()}), InvalidArgument);
  ParamVector missing(u.size());
  CHECK_THROWS_WITH(engine.hvp(missing, first.params), Catch::Contains("undefined"));
}

TEST_CASE("an HVP formed on target parameters equals the full product there and is zero elsewhere",
          "[engine]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{4, at::kDouble});
  const ProbeSet probe = gpt_probe(3, 6, 4);
  CurvatureEngine engine(*model, probe);
  EngineOptions fd;
  fd.hvp_method = HvpMethod::kFiniteDifference;
  CurvatureEngine fd_engine(*model, probe, fd);
  const ParamVector u = random_direction(*model, 31);
  const BlockPartition blocks = BlockPartition::by_rule(engine.space(), BlockRule::kLayer);
  REQUIRE(blocks.size() >= 3);
  const std::vector<size_t>& support = blocks[1].params;
  // Targets below, at and above the support's layer, unsorted and with a repeat.
  std::vector<size_t> targets = blocks.blocks().back().params;
  targets.insert(targets.end(), blocks[0].params.begin(), blocks[0].params.end());
  targets.push_back(support.front());
  targets.push_back(support.front());
  std::vector<bool> is_target(u.size(), false);
  for (size_t i : targets) is_target[i] = true;

  for (CurvatureEngine* e : {&engine, &fd_engine}) {
    const bool exact = e == &engine;
    INFO((exact ? "exact" : "finite differences"));
    const ParamVector full = e->hvp(masked(u, support));
    // The observer sees each batch's product on the targets only; their weighted sum is the result.
    ParamVector observed_sum = zeros_like(u);
    const ParamVector part = e->hvp(masked(u, support), support, targets, [&](const BatchTerms& t) {
      for (size_t i = 0; i < u.size(); ++i) {
        const at::Tensor& hv = (*t.hvp)[i];
        if (!hv.defined()) continue;
        if (!is_target[i]) CHECK(hv.abs().max().item<double>() == 0.0);
        observed_sum[i].add_(hv, t.weight);
      }
    });
    CHECK(relative_error(observed_sum, part) <= 1e-12);
    for (size_t i = 0; i < u.size(); ++i) {
      INFO(engine.space()[i].name);
      REQUIRE(part[i].defined());
      if (is_target[i]) {
        const double scale = std::max(1e-12, full[i].abs().max().item<double>());
        CHECK((part[i] - full[i]).abs().max().item<double>() <= (exact ? 1e-12 : 1e-9) * scale);
      } else {
        CHECK(part[i].abs().max().item<double>() == 0.0);
      }
    }
  }
  CHECK_THROWS_AS(engine.hvp(u, support, {u.size()}), InvalidArgument);
}

TEST_CASE("a memory budget keeps graphs while resident memory allows and recomputes the rest",
          "[engine]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{6, at::kDouble});
  const ProbeSet probe = gpt_probe(3, 6, 4);
  const ParamVector v = random_direction(*model, 41);
  CurvatureEngine unbounded(*model, probe);
  const ParamVector expected = unbounded.hvp(v);
  REQUIRE(unbounded.kept_graphs() == probe.size());

  EngineOptions tight;
  tight.max_memory = 1;  // below any process: no graph is kept
  CurvatureEngine engine(*model, probe, tight);
  CHECK(relative_error(engine.hvp(v), expected) <= 1e-12);
  CHECK(relative_error(engine.hvp(v), expected) <= 1e-12);
  CHECK(engine.kept_graphs() == 0);
  CHECK(engine.counters().graphs_over_budget == 1);  // the first graph; later batches try none
  CHECK(engine.counters().gradients == 1);           // the gradient is not recomputed per HVP
  CHECK(engine.counters().forwards == static_cast<int64_t>(3 * probe.size()));
  CHECK_THAT(engine.counters().brief(), Catch::Contains("1 graphs not kept (memory budget)"));

  EngineOptions roomy;
  roomy.max_memory = int64_t{1} << 50;
  CurvatureEngine all(*model, probe, roomy);
  CHECK(relative_error(all.hvp(v), expected) <= 1e-12);
  CHECK(all.kept_graphs() == probe.size());

  // The budget holds during HVPs too: once the resident set grows past it (here by a tensor
  // allocated after the graphs were kept), the next HVP releases every kept graph.
  EngineOptions later;
  later.max_memory = resident_bytes() + (int64_t{256} << 20);
  CurvatureEngine growing(*model, probe, later);
  CHECK(relative_error(growing.hvp(v), expected) <= 1e-12);
  REQUIRE(growing.kept_graphs() == probe.size());
  const at::Tensor ballast = at::ones({int64_t{512} << 17}, at::kDouble);  // 512 MiB, touched
  CHECK(relative_error(growing.hvp(v), expected) <= 1e-12);
  CHECK(growing.kept_graphs() == 0);
  CHECK(growing.counters().graphs_over_budget == static_cast<int64_t>(probe.size()));
  CHECK(ballast.sum().item<double>() > 0);

  EngineOptions negative;
  negative.max_memory = -1;
  CHECK_THROWS_WITH(CurvatureEngine(*model, probe, negative), Catch::Contains("max_memory"));

  // A device's figure as EngineOptions::memory_probe gives it (what the CUDA allocator's
  // statistics give on a GPU): the budget is read from it, not from the host's resident set.
  // Simulated: the device holds 1 GiB until two graphs are kept, then 3 GiB.
  int64_t device_bytes = int64_t{1} << 30;
  EngineOptions device;
  device.max_memory = int64_t{2} << 30;
  device.memory_probe = [&] { return device_bytes; };
  CurvatureEngine budgeted(*model, probe, device);
  CHECK(relative_error(budgeted.hvp(v), expected) <= 1e-12);
  CHECK(budgeted.kept_graphs() == probe.size());
  device_bytes = int64_t{3} << 30;
  CHECK(relative_error(budgeted.hvp(v), expected) <= 1e-12);
  CHECK(budgeted.kept_graphs() == 0);
  CHECK(budgeted.counters().graphs_over_budget == static_cast<int64_t>(probe.size()));
  CHECK(relative_error(budgeted.hvp(v), expected) <= 1e-12);
  CHECK(budgeted.counters().graphs_over_budget == static_cast<int64_t>(probe.size()));
}

TEST_CASE("an allocation failure in a pass is one OutOfMemory naming the pass, batch and flags",
          "[engine][memory]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{6, at::kDouble});
  const ProbeSet probe = gpt_probe(3, 6, 4);
  // The gradient pass runs; the loss at θ + u fails on its second batch.
  ExhaustingObjective exhausting(*model, static_cast<int64_t>(probe.size()) + 1);
  CurvatureEngine engine(exhausting, probe);
  CHECK(std::isfinite(engine.loss()));  // the gradient pass fits
  try {
    engine.loss_at(random_direction(*model, 3));
    FAIL("no error");
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    CHECK_THAT(what,
               Catch::Contains("ran out of cpu memory in the loss at θ + u of probe batch 1"));
    CHECK_THAT(what, Catch::Contains("in use"));
    CHECK_THAT(what, Catch::Contains("EngineOptions.micro_batch"));
    CHECK_THAT(what, Catch::Contains("Tried to allocate 2.00 GiB"));
    CHECK(what.find('\n') == std::string::npos);
  }
  CHECK(engine.kept_graphs() == 0);  // released on the way out
}

TEST_CASE("micro-batches give each batch's loss gradient and HVP of the whole batch",
          "[engine][micro_batch]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{8, at::kDouble});
  // Two probe batches of 5 sequences; slices of 2 leave a last slice of 1.
  ProbeSet probe = gpt_probe(4, 10, 5);
  SECTION("every target counted") {}
  SECTION("some targets ignored, the rest averaged over") {
    // A mean cross-entropy averages over the targets that are not ignored: slices weigh their
    // count of those, not their sequences.
    std::vector<Batch> batches;
    for (size_t b = 0; b < probe.size(); ++b) {
      Batch batch = probe[b];
      batch.targets = batch.targets.clone();
      batch.targets.index_put_({0}, kIgnoreIndex);  // the first sequence ignored whole
      batch.targets.index_put_({3, 1}, kIgnoreIndex);
      batches.push_back(batch);
    }
    probe = ProbeSet(batches);
  }
  const ParamVector v = random_direction(*model, 51), u = random_direction(*model, 52);
  CurvatureEngine whole(*model, probe);
  EngineOptions sliced_options;
  sliced_options.micro_batch = 2;
  CurvatureEngine sliced(*model, probe, sliced_options);

  CHECK(sliced.loss() == Approx(whole.loss()).epsilon(1e-13));
  for (size_t b = 0; b < probe.size(); ++b) {
    CHECK(sliced.batch_losses()[b] == Approx(whole.batch_losses()[b]).epsilon(1e-13));
  }
  CHECK(relative_error(sliced.gradient(), whole.gradient()) <= 1e-13);
  // Per-batch terms as an observer sees them.
  std::vector<ParamVector> whole_hv(probe.size()), sliced_hv(probe.size()), whole_g(probe.size()),
      sliced_g(probe.size());
  const ParamVector hv_whole = whole.hvp(v, [&](const BatchTerms& t) {
    whole_hv[t.batch] = clone(*t.hvp);
    whole_g[t.batch] = clone(*t.gradient);
  });
  const ParamVector hv_sliced = sliced.hvp(v, [&](const BatchTerms& t) {
    sliced_hv[t.batch] = clone(*t.hvp);
    sliced_g[t.batch] = clone(*t.gradient);
  });
  CHECK(relative_error(hv_sliced, hv_whole) <= 1e-12);
  for (size_t b = 0; b < probe.size(); ++b) {
    CHECK(relative_error(sliced_hv[b], whole_hv[b]) <= 1e-12);
    CHECK(relative_error(sliced_g[b], whole_g[b]) <= 1e-12);
  }
  // Graphs are kept per slice: 3 per batch.
  CHECK(sliced.kept_graphs() == 2 * 3);
  CHECK(whole.kept_graphs() == 2);
  CHECK(relative_error(sliced.hvp(v), hv_whole) <= 1e-12);  // reusing the slices' graphs
  const BlockPartition blocks = BlockPartition::by_rule(sliced.space(), BlockRule::kLayer);
  const auto& first = blocks.blocks().front();
  CHECK(relative_error(sliced.hvp(masked(v, first.params), first.params),
                       whole.hvp(masked(v, first.params), first.params)) <= 1e-12);
  std::vector<double> whole_after, sliced_after;
  CHECK(sliced.loss_at(u, &sliced_after) == Approx(whole.loss_at(u, &whole_after)).epsilon(1e-13));
  CHECK(sliced_after[1] == Approx(whole_after[1]).epsilon(1e-13));
  std::vector<std::vector<size_t>> supports;
  for (const auto& block : blocks.blocks()) supports.push_back(block.params);
  const Eigen::MatrixXd gn_whole = whole.gauss_newton(u, supports);
  CHECK((sliced.gauss_newton(u, supports) - gn_whole).norm() <= 1e-12 * gn_whole.norm());

  // Without kept graphs (a memory budget below any process) and with finite differences.
  sliced_options.max_memory = 1;
  CurvatureEngine budget(*model, probe, sliced_options);
  CHECK(relative_error(budget.hvp(v), hv_whole) <= 1e-12);
  CHECK(budget.kept_graphs() == 0);
  sliced_options.max_memory = 0;
  sliced_options.max_kept_graphs = 4;
  CurvatureEngine capped(*model, probe, sliced_options);
  CHECK(relative_error(capped.hvp(v), hv_whole) <= 1e-12);
  CHECK(capped.kept_graphs() == 4);
  EngineOptions fd;
  fd.hvp_method = HvpMethod::kFiniteDifference;
  CurvatureEngine fd_whole(*model, probe, fd);
  fd.micro_batch = 2;
  CurvatureEngine fd_sliced(*model, probe, fd);
  CHECK(relative_error(fd_sliced.hvp(v), fd_whole.hvp(v)) <= 1e-9);

  EngineOptions negative;
  negative.micro_batch = -1;
  CHECK_THROWS_WITH(CurvatureEngine(*model, probe, negative), Catch::Contains("micro_batch"));
}
