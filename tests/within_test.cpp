#include "curv/analysis/within.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

// The dense quadratic form dᵀHd of a direction living in one parameter.
double dense_form(const Eigen::MatrixXd& h, const ParamSpace& space, size_t index,
                  const at::Tensor& value) {
  Eigen::VectorXd d = Eigen::VectorXd::Zero(space.numel());
  auto flat = value.to(at::kDouble).contiguous().view(-1);
  for (int64_t k = 0; k < flat.numel(); ++k) d[space[index].offset + k] = flat[k].item<double>();
  return d.dot(h * d);
}

}  // namespace

TEST_CASE("singular-mode curvature equals the dense quadratic form of a_i b_iᵀ", "[within]") {
  auto config = tiny_gpt_config();
  auto model = make_model(config, ModelInit{4, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(6, 6, 3));
  Eigen::MatrixXd h = dense_hessian(engine);
  ParamVector u = random_direction(*model, 12);
  WithinOptions options;
  options.modes = 3;
  options.n_head = config.as<GptConfig>().n_head;
  WithinReport report = within_block(engine, u, options);
  const auto& space = engine.space();
  // Every 2-D matrix of the layer, none of the embeddings or head.
  std::vector<std::string> names;
  for (const auto& p : report.params) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{
                     "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight",
                     "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"});
  for (const auto& p : report.params) {
    const size_t index = space.index(p.name);
    auto svd = at::linalg_svd(u[index], false);
    REQUIRE(p.modes.size() == 3);
    double energy = 0;
    for (double s : p.singular_values) energy += s * s;
    CHECK(energy == Approx(p.sq_norm).epsilon(1e-12));
    for (const auto& m : p.modes) {
      at::Tensor mode =
          at::outer(std::get<0>(svd).select(1, m.index), std::get<2>(svd).select(0, m.index));
      const double dense = dense_form(h, space, index, mode);
      INFO(p.name << " mode " << m.index << ": κ " << m.curvature << ", dense " << dense);
      CHECK(std::abs(m.curvature - dense) <= 1e-10 * std::max(1.0, std::abs(dense)));
      CHECK(m.sigma == Approx(std::get<1>(svd)[m.index].item<double>()).epsilon(1e-12));
    }
    CHECK(p.svd_entropy > 0.0);
    CHECK(p.svd_entropy <= 1.0 + 1e-12);
    CHECK(p.effective_rank >= 1.0);
  }
  // Head groups: c_attn has q, k, v and 3 x n_head head slices; c_proj has n_head column groups.
  const auto& attn = report.params[0];
  REQUIRE(attn.groups.size() == 3 + 3 * 2);
  CHECK(attn.groups[0].name == "q");
  CHECK(attn.groups[4].name == "q.head1");
  const size_t attn_index = space.index(attn.name);
  const int64_t C = config.as<GptConfig>().n_embd, hs = C / config.as<GptConfig>().n_head;
  at::Tensor k_head1 = at::zeros_like(u[attn_index]);
  k_head1.slice(0, C + hs, C + 2 * hs).copy_(u[attn_index].slice(0, C + hs, C + 2 * hs));
  const auto& group = attn.groups[3 + 2 + 1];  // k.head1
  CHECK(group.name == "k.head1");
  CHECK(group.curvature == Approx(dense_form(h, space, attn_index, k_head1)).epsilon(1e-10));
  const auto& proj = report.params[1];
  REQUIRE(proj.groups.size() == 2);
  const size_t proj_index = space.index(proj.name);
  at::Tensor head0 = at::zeros_like(u[proj_index]);
  head0.slice(1, 0, hs).copy_(u[proj_index].slice(1, 0, hs));
  CHECK(proj.groups[0].curvature == Approx(dense_form(h, space, proj_index, head0)).epsilon(1e-10));
}

TEST_CASE("isotropy measures of a known spectrum", "[within]") {
  // u = diag(3, 4) in a 2x2 parameter: p = (9/25, 16/25).
  QuadraticObjective q(1);
  CurvatureEngine engine(q, dummy_probe(1, 1));
  ParamVector u = zeros_like(q.parameters());
  u[0] = at::zeros({2, 3}, at::kDouble);
  u[0][0][0] = 3.0;
  u[0][1][1] = 4.0;
  WithinOptions options;
  options.param_regex = "^w$";
  options.top_k_energy = 1;
  WithinReport report = within_block(engine, u, options);
  REQUIRE(report.params.size() == 1);
  const auto& p = report.params[0];
  const double p1 = 16.0 / 25, p2 = 9.0 / 25, h = -(p1 * std::log(p1) + p2 * std::log(p2));
  CHECK(p.effective_rank == Approx(std::exp(h)));
  CHECK(p.svd_entropy == Approx(h / std::log(2.0)));
  CHECK(p.top_k_energy == Approx(p1));
  CHECK(p.modes[0].sigma == Approx(4.0));
}

TEST_CASE("the HVP budget skips parameters and says which", "[within]") {
  auto model = make_model(tiny_gpt_config(), ModelInit{4, at::kDouble});
  CurvatureEngine engine(*model, gpt_probe(6, 4, 4));
  WithinOptions options;
  options.modes = 2;
  options.max_hvps = 5;
  WithinReport report = within_block(engine, random_direction(*model, 1), options);
  CHECK(report.hvps <= 5);
  CHECK(report.params.size() == 2);
  CHECK(report.skipped.size() == 2);
}

namespace {

// Separate LLaMA-style attention projections with grouped-query shapes (4 query heads, 2
// key/value heads of 2 rows) under L = ½ Σ_i c_i ‖θ_i‖², c_i = i + 1: a group's curvature is
// c_i ‖u_g‖², so the groups can be checked exactly. Its structure comes from a mapping.
class GqaObjective : public Objective {
 public:
  GqaObjective() {
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
        {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
        {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
        {"model.layers.0.self_attn.o_proj.weight", {8, 8}}};
    std::vector<std::string> names;
    for (const auto& [name, shape] : shapes) {
      names.push_back(name);
      params_.push_back(at::zeros(shape, at::kDouble).set_requires_grad(true));
    }
    space_ = ParamSpace(names, params_);
  }
  const ParamSpace& space() const override { return space_; }
  ParamVector parameters() override { return params_; }
  at::Tensor loss(const Batch&) override {
    at::Tensor l = at::zeros({}, at::kDouble);
    for (size_t i = 0; i < params_.size(); ++i) l = l + 0.5 * (i + 1.0) * params_[i].square().sum();
    return l;
  }
  std::string describe() const override { return "gqa"; }
  ModelStructure structure() const override {
    return ModelStructure::from_mapping(R"({"n_head": 4, "n_kv_head": 2})", space_, "gqa");
  }

 private:
  ParamVector params_;
  ParamSpace space_;
};

}  // namespace

TEST_CASE("grouped-query heads come from the structure: query, key/value and output heads",
          "[within]") {
  GqaObjective model;
  CurvatureEngine engine(model, dummy_probe(1, 1));
  ParamVector u = random_direction(model, 3);
  WithinOptions options;
  options.modes = 1;
  options.n_head = model.structure().n_head;
  WithinReport report = within_block(engine, u, options);
  REQUIRE(report.params.size() == 4);
  const std::vector<size_t> expected_groups = {4, 2, 2, 4};  // q, k, v by rows; o by columns
  for (size_t i = 0; i < 4; ++i) {
    const auto& p = report.params[i];
    INFO(p.name);
    REQUIRE(p.groups.size() == expected_groups[i]);
    for (size_t g = 0; g < p.groups.size(); ++g) {
      const int64_t lo = 2 * static_cast<int64_t>(g), hi = lo + 2;
      at::Tensor part = i == 3 ? u[i].slice(1, lo, hi) : u[i].slice(0, lo, hi);
      const double sq = part.square().sum().item<double>();
      CHECK(p.groups[g].name == "head" + std::to_string(g));
      CHECK(p.groups[g].sq_norm == Approx(sq).epsilon(1e-12));
      CHECK(p.groups[g].curvature == Approx((i + 1.0) * sq).epsilon(1e-10));
    }
  }
}
