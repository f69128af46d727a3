// Process-wide set-up every tool and trainer needs before touching a model: ATen's thread count
// (Debian's torch defaults to one), the TorchScript executor setting that keeps float32 double
// backward correct, and the C allocator's thresholds.
#pragma once

#include <string>

namespace curv {

struct RuntimeOptions {
  int threads = 0;  // ATen intra-op threads; 0 = the number of cores
  // glibc only: keep freed memory in the heap for the next allocation (mmap threshold 32 MiB,
  // trim threshold 2 GiB) instead of unmapping it. ATen allocates tensors with malloc; by
  // default glibc unmaps every freed block of more than a few MiB, so each forward, backward and
  // HVP faults its activations in again, page by page (docs/performance.md). Skipped when the
  // GLIBC_TUNABLES environment variable sets malloc tunables, which then rule.
  bool tune_allocator = true;
};

// Idempotent; call once at start-up.
void init_runtime(const RuntimeOptions& options = {});
int hardware_threads();
// libcurv's version, "MAJOR.MINOR.PATCH" (provenance of every results file).
std::string library_version();
// "libtorch 1.13.1, 2 threads, BLAS: ..." for logs and provenance.
std::string runtime_summary();
// "glibc malloc, mmap threshold 32 MiB, trim threshold 2 GiB" (or "glibc malloc, defaults",
// "glibc malloc, GLIBC_TUNABLES", "system malloc"): what init_runtime set.
std::string allocator_summary();
// GFLOP/s of an n x n matmul in the given dtype ("float32" | "float64"): shows which BLAS runs.
double matmul_gflops(int n, const std::string& dtype, int repeats = 5);

}  // namespace curv
