#include "curv/core/linear_operator.h"

#include <ATen/ATen.h>
#include <Spectra/SymEigsSolver.h>

#include <Eigen/Eigenvalues>
#include <catch2/catch.hpp>

#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/spectra_adapter.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

TEST_CASE("Spectra finds the extreme eigenvalues of a DenseOperator through the adapter",
          "[linear_operator]") {
  Eigen::MatrixXd m = Eigen::MatrixXd::Random(40, 40);
  Eigen::MatrixXd a = (m + m.transpose()) / 2;
  DenseOperator op(a);
  SpectraOperator adapter(op);
  Spectra::SymEigsSolver<SpectraOperator> solver(adapter, 3, 12);
  solver.init();
  solver.compute(Spectra::SortRule::LargestAlge, 1000, 1e-12);
  REQUIRE(solver.info() == Spectra::CompInfo::Successful);
  Eigen::VectorXd exact = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(a).eigenvalues();
  for (int i = 0; i < 3; ++i)
    CHECK(solver.eigenvalues()[i] == Approx(exact[39 - i]).epsilon(1e-10));
  CHECK(op.num_applies() > 0);
}

TEST_CASE("HessianOperator restricted to parameters is the principal sub-matrix",
          "[linear_operator]") {
  auto model = make_model(tiny_mlp_config(), ModelInit{2, at::kDouble});
  CurvatureEngine engine(*model, mlp_probe(3, 20, 7));
  Eigen::MatrixXd h = dense_hessian(engine);
  HessianOperator whole(engine);
  CHECK((to_dense(whole) - h).norm() <= 1e-10 * h.norm());
  // Parameters 2 and 0 (layers.1.weight, layers.0.weight), in that order.
  HessianOperator sub(engine, {2, 0});
  const auto& space = engine.space();
  std::vector<int64_t> index;
  for (size_t p : {size_t{2}, size_t{0}}) {
    for (int64_t k = 0; k < space[p].numel; ++k) index.push_back(space[p].offset + k);
  }
  Eigen::MatrixXd expected(index.size(), index.size());
  for (size_t r = 0; r < index.size(); ++r)
    for (size_t c = 0; c < index.size(); ++c) expected(r, c) = h(index[r], index[c]);
  CHECK(sub.rows() == static_cast<int64_t>(index.size()));
  CHECK((to_dense(sub) - expected).norm() <= 1e-10 * expected.norm());
  CURV_CHECK_THROWS(HessianOperator(engine, {0, 2, 0}), InvalidArgument,
                    Catch::Matchers::Contains("listed twice"));
}

TEST_CASE("HessianOperator on each layer block of a tied GPT is its principal sub-matrix",
          "[linear_operator]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{3, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(2, 6, 4));
  const Eigen::MatrixXd h = dense_hessian(engine);
  const auto& space = engine.space();
  const BlockPartition blocks = BlockPartition::by_rule(space, BlockRule::kLayer);
  REQUIRE(blocks.size() >= 3);
  for (const Block& b : blocks.blocks()) {
    INFO(b.name);
    HessianOperator sub(engine, b.params);
    std::vector<int64_t> index;
    for (size_t p : b.params) {
      for (int64_t k = 0; k < space[p].numel; ++k) index.push_back(space[p].offset + k);
    }
    Eigen::MatrixXd expected(index.size(), index.size());
    for (size_t r = 0; r < index.size(); ++r)
      for (size_t c = 0; c < index.size(); ++c) expected(r, c) = h(index[r], index[c]);
    CHECK((to_dense(sub) - expected).norm() <= 1e-10 * expected.norm());
  }
}

TEST_CASE("apply_add adds the product into y's own memory", "[linear_operator]") {
  Eigen::MatrixXd m = Eigen::MatrixXd::Random(6, 6);
  DenseOperator dense((m + m.transpose()) / 2);
  const at::Tensor x = at::randn({6}, at::kDouble), y0 = at::randn({6}, at::kDouble);
  at::Tensor y = y0.clone();
  const void* memory = y.data_ptr();
  dense.apply_add(x, y);
  CHECK(y.data_ptr() == memory);
  CHECK(at::allclose(y, y0 + dense.apply(x), 1e-14, 1e-14));
  CHECK(dense.num_applies() == 2);
  CURV_CHECK_THROWS(dense.apply_add(x, x), InvalidArgument, Catch::Matchers::Contains("share"));
  at::Tensor narrow = y.to(at::kFloat);
  CURV_CHECK_THROWS(dense.apply_add(x, narrow), InvalidArgument,
                    Catch::Matchers::Contains("apply_add: y is a Float"));
  // The Hessian, whole and on a sub-matrix, by whole-graph, layer-wise and finite-difference
  // products: the engine adds each share into y's views.
  const ModelConfig llama = ModelConfig::from_json(
      R"({"arch": "llama", "vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
          "max_position_embeddings": 8, "tie_word_embeddings": true})");
  auto model = make_model(llama, ModelInit{4, at::kDouble});
  const ProbeSet probe = gpt_probe(3, 6, 3, 11, 5);
  for (const int route : {0, 1, 2}) {
    INFO((route == 0 ? "whole graph" : route == 1 ? "layer-wise" : "finite differences"));
    EngineOptions options;
    options.recompute_layers = route == 1;
    if (route == 2) options.hvp_method = HvpMethod::kFiniteDifference;
    CurvatureEngine engine(*model, probe, options);
    for (const std::vector<size_t>& params : {std::vector<size_t>{}, std::vector<size_t>{3, 0}}) {
      HessianOperator h(engine, params);
      const at::Tensor hx = at::randn({h.rows()}, at::kDouble);
      const at::Tensor start = at::randn({h.rows()}, at::kDouble);
      at::Tensor sum = start.clone();
      h.apply_add(hx, sum);
      const at::Tensor want = start + h.apply(hx);
      CHECK((sum - want).norm().item<double>() <= 1e-13 * want.norm().item<double>());
    }
  }
}
