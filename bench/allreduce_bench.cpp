// Cost of libcurv's data-parallel reduction: the float64 all-reduce the engine runs once per
// gradient and once per HVP, over c10d's ProcessGroupGloo, at buffer sizes from a small model's
// parameter count up to GPT-2 small's. Start one copy per rank with torchrun's environment
// (bench/distributed_scaling.sh does); rank 0 prints a Markdown table.
//
//   WORLD_SIZE=2 RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 allreduce_bench [--repeats 5]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "curv/core/distributed.h"

int main(int argc, char** argv) {
  int repeats = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  try {
    auto comm = curv::communicator_from_environment();
    if (comm->is_root()) {
      std::printf(
          "| values (float64) | MiB | median all-reduce (ms) | GB/s per rank (ring: 2(N-1)/N of "
          "the buffer) |\n|---|---|---|---|\n");
    }
    const int world = comm->world_size();
    for (size_t n :
         {size_t{1} << 10, size_t{118000}, size_t{5000000}, size_t{30000000}, size_t{124000000}}) {
      std::vector<double> buffer(n, 1.0);
      comm->all_reduce_sum(buffer.data(), n);  // warm-up: gloo builds its algorithm once per size
      std::vector<double> ms;
      for (int r = 0; r < repeats; ++r) {
        comm->barrier();
        const auto start = std::chrono::steady_clock::now();
        comm->all_reduce_sum(buffer.data(), n);
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      const double bytes = 8.0 * static_cast<double>(n) * 2.0 * (world - 1) / world;
      if (comm->is_root()) {
        std::printf("| %zu | %.1f | %.2f | %.2f |\n", n, 8.0 * n / (1 << 20), median,
                    bytes / (median * 1e-3) / 1e9);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
