// SafetensorsReader: the header (JSON), dtypes, shapes, offsets and every tensor's bytes.
#include "curv/io/safetensors.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::write_file("input.safetensors", data, size);
    curv::SafetensorsReader reader(path);
    for (const auto& name : reader.names()) {
      (void)reader.entry(name);
      (void)reader.tensor(name).sum();
    }
    (void)reader.metadata();
  });
}
