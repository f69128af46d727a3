// The time of one step rebuilt from saved state (Optimizer::step_from_saved, as ndsprobe's update
// directions take it) at GPT-2 small's shape (the built-in GPT, 124M parameters, float32), for a
// matrix-preconditioned rule against AdamW. The state is the optimizer's own after two steps on
// random gradients (SOAP's first call sets its factors and eigenbases up), held in memory; the
// clock covers the third step only. bench/preconditioned_step.sh runs it beside hvp_bench's HVP at
// the same shape.
//
//   preconditioned_step_bench --rule soap|kron|adamw [--threads 2]
//
// One line: RESULT rule=R seconds=S params=N state_bytes=B u_norm=X
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "curv/core/runtime.h"
#include "curv/core/tensor_source.h"
#include "curv/models/models.h"
#include "curv/optim/optimizers.h"

namespace {

int run(const std::string& rule) {
  const auto config = curv::ModelConfig::from_json(
      R"({"arch": "gpt", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304,
          "block_size": 256, "tied": true})");
  auto model = curv::make_model(config, curv::ModelInit{0, at::kFloat});
  const curv::ParamSpace& space = model->space();
  curv::ParamVector theta;
  for (const auto& p : model->parameters()) theta.push_back(p.detach());
  auto gradient = [&] {
    curv::ParamVector g;
    for (const auto& t : theta) g.push_back(at::randn_like(t) * 1e-3);
    return g;
  };
  at::manual_seed(1);
  auto optimizer = curv::make_optimizer(curv::OptimizerConfig::defaults(rule), space);
  for (int k = 0; k < 2; ++k) optimizer->step(theta, gradient());
  const auto state = curv::memory_tensor_source(optimizer->state(), "state");
  const curv::ParamVector g = gradient();
  auto rebuilt = curv::make_optimizer(curv::OptimizerConfig::defaults(rule), space);
  const auto start = std::chrono::steady_clock::now();
  const curv::ParamVector u = rebuilt->step_from_saved(theta, g, *state, 2, "state");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double sq = 0;
  for (const auto& t : u) sq += t.to(at::kDouble).pow(2).sum().item<double>();
  std::printf("RESULT rule=%s seconds=%.3f params=%lld state_bytes=%lld u_norm=%.6g\n",
              rule.c_str(), seconds, static_cast<long long>(space.numel()),
              static_cast<long long>(state->total_bytes()), std::sqrt(sq));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string rule;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rule") rule = argv[i + 1];
    if (flag == "--threads") threads = std::stoi(argv[i + 1]);
  }
  if (rule.empty()) {
    std::fprintf(stderr, "usage: preconditioned_step_bench --rule soap|kron|adamw [--threads N]\n");
    return 2;
  }
  try {
    curv::RuntimeOptions runtime;
    runtime.threads = threads;
    curv::init_runtime(runtime);
    return run(rule);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preconditioned_step_bench: %s\n", e.what());
    return 1;
  }
}
