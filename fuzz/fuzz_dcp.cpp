// A torch.distributed.checkpoint folder: the input is split at "\n--\n" into .metadata (the
// pickle of DCP's classes, read by the allow-list unpickler) and one shard, __0_0.distcp
// (torch.save records or a safetensors blob at the offsets .metadata names). Covers the metadata
// walk, the chunk tiling checks, the shard bounds, every tensor's assembly and every saved object.
#include "curv/io/dcp.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return curv::fuzz::run_expecting_clean_errors([&] {
    curv::fuzz::clear_scratch();
    const auto parts = curv::fuzz::split(data, size, "\n--\n", 2);
    curv::fuzz::write_file("step-2/.metadata", parts[0]);
    curv::fuzz::write_file("step-2/__0_0.distcp", parts[1]);
    const curv::DcpReader dcp(curv::fuzz::scratch_dir() + "/step-2");
    for (const auto& e : dcp.entries()) (void)dcp.read(e.name);
    for (const auto& key : dcp.object_keys()) (void)dcp.object(key)->brief();
  });
}
