#include "curv/core/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/fmt_torch.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// The device-generic allocator interface (c10::DeviceAllocator: statistics, emptyCache) came with
// LibTorch 2.9; before it, only the CPU's figures are known.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#include <c10/core/CachingDeviceAllocator.h>
#define CURV_DEVICE_ALLOCATOR_STATS 1
#endif

#include "curv/core/error.h"

namespace curv {

namespace {

std::string g_allocator = "system malloc";

#if defined(__GLIBC__)
constexpr int kMmapThreshold = 32 << 20;  // glibc's upper bound for M_MMAP_THRESHOLD on 64-bit
constexpr int kTrimThreshold = INT_MAX;   // mallopt takes an int: 2 GiB

void tune_glibc_malloc(bool tune) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) {
    g_allocator = "glibc malloc, GLIBC_TUNABLES";
    return;
  }
  if (!tune) {
    g_allocator = "glibc malloc, defaults";
    return;
  }
  // Both calls fix the thresholds (glibc's dynamic threshold stops adapting), which is the point:
  // tensors up to 32 MiB are served from the heap, and freed heap memory stays mapped.
  const bool ok = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
                  mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
  g_allocator = ok ? "glibc malloc, mmap threshold 32 MiB, trim threshold 2 GiB"
                   : "glibc malloc, defaults (mallopt refused)";
}
#endif

}  // namespace

std::string openblas_core() {
  using CoreName = char* (*)();
  auto core_name = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core_name == nullptr) return "";
  const char* name = core_name();
  return name == nullptr ? "" : name;
}

std::string better_openblas_core() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const std::string core = openblas_core();
  // OpenBLAS's cores without AVX kernels: where it lands on a CPU model it does not know.
  static const char* const kGeneric[] = {"Prescott",  "Core2", "Penryn", "Dunnington",
                                         "Nehalem",   "Atom",  "Katmai", "Coppermine",
                                         "Northwood", "Banias"};
  bool generic = false;
  for (const char* name : kGeneric) generic = generic || core == name;
  if (!generic) return "";
  // __builtin_cpu_supports also checks that the OS saves the vector registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "SandyBridge";
#endif
  return "";
}

void reexec_for_blas_kernels(char** argv) {
  const std::string core = better_openblas_core();
  if (core.empty() || std::getenv("CURV_BLAS_REEXEC") != nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::setenv("CURV_BLAS_REEXEC", "1", 1);
  ::execv("/proc/self/exe", argv);
  // Still here: the kernels stay as they are, and so must the environment a child would see.
  ::unsetenv("OPENBLAS_CORETYPE");
}

int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  if (read != 2) return 0;
  return static_cast<int64_t>(resident) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

void release_free_memory() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

#ifdef CURV_DEVICE_ALLOCATOR_STATS
namespace {

// The device's allocator when it keeps statistics and is in use, else null.
c10::DeviceAllocator* stats_allocator(const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  auto* allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(device.type()));
  return allocator != nullptr && allocator->initialized() ? allocator : nullptr;
}

constexpr size_t kAllPools = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

}  // namespace
#endif

DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory m;
  if (device.is_cpu()) {
    m.in_use = resident_bytes();
    return m;
  }
#ifdef CURV_DEVICE_ALLOCATOR_STATS
  if (auto* allocator = stats_allocator(device)) {
    const auto stats = allocator->getDeviceStats(device.index() < 0 ? 0 : device.index());
    m.in_use = stats.allocated_bytes[kAllPools].current;
    m.peak = stats.allocated_bytes[kAllPools].peak;
    m.reserved = stats.reserved_bytes[kAllPools].current;
  }
#endif
  return m;
}

void reset_peak_memory(const c10::Device& device) {
#ifdef CURV_DEVICE_ALLOCATOR_STATS
  if (auto* allocator = stats_allocator(device)) {
    allocator->resetPeakStats(device.index() < 0 ? 0 : device.index());
  }
#else
  (void)device;
#endif
}

void release_free_memory(const c10::Device& device) {
  if (device.is_cpu()) return release_free_memory();
#ifdef CURV_DEVICE_ALLOCATOR_STATS
  if (auto* allocator = stats_allocator(device)) allocator->emptyCache();
#endif
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 0) return "unknown";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.3g} {}", value, units[unit]);
}

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

// OMP_NUM_THREADS as OpenMP reads it (the first number of a list), else the cores.
int default_threads() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  if (text == nullptr || *text == '\0') return hardware_threads();
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (n < 1 || n > 1 << 16 || end == text || (*end != '\0' && *end != ',')) {
    throw InvalidArgument(
        fmt::format("OMP_NUM_THREADS={}: expected a positive number of threads", text));
  }
  return static_cast<int>(n);
}

}  // namespace

void init_runtime(const RuntimeOptions& options) {
  if (options.threads < 0) {
    throw InvalidArgument(fmt::format(
        "threads = {} must be >= 0 (0 = OMP_NUM_THREADS, else all cores)", options.threads));
  }
  at::set_num_threads(options.threads == 0 ? default_threads() : options.threads);
#if defined(__GLIBC__)
  tune_glibc_malloc(options.tune_allocator);
#endif
  // The optimizing TorchScript executor returns wrong float32 double-backward values from the
  // third call on; the plain executor is exact.
  torch::jit::setGraphExecutorOptimize(false);
}

std::string runtime_summary() {
  const std::string core = openblas_core();
  return fmt::format("LibTorch {}.{}.{}, {} threads{}, {}", TORCH_VERSION_MAJOR,
                     TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, at::get_num_threads(),
                     core.empty() ? "" : ", OpenBLAS " + core, g_allocator);
}

bool cpu_matrix_products(at::ScalarType dtype) {
  try {
    const at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(dtype));
    (void)at::mm(a, a);
    return true;
  } catch (const std::exception&) {
    return false;
  }
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
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * n * double(n) * n / best / 1e9;
}

std::string library_version() { return CURV_VERSION; }

std::string allocator_summary() { return g_allocator; }

}  // namespace curv
