// The PyTorch checkpoint layouts behind list_checkpoints and load_checkpoint (not public API).
#pragma once

#include <string>
#include <vector>

#include "curv/io/checkpoint.h"

namespace curv {

// The checkpoints of `dir` in a non-native `layout`, sorted by step; FormatError naming `dir`
// when there is none or two share a step.
std::vector<CheckpointInfo> list_torch_checkpoints(const std::string& dir, CheckpointLayout layout);
// One checkpoint of a non-native layout.
Checkpoint load_torch_checkpoint(const CheckpointInfo& info);

}  // namespace curv
