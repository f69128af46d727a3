#include "curv/core/param_space.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "curv/core/blocks.h"
#include "curv/core/error.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;

TEST_CASE("ParamSpace records names, shapes and flat offsets", "[param_space]") {
  ParamVector like = {at::zeros({2, 3}), at::zeros({4}), at::zeros({})};
  ParamSpace space({"a.weight", "a.bias", "scale"}, like);
  CHECK(space.size() == 3);
  CHECK(space.numel() == 11);
  CHECK(space[1].offset == 6);
  CHECK(space[2].numel == 1);
  CHECK(space.index("scale") == 2);
  CURV_CHECK_THROWS(space.index("a.weigth"), InvalidArgument,
                    Catch::Matchers::Contains("did you mean 'a.weight'"));
  CHECK_THROWS_AS(ParamSpace({"x", "x"}, {at::zeros({1}), at::zeros({1})}), InvalidArgument);
}

TEST_CASE("vector operations accumulate in float64 and round-trip through flat buffers",
          "[param_space]") {
  ParamVector a = {at::arange(6, at::kFloat).reshape({2, 3}), at::full({2}, 0.5, at::kDouble)};
  ParamVector b = {at::ones({2, 3}, at::kFloat), at::full({2}, 2.0, at::kDouble)};
  CHECK(dot(a, b) == 15.0 + 2.0);
  CHECK(dot(a, b, {1}) == 2.0);
  CHECK(squared_norm(b) == 6.0 + 8.0);
  ParamVector y = clone(b);
  axpy(2.0, a, y);
  CHECK(y[0][1][2].item<float>() == 11.0f);
  ParamVector m = masked(a, {0});
  CHECK(m[1].abs().sum().item<double>() == 0.0);

  ParamSpace space({"a", "b"}, a);
  std::vector<double> buffer(space.numel());
  to_flat(a, buffer.data());
  CHECK(buffer[5] == 5.0);
  CHECK(buffer[6] == 0.5);
  ParamVector back = from_flat(buffer.data(), space, a);
  CHECK(back[0].scalar_type() == at::kFloat);
  CHECK(at::equal(back[0], a[0]));
  CHECK(at::equal(back[1], a[1]));
}

TEST_CASE("per-tensor dots equal dot() bit for bit, undefined tensors counting as zero",
          "[param_space]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  ParamVector a, b;
  for (int64_t n : {1000, 7, 33, 4096}) {
    a.push_back(at::randn({n}, gen, at::kFloat));
    b.push_back(at::randn({n}, gen, at::kFloat));
  }
  b[2] = at::Tensor();  // a parameter a pass did not reach
  const std::vector<double> all = dots_per_tensor(a, b);
  REQUIRE(all.size() == 4);
  CHECK(all[2] == 0.0);
  // Each entry is the float64 dot of that tensor, its float32 products exact, summed in float64.
  const double exact0 = at::sum(a[0].to(at::kDouble) * b[0].to(at::kDouble)).item<double>();
  CHECK(std::abs(all[0] - exact0) <= 1e-14 * std::abs(exact0));
  double total = 0.0;
  for (double v : all) total += v;
  CHECK(dot(a, b) == total);
  const std::vector<size_t> block = {3, 0};
  CHECK(sum_over(all, block) == dot(a, b, block));
  // Restricted to indices: the others are left at zero.
  const std::vector<double> some = dots_per_tensor(a, b, &block);
  CHECK(some[0] == all[0]);
  CHECK(some[3] == all[3]);
  CHECK(some[1] == 0.0);
  CHECK_THROWS_AS(dots_per_tensor(a, {b[0]}), InvalidArgument);
  CHECK(all_finite(a));
  a[1][3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(all_finite(a));
}

TEST_CASE("blocks by layer follow nanoGPT names: embeddings, layers, head", "[blocks]") {
  auto config = ModelConfig::from_json(R"({"arch": "gpt", "n_layer": 3, "n_head": 2, "n_embd": 8,
                                          "vocab_size": 11, "block_size": 4, "tied": false})");
  auto model = make_model(config, ModelInit{0, at::kFloat});
  auto blocks = BlockPartition::by_rule(model->space(), BlockRule::kLayer);
  REQUIRE(blocks.names() == std::vector<std::string>{"embeddings", "transformer.h.0",
                                                     "transformer.h.1", "transformer.h.2", "head"});
  CHECK(blocks[0].params.size() == 2);   // wte, wpe
  CHECK(blocks[1].params.size() == 12);  // ln_1, c_attn, c_proj, ln_2, c_fc, c_proj (w + b)
  CHECK(blocks[4].params.size() == 3);   // ln_f weight + bias, lm_head
  size_t covered = 0;
  for (const auto& b : blocks.blocks()) covered += b.params.size();
  CHECK(covered == model->space().size());

  CHECK(BlockPartition::by_rule(model->space(), BlockRule::kTensor).size() ==
        model->space().size());
  CHECK(BlockPartition::by_rule(model->space(), BlockRule::kWhole).size() == 1);

  auto groups = BlockPartition::by_regex(model->space(),
                                         {{"attention", R"(\.attn\.)"}, {"mlp", R"(\.mlp\.)"}});
  CHECK(groups.names() == std::vector<std::string>{"attention", "mlp", "rest"});
  CHECK(groups[0].params.size() == 12);
  CURV_CHECK_THROWS(BlockPartition::by_regex(model->space(), {{"none", "conv"}}), InvalidArgument,
                    Catch::Matchers::Contains("none"));
  CHECK_THROWS_AS(BlockPartition::by_regex(model->space(), {{"bad", "("}}), InvalidArgument);
  CHECK_THROWS_AS(BlockPartition::parse_rule("layers"), InvalidArgument);
}

TEST_CASE("per-tensor dots are float64 sums that do not depend on the thread count",
          "[param_space]") {
  // 3 chunks of 2^14 and a tail; float32 and float64, and the two mixed.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const int64_t n = 3 * 16384 + 1001;
  const at::Tensor x = at::randn({n}, gen, at::kFloat), y = at::randn({n}, gen, at::kFloat);
  const at::Tensor xd = x.to(at::kDouble), yd = y.to(at::kDouble);
  // A long double sum of the exact products in index order: the reference.
  long double reference = 0.0L;
  const double* px = xd.data_ptr<double>();
  const double* py = yd.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) reference += static_cast<long double>(px[i]) * py[i];
  const int threads = at::get_num_threads();
  for (const auto& [a, b] :
       std::vector<std::pair<at::Tensor, at::Tensor>>{{x, y}, {xd, yd}, {x, yd}, {xd, y}}) {
    at::set_num_threads(1);
    const double one = dots_per_tensor({a}, {b})[0];
    at::set_num_threads(2);
    const double two = dots_per_tensor({a}, {b})[0];
    at::set_num_threads(threads);
    CHECK(one == two);
    CHECK(std::abs(one - static_cast<double>(reference)) <= 1e-13 * std::abs(one));
  }
  // Non-contiguous operands are read in their logical order.
  const at::Tensor m = at::randn({64, 48}, gen, at::kFloat);
  const double t = dots_per_tensor({m.t()}, {m.t().contiguous()})[0];
  CHECK(std::abs(t - at::sum(m.to(at::kDouble).pow(2)).item<double>()) <= 1e-13 * t);
}
