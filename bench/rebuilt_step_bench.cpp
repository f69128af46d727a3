// The memory a rebuilt optimizer step holds beyond the parameters and the gradient: AdamW's step
// after saved state read by parameter from optimizer.safetensors (Optimizer::step_from_saved, as
// ndsprobe's update directions take it) against the same state read whole first
// (Optimizer::load_state, then step). bench/rebuilt_step.sh runs the two modes side by side, each
// in its own process so that each peak is its own.
//
//   rebuilt_step_bench write DIR [--params N]           DIR/optimizer.safetensors: exp_avg and
//                                                         exp_avg_sq of 64 float32 matrices of
//                                                         N parameters in all (default 2^28)
//   rebuilt_step_bench run DIR streamed|whole [--threads 2]
//
// The parameters and the gradient are allocated and written before the clock starts and the peak
// resident set is reset (/proc/self/clear_refs, 5); glibc maps every block of 1 MiB or more on
// its own and unmaps it when freed (no RuntimeOptions::tune_allocator), so the peak is what the
// step held live: the step u itself (the parameters' size) and the state it read. One line:
//   RESULT mode=M seconds=S state_bytes=B peak_extra=P u_norm=X
// u_norm, the step's norm, is the same in both modes.
#include <ATen/ATen.h>
#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "curv/core/runtime.h"
#include "curv/io/safetensors.h"
#include "curv/io/tensor_source.h"
#include "curv/optim/optimizers.h"
#include "proc_memory.h"

namespace {

constexpr int64_t kMatrices = 64;
constexpr int64_t kColumns = 1024;

struct Model {
  std::vector<std::string> names;
  curv::ParamVector theta, grad;
};

// The parameters the state of `file` belongs to, with a gradient, deterministic.
Model model_of(const curv::TensorSource& state) {
  Model m;
  at::manual_seed(1);
  for (const auto& e : state.entries()) {
    const std::string suffix = ".exp_avg";
    if (e.name.size() <= suffix.size() || e.name.substr(e.name.size() - suffix.size()) != suffix)
      continue;
    m.names.push_back(e.name.substr(0, e.name.size() - suffix.size()));
    m.theta.push_back(at::randn(e.shape));
    m.grad.push_back(at::randn(e.shape));
  }
  return m;
}

int write(const std::string& dir, int64_t params) {
  const int64_t rows = params / kMatrices / kColumns;
  at::manual_seed(0);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int64_t k = 0; k < kMatrices; ++k) {
    const std::string name = "layers." + std::to_string(k) + ".weight";
    tensors.emplace_back(name + ".exp_avg", at::randn({rows, kColumns}) * 1e-3);
    tensors.emplace_back(name + ".exp_avg_sq", at::rand({rows, kColumns}) * 1e-6);
  }
  curv::write_safetensors(dir + "/optimizer.safetensors", tensors);
  std::printf("wrote %s/optimizer.safetensors: %lld parameters\n", dir.c_str(),
              static_cast<long long>(rows * kMatrices * kColumns));
  return 0;
}

int run(const std::string& dir, const std::string& mode) {
  const std::string file = dir + "/optimizer.safetensors";
  const auto state = curv::safetensors_source({file});
  Model m = model_of(*state);
  curv::OptimizerConfig config = curv::OptimizerConfig::defaults("adamw");
  auto optimizer = curv::make_optimizer(config, curv::ParamSpace(m.names, m.theta));
  const int64_t before = curv_bench::status_bytes("VmRSS");
  curv_bench::reset_peak_rss();
  const auto start = std::chrono::steady_clock::now();
  curv::ParamVector u;
  if (mode == "streamed") {
    u = optimizer->step_from_saved(m.theta, m.grad, *state, 100, file);
  } else {
    optimizer->load_state(curv::read_all(*state), 100, file);
    u = optimizer->step(m.theta, m.grad);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t peak = curv_bench::status_bytes("VmHWM");
  double sq = 0;
  for (const auto& t : u) sq += t.to(at::kDouble).pow(2).sum().item<double>();
  std::printf("RESULT mode=%s seconds=%.3f state_bytes=%lld peak_extra=%lld u_norm=%.12g\n",
              mode.c_str(), seconds, static_cast<long long>(state->total_bytes()),
              static_cast<long long>(peak - before), std::sqrt(sq));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: rebuilt_step_bench write DIR [--params N]\n"
                 "       rebuilt_step_bench run DIR streamed|whole [--threads N]\n");
    return 2;
  }
  const std::string command = argv[1], dir = argv[2];
  int64_t params = int64_t{1} << 28;
  int threads = 2;
  for (int i = 3; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--params") params = std::stoll(argv[i + 1]);
    if (flag == "--threads") threads = std::stoi(argv[i + 1]);
  }
  try {
    // glibc's own allocation policy: ndsprobe's tuning keeps freed blocks in the heap for the
    // next allocation, which would count the step's freed temporaries in the peak.
    curv::RuntimeOptions runtime;
    runtime.threads = threads;
    runtime.tune_allocator = false;
    curv::init_runtime(runtime);
    // Every block of 1 MiB or more mapped on its own and unmapped when freed (a fixed threshold
    // also stops glibc from raising it, which would keep freed tensors in the heap).
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    if (command == "write") return write(dir, params);
    if (command == "run" && argc >= 4) return run(dir, argv[3]);
    std::fprintf(stderr, "rebuilt_step_bench: unknown command '%s'\n", command.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rebuilt_step_bench: %s\n", e.what());
    return 1;
  }
}
