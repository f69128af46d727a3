// Probe data from files: a safetensors file holding `inputs` and `targets` (first dimension =
// examples), split into the fixed, ordered batches of a ProbeSet.
#pragma once

#include <cstdint>
#include <string>

#include "curv/core/probe_set.h"

namespace curv {

struct ProbeDataOptions {
  int64_t batch_size = 32;   // examples per batch; the last batch may be smaller
  int64_t max_examples = 0;  // use the first N examples (0 = all)
  void validate() const;
};

// FormatError names the file and the missing or malformed key.
ProbeSet load_probe_data(const std::string& path, const ProbeDataOptions& options = {});

// Language-model windows from a nanoGPT-style uint16 token file (train.bin / val.bin): `examples`
// windows of `block_size` tokens (targets shifted by one) at offsets drawn from `seed` (SplitMix64,
// the same on every platform), split into batches of `batch_size`. FormatError names the file;
// InvalidArgument when the file is shorter than one window.
ProbeSet load_token_probe_data(const std::string& path, int64_t block_size, int64_t examples,
                               int64_t batch_size, uint64_t seed);

// A probe set as a tool names it: a safetensors file, or a uint16 token file (extension .bin)
// cut into `options.max_examples` windows of `block_size` tokens at offsets seeded by `seed`.
struct ProbeDataSource {
  std::string path;
  ProbeDataOptions options;
  int64_t block_size = 0;  // token files only
  uint64_t seed = 0;       // token files only

  bool token_file() const;  // by the extension .bin
  // InvalidArgument naming the path: no path; a token file without block_size and max_examples;
  // a block_size for a safetensors file.
  void validate() const;
  ProbeSet load() const;
};

}  // namespace curv
