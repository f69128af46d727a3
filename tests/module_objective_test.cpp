// The custom-trainer path: a torch::nn::Module and a loss closure.
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"
#include "curv/core/objective.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

TEST_CASE("a torch::nn::Module objective gives the dense-Hessian HVP", "[module]") {
  torch::manual_seed(0);
  auto net =
      torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3));
  net->to(torch::kDouble);
  auto objective = make_module_objective(
      net.ptr(),
      [net](const Batch& b) mutable {
        return torch::nn::functional::cross_entropy(net->forward(b.inputs), b.targets);
      },
      "sequential");
  CHECK(objective->space().names() ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  auto x = torch::randn({12, 4}, torch::kDouble);
  auto y = torch::randint(0, 3, {12}, torch::kLong);
  CurvatureEngine engine(*objective, ProbeSet::split(x, y, 5));
  Eigen::MatrixXd h = dense_hessian(engine);
  ParamVector v = random_direction(*objective, 3);
  Eigen::VectorXd vf(engine.space().numel()), hvf(engine.space().numel());
  to_flat(v, vf.data());
  to_flat(engine.hvp(v), hvf.data());
  CHECK((hvf - h * vf).norm() <= 1e-10 * (h * vf).norm());
}
