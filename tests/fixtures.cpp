#include "fixtures.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <iterator>

#include "test_support.h"

namespace curv_test {

QuadraticObjective::QuadraticObjective(uint64_t seed, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto opts = at::TensorOptions().dtype(at::kDouble);
  auto m = at::randn({10, 10}, gen, opts);
  a_ = ((m + m.t()) / 2).to(dtype);
  b_ = at::randn({10}, gen, opts).to(dtype);
  params_ = {at::randn({2, 3}, gen, opts).to(dtype).set_requires_grad(true),
             at::randn({4}, gen, opts).to(dtype).set_requires_grad(true)};
  space_ = curv::ParamSpace({"w", "b"}, params_);
}

at::Tensor QuadraticObjective::loss(const curv::Batch&) {
  auto theta = at::cat({params_[0].reshape(-1), params_[1]});
  return 0.5 * at::dot(theta, at::mv(a_, theta)) + at::dot(b_, theta);
}

curv::ProbeSet dummy_probe(int64_t n, int64_t batch_size) {
  auto x = at::zeros({n, 1}, at::kDouble);
  return curv::ProbeSet::split(x, x, batch_size);
}

curv::ModelConfig tiny_mlp_config() {
  return curv::ModelConfig::from_json(
      R"({"arch": "mlp", "sizes": [3, 5, 3], "activation": "tanh", "loss": "cross_entropy"})");
}

curv::ModelConfig tiny_gpt_config() {
  return curv::ModelConfig::from_json(
      R"({"arch": "gpt", "vocab_size": 5, "block_size": 4, "n_layer": 1, "n_head": 2,
          "n_embd": 4, "bias": true, "tied": false})");
}

curv::ProbeSet mlp_probe(uint64_t seed, int64_t n, int64_t batch_size) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = at::randn({n, 3}, gen, at::TensorOptions().dtype(at::kDouble));
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  return curv::ProbeSet::split(x, y, batch_size);
}

curv::ProbeSet gpt_probe(uint64_t seed, int64_t n, int64_t batch_size, int64_t vocab, int64_t t) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(0, vocab, {n, t + 1}, gen, at::TensorOptions().dtype(at::kLong));
  return curv::ProbeSet::split(tokens.narrow(1, 0, t).contiguous(),
                               tokens.narrow(1, 1, t).contiguous(), batch_size);
}

curv::ParamVector random_direction(curv::Objective& objective, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  curv::ParamVector out;
  for (const auto& p : objective.parameters()) {
    out.push_back(at::randn(p.sizes(), gen, at::TensorOptions().dtype(at::kDouble)));
  }
  return out;
}

Eigen::VectorXd flat(const curv::ParamVector& x, int64_t n) {
  Eigen::VectorXd out(n);
  curv::to_flat(x, out.data());
  return out;
}

double relative_error(const curv::ParamVector& a, const curv::ParamVector& b) {
  curv::ParamVector a64, b64;
  for (const auto& t : a) a64.push_back(t.to(at::kDouble));
  for (const auto& t : b) b64.push_back(t.to(at::kDouble));
  return curv::norm(curv::sub(a64, b64)) / std::max(curv::norm(b64), 1e-300);
}

c10::impl::GenericDict load_pickled_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::jit::pickle_load(bytes).toGenericDict();
}

curv::ProbeSet load_script_fixture_probe(const std::string& dir) {
  auto ref = load_pickled_dict(dir + "/reference.pt");
  return curv::ProbeSet({curv::Batch{ref.at("x").toTensor(), ref.at("y").toTensor()}});
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

at::Tensor tokens_of(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) {
    for (const auto& t : row) flat.push_back(t.get<int64_t>());
  }
  return at::tensor(flat, at::kLong).reshape({static_cast<int64_t>(rows.size()), -1});
}

at::Tensor ExhaustingObjective::loss(const curv::Batch& batch) {
  if (calls_++ >= fail_from_) {
    throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                "CUDA out of memory. Tried to allocate 2.00 GiB (simulated)");
  }
  return model_.loss(batch);
}

void audit_in_float64(const std::string& run, const std::string& probe, const std::string& out,
                      const std::string& extra) {
  int status = 0;
  const std::string log =
      run_tool("ndsprobe",
               run + " --data " + probe + " --dtype float64 --directions delta,adamw " + extra +
                   " -o " + out,
               &status);
  INFO(log);
  REQUIRE(status == 0);
}

size_t taylor_row(const curv::Table& taylor, int64_t step, const std::string& direction,
                  const std::string& block) {
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (taylor.int64s("step")[i] == step && taylor.strings("direction")[i] == direction &&
        taylor.strings("block")[i] == block) {
      return i;
    }
  }
  FAIL("no /taylor row for step " << step << " " << direction << " " << block);
  return 0;
}

void check_audit(const curv::Table& taylor, size_t row, const nlohmann::json& want) {
  auto close = [&](const char* column, double expected) {
    const double got = taylor.doubles(column)[row];
    INFO(column << ": got " << got << ", want " << expected);
    CHECK(std::abs(got - expected) <= 1e-10 * std::abs(expected));
  };
  close("loss", want["loss"].get<double>());
  close("first_order", want["first_order"].get<double>());
  close("curvature", want["curvature"].get<double>());
  close("nds", want["curvature"].get<double>() / want["sq_norm"].get<double>());
  close("update_norm", std::sqrt(want["sq_norm"].get<double>()));
  close("realized", want["realized"].get<double>());
}

}  // namespace curv_test
