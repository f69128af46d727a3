// TorchScript models as objectives: a file whose forward(x, y) returns the scalar mean loss, or
// whose forward(x) returns logits scored by cross-entropy against y (last dim = classes).
#pragma once

#include <memory>
#include <string>

#include "curv/core/objective.h"

namespace curv {

enum class ScriptMode {
  kAuto,    // forward with two arguments -> kLoss, with one -> kLogits
  kLoss,    // forward(x, y) -> scalar mean loss
  kLogits,  // forward(x) -> logits; loss = mean cross-entropy(logits, y)
};

struct ScriptOptions {
  ScriptMode mode = ScriptMode::kAuto;
  // Convert floating parameters to this dtype (Undefined keeps the file's dtype).
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::string device = "cpu";
  // A structure mapping file (ModelStructure::from_mapping_file) giving parameter roles and head
  // counts; empty: the name rules (ModelStructure::from_names).
  std::string structure_mapping;
};

// Loads `path` with torch::jit::load. Throws FormatError if the file is missing or not a
// TorchScript archive, ModelError if it has no usable forward. Disables the TorchScript graph
// optimizer process-wide: with it on, float32 double backward returns wrong values.
std::unique_ptr<Objective> load_script_objective(const std::string& path,
                                                 const ScriptOptions& options = {});

}  // namespace curv
