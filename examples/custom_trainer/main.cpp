// A hand-written LibTorch training loop that measures the curvature along each step it takes,
// every N steps: the loss change predicted by the second-order Taylor expansion against the
// realized one, and the Normalized Directional Sharpness NDS = uᵀHu / ‖u‖² of the step u.
//
//   custom_trainer [--steps N] [--probe-every K]
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "curv/engine.h"
#include "curv/objective.h"
#include "curv/runtime.h"

int main(int argc, char** argv) {
  int steps = 100, probe_every = 25;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--probe-every")) probe_every = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--probe-every K]\n", argv[0]);
      return 2;
    }
  }
  curv::init_runtime();
  torch::manual_seed(0);

  // A small classifier on a synthetic, linearly separable-ish task.
  auto net = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::Tanh(),
                                   torch::nn::Linear(64, 4));
  auto x = torch::randn({512, 16});
  auto y = (x.narrow(1, 0, 4) * 3).argmax(1);
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(3e-3));

  auto objective = curv::make_module_objective(
      net.ptr(),
      [net](const curv::Batch& b) mutable {
        return torch::nn::functional::cross_entropy(net->forward(b.inputs), b.targets);
      },
      "mlp-16-64-4");

  std::printf("%6s %10s %12s %12s %12s %12s\n", "step", "loss", "g.u", "predicted", "realized",
              "NDS");
  for (int step = 1; step <= steps; ++step) {
    auto batch_index = torch::randint(0, 512, {64}, torch::kLong);
    curv::Batch batch{x.index_select(0, batch_index), y.index_select(0, batch_index)};
    curv::ParamVector before = curv::snapshot_parameters(*objective);

    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(batch.inputs), batch.targets);
    loss.backward();
    optimizer.step();

    if (step % probe_every != 0) continue;
    // The step just taken, measured on the batch it was computed from, at the pre-step point.
    curv::ParamVector after = curv::snapshot_parameters(*objective);
    curv::ParamVector u = curv::sub(after, before);
    curv::load_parameters(*objective, before);
    curv::CurvatureEngine engine(*objective, curv::ProbeSet({batch}));
    const double gu = curv::dot(engine.gradient(), u);
    const double uhu = curv::dot(u, engine.hvp(u));
    const double realized = engine.loss_at(u) - engine.loss();
    std::printf("%6d %10.4f %12.4e %12.4e %12.4e %12.4e\n", step, engine.loss(), gu,
                gu + 0.5 * uhu, realized, uhu / curv::squared_norm(u));
    curv::load_parameters(*objective, after);
  }
  return 0;
}
