// A hand-written LibTorch training loop that measures the curvature along the step it just took,
// every N steps, with libcurv's in-training probe: the second-order Taylor audit (predicted vs
// realized loss change), NDS = uᵀHu / ‖u‖² and the per-layer breakdown, appended to an HDF5 file
// in the same schema ndsprobe writes (docs/hdf5-schema.md).
//
//   custom_trainer [--steps N] [--probe-every K] [--output FILE.h5]
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "curv/analysis/in_training_probe.h"
#include "curv/analysis/report.h"
#include "curv/core/blocks.h"
#include "curv/core/objective.h"
#include "curv/core/runtime.h"
#include "curv/optim/schedule.h"

int main(int argc, char** argv) {
  // OpenBLAS's vector kernels where it fell back to generic ones (docs/library.md, Runtime).
  curv::reexec_for_blas_kernels(argv);
  int steps = 100, probe_every = 25;
  std::string output = "custom_trainer.h5";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps"))
      steps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--probe-every"))
      probe_every = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--output"))
      output = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--probe-every K] [--output FILE.h5]\n", argv[0]);
      return 2;
    }
  }
  curv::init_runtime();
  torch::manual_seed(0);

  // The user's model, data and optimizer: nothing here knows about libcurv.
  auto net =
      torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::Tanh(), torch::nn::Linear(64, 4));
  auto x = torch::randn({512, 16});
  auto y = (x.narrow(1, 0, 4) * 3).argmax(1);
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(3e-3));

  // libcurv: the loss as an objective, a results file, and the probe.
  auto objective = curv::make_module_objective(
      net.ptr(),
      [net](const curv::Batch& b) mutable {
        return torch::nn::functional::cross_entropy(net->forward(b.inputs), b.targets);
      },
      "mlp-16-64-4");
  curv::Provenance provenance;
  provenance.tool = "custom_trainer";
  provenance.model = objective->describe();
  provenance.dtype = "float32";
  provenance.probe_hash = "training-batch";
  provenance.blocks = "tensor";
  provenance.hvp_method = curv::HvpMethod::kExact;
  curv::ProbeReport report(output, provenance, /*resume=*/false);
  curv::InTrainingProbeOptions options;
  options.every = probe_every;
  curv::InTrainingProbe probe(
      report, "adam", curv::BlockPartition::by_rule(objective->space(), curv::BlockRule::kTensor),
      options);

  std::printf("%6s %10s %12s %12s %12s\n", "step", "loss", "predicted", "realized", "NDS");
  for (int step = 0; step < steps; ++step) {
    auto index = torch::randint(0, 512, {64}, torch::kLong);
    curv::Batch batch{x.index_select(0, index), y.index_select(0, index)};
    curv::ParamVector before = curv::snapshot_parameters(*objective);

    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(batch.inputs), batch.targets).backward();
    optimizer.step();

    if (!probe.due(step)) continue;
    // The step just taken, audited at the pre-step point on the batch it was computed from.
    curv::ParamVector u = curv::sub(curv::snapshot_parameters(*objective), before);
    curv::TaylorResult r = probe.measure(*objective, step, before, u, batch);
    std::printf("%6d %10.4f %12.4e %12.4e %12.4e\n", step, r.loss, r.predicted, r.realized, r.nds);
  }
  std::printf("curvature of every probed step in %s\n", output.c_str());
  return 0;
}
