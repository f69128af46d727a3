// Reading a torch.distributed.checkpoint folder onto a model's tensors the way ndsprobe reads it
// (curv::DcpReader, tensor by tensor into the destination), for comparison with
// torch.distributed.checkpoint.load into the same tensors (bench/python/dcp_read.py runs both side
// by side in one invocation: bench/dcp_read.sh).
//
//   dcp_read_bench FOLDER [--prefix model.] [--dtype float32|bfloat16|as-stored] [--threads 2]
//
// The destination tensors (every tensor of FOLDER whose key starts with --prefix, in --dtype) are
// allocated and written once before the clock starts, as a model's parameters are. The peak
// resident set is reset then (/proc/self/clear_refs, 5), so the "peak_extra" printed is the most
// memory the read itself held beyond the destinations. One line:
//   RESULT seconds=S dest_bytes=B rss_before=R peak_extra=P tensors=N
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "curv/core/runtime.h"
#include "curv/io/dcp.h"
#include "proc_memory.h"

using curv_bench::reset_peak_rss;
using curv_bench::status_bytes;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dcp_read_bench FOLDER [--prefix P] [--dtype T] [--threads N]\n");
    return 2;
  }
  const std::string folder = argv[1];
  std::string prefix, dtype = "float32";
  int threads = 2;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--prefix") prefix = argv[i + 1];
    if (flag == "--dtype") dtype = argv[i + 1];
    if (flag == "--threads") threads = std::stoi(argv[i + 1]);
  }
  try {
    curv::init_runtime(curv::RuntimeOptions{threads});
    const curv::DcpReader dcp(folder);
    std::vector<std::pair<std::string, at::Tensor>> dest;
    int64_t dest_bytes = 0;
    for (const auto& e : dcp.entries()) {
      if (e.name.rfind(prefix, 0) != 0) continue;
      const at::ScalarType type = dtype == "bfloat16"    ? at::kBFloat16
                                  : dtype == "as-stored" ? e.dtype
                                                         : at::kFloat;
      dest.emplace_back(e.name, at::zeros(e.shape, at::TensorOptions().dtype(type)));
      dest_bytes += dest.back().second.nbytes();
    }
    const int64_t before = status_bytes("VmRSS");
    reset_peak_rss();
    const auto start = std::chrono::steady_clock::now();
    for (auto& [name, t] : dest) dcp.read_into(name, {}, t);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t peak = status_bytes("VmHWM");
    std::printf("RESULT seconds=%.3f dest_bytes=%lld rss_before=%lld peak_extra=%lld tensors=%zu\n",
                seconds, static_cast<long long>(dest_bytes), static_cast<long long>(before),
                static_cast<long long>(peak - before), dest.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcp_read_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
