// Process-wide set-up every tool and trainer needs before touching a model: ATen's thread count
// (Debian's torch defaults to one), and the TorchScript executor setting that keeps float32
// double backward correct.
#pragma once

#include <string>

namespace curv {

struct RuntimeOptions {
  int threads = 0;  // ATen intra-op threads; 0 = the number of cores
};

// Idempotent; call once at start-up.
void init_runtime(const RuntimeOptions& options = {});
int hardware_threads();
// libcurv's version, "MAJOR.MINOR.PATCH" (provenance of every results file).
std::string library_version();
// "libtorch 1.13.1, 2 threads, BLAS: ..." for logs and provenance.
std::string runtime_summary();
// GFLOP/s of an n x n matmul in the given dtype ("float32" | "float64"): shows which BLAS runs.
double matmul_gflops(int n, const std::string& dtype, int repeats = 5);

}  // namespace curv
