// uint16 token files (nanoGPT's train.bin / val.bin): the first two bytes choose the window
// length and count, the rest is the file; read as TokenData and as a probe set.
#include "curv/io/probe_data.h"
#include "curv/io/token_data.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  return curv::fuzz::run_expecting_clean_errors([&] {
    const int64_t block = data[0] % 17;  // 0 is invalid on purpose
    const int64_t examples = data[1] % 9;
    const std::string path = curv::fuzz::write_file("tokens.bin", data + 2, size - 2);
    const curv::TokenData tokens = curv::TokenData::from_uint16_file(path);
    (void)tokens.max_token();
    (void)tokens.windows(examples, block, 1);
    (void)tokens.consecutive_windows(examples, block);
    (void)curv::load_token_probe_data(path, block, examples, 3, 7);
  });
}
