// load_torch_file: the zip archive (directory, records, CRC-32), the pickle VM and tensor views.
#include "curv/io/torch_file.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return curv::fuzz::run_expecting_clean_errors([&] {
    const std::string path = curv::fuzz::write_file("input.pt", data, size);
    // Metadata only first (no storage reads), then everything, as list_checkpoints and
    // load_checkpoint do.
    (void)curv::load_torch_file(path, curv::TorchFileOptions{false})->brief();
    (void)curv::load_torch_file(path)->brief();
  });
}
