#include "curv/core/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "core/fmt_torch.h"
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/version.h>

#include <chrono>
#include <thread>

#include "curv/core/error.h"

namespace curv {

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void init_runtime(const RuntimeOptions& options) {
  if (options.threads < 0) {
    throw InvalidArgument(fmt::format("threads = {} must be >= 0 (0 = all cores)", options.threads));
  }
  at::set_num_threads(options.threads == 0 ? hardware_threads() : options.threads);
  // The optimizing TorchScript executor returns wrong float32 double-backward values from the
  // third call on; the plain executor is exact.
  torch::jit::setGraphExecutorOptimize(false);
}

std::string runtime_summary() {
  return fmt::format("LibTorch {}.{}.{}, {} threads", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                     TORCH_VERSION_PATCH, at::get_num_threads());
}

double matmul_gflops(int n, const std::string& dtype, int repeats) {
  const auto type = dtype == "float64" ? at::kDouble : at::kFloat;
  auto a = at::randn({n, n}, at::TensorOptions().dtype(type));
  auto b = at::randn({n, n}, at::TensorOptions().dtype(type));
  at::mm(a, b);  // warm-up: thread pool, BLAS initialisation
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    auto c = at::mm(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * n * double(n) * n / best / 1e9;
}

std::string library_version() { return CURV_VERSION; }

}  // namespace curv
