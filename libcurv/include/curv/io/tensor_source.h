// The tensor sources of files: safetensors files read tensor by tensor (the interface and the
// sources in memory are in curv/core/tensor_source.h).
#pragma once

#include <string>
#include <vector>

#include "curv/core/tensor_source.h"

namespace curv {

// The tensors of safetensors files, read one at a time out of a read-only mapping whose pages are
// dropped once each tensor is copied; several files are one source (a sharded save). The headers
// are read and checked now (FormatError naming the file); a name in two files is a FormatError
// naming both.
SharedTensorSource safetensors_source(const std::vector<std::string>& files,
                                      std::string origin = "");

}  // namespace curv
