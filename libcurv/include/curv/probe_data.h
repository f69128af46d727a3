// Probe data from files: a safetensors file holding `inputs` and `targets` (first dimension =
// examples), split into the fixed, ordered batches of a ProbeSet.
#pragma once

#include <cstdint>
#include <string>

#include "curv/probe_set.h"

namespace curv {

struct ProbeDataOptions {
  int64_t batch_size = 32;  // examples per batch; the last batch may be smaller
  int64_t max_examples = 0; // use the first N examples (0 = all)
  void validate() const;
};

// FormatError names the file and the missing or malformed key.
ProbeSet load_probe_data(const std::string& path, const ProbeDataOptions& options = {});

}  // namespace curv
