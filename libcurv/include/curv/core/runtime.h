// Process-wide set-up every tool and trainer needs before touching a model: ATen's thread count
// (Debian's torch defaults to one), the TorchScript executor setting that keeps float32 double
// backward correct, and the C allocator's thresholds.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace curv {

struct RuntimeOptions {
  // ATen intra-op threads; 0 = OMP_NUM_THREADS when it is set (as PyTorch reads it), else the
  // number of cores.
  int threads = 0;
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
// The process's resident memory in bytes (Linux: /proc/self/statm), 0 where it is not known.
int64_t resident_bytes();
// Hands the allocator's free pages back to the system (glibc: malloc_trim(0), which also
// releases whole free pages inside the heap, not only at its top); a no-op elsewhere. With
// init_runtime's allocator settings, freed tensor memory otherwise stays resident for reuse.
void release_free_memory();

// The memory of the device a computation runs on, in bytes (-1: not known). On the CPU, `in_use`
// is the process's resident memory and `peak` is not tracked. On a device whose allocator keeps
// statistics (CUDA's caching allocator, with LibTorch 2.9 or later), `in_use` is what its live
// tensors hold, `peak` the most they held since reset_peak_memory, and `reserved` what the
// allocator holds from the device, cached free blocks included.
struct DeviceMemory {
  int64_t in_use = -1;
  int64_t peak = -1;
  int64_t reserved = -1;
};
DeviceMemory device_memory(const c10::Device& device);
void reset_peak_memory(const c10::Device& device);
// release_free_memory() on the CPU; a device allocator's cached free blocks otherwise.
void release_free_memory(const c10::Device& device);
// "1.25 GiB", "512 MiB", "0 B"; "unknown" for a negative count.
std::string format_bytes(int64_t bytes);
// libcurv's version, "MAJOR.MINOR.PATCH" (provenance of every results file).
std::string library_version();
// OpenBLAS chooses its kernels by the CPU model when it is loaded, and on a model it does not
// know (virtual CPUs often report none) falls back to its generic Prescott (SSE3) kernels, which
// run matrix products several times slower than the AVX2 / AVX-512 kernels the CPU has (measured
// on a 2-core virtual Xeon: 66 against 299 GFLOP/s float32). The core to request with
// OPENBLAS_CORETYPE ("SkylakeX", "Haswell" or "SandyBridge"), or "" when BLAS is not OpenBLAS,
// already runs vector kernels, or OPENBLAS_CORETYPE is set.
std::string better_openblas_core();
// For programs, first thing in main(): when better_openblas_core() names a core, sets
// OPENBLAS_CORETYPE and re-executes the program with the same arguments, so that OpenBLAS loads
// with it (it reads the variable only at load). Returns when there is nothing to do or the
// re-execution failed; tries once per process tree.
void reexec_for_blas_kernels(char** argv);
// OpenBLAS's core name ("SkylakeX", "Prescott", ...), "" when BLAS is not OpenBLAS.
std::string openblas_core();
// "LibTorch 1.13.0, 2 threads, OpenBLAS SkylakeX, glibc malloc, ..." for logs and provenance.
std::string runtime_summary();
// "glibc malloc, mmap threshold 32 MiB, trim threshold 2 GiB" (or "glibc malloc, defaults",
// "glibc malloc, GLIBC_TUNABLES", "system malloc"): what init_runtime set.
std::string allocator_summary();
// Whether this LibTorch multiplies matrices of `dtype` on the CPU (Debian's LibTorch 1.13 has no
// float16 products there; LibTorch 2 has).
bool cpu_matrix_products(at::ScalarType dtype);
// GFLOP/s of an n x n matmul in the given dtype ("float32" | "float64"): shows which BLAS runs.
double matmul_gflops(int n, const std::string& dtype, int repeats = 5);

}  // namespace curv
