// transformers 5 runs a mixture of experts with each layer's experts fused into two tensors,
// mlp.experts.gate_up_proj [E, 2F, C] (each expert's gate rows, then its up rows) and
// mlp.experts.down_proj [E, C, F], and saves the checkpoints per expert as the published models
// name them (experts.<e>.gate_proj / w1, ...). Its Trainer's optimizer.pt is over the fused
// tensors: these are the parameters it numbers, and how their state splits into the experts'.
// Not public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "curv/core/param_space.h"
#include "curv/core/structure.h"

namespace curv {

// One of the model's parameters inside a runtime parameter: expert `expert`'s rows from
// `row_offset` of a fused tensor, or the whole tensor (expert -1).
struct RuntimePart {
  size_t param = 0;  // position in the model's ParamSpace
  int64_t expert = -1;
  int64_t row_offset = 0;
};

struct FusedExpertSpace {
  // The parameters as the training program held them, in its order and with its names.
  ParamSpace space;
  ModelStructure structure;  // their roles; a fused tensor takes its experts' layer
  std::vector<std::vector<RuntimePart>> parts;  // aligned with `space`
};

// Where a layer's router is among the parameters the program held: before the experts (Mixtral's
// and OLMoE's blocks in transformers 5, and the checkpoints' order), or after them (Qwen3-MoE's
// block declares its experts first).
enum class RouterPlacement { kBeforeExperts, kAfterExperts };

// The model's parameters with each layer's experts fused as transformers 5 holds them: the fused
// pair (gate_up_proj, down_proj) where the layer's first expert parameter is, its router before
// or after the pair. nullopt for a model without experts, or whose experts are not SwiGLU
// projections of one shape each (gate, up, down).
std::optional<FusedExpertSpace> fused_expert_space(const ParamSpace& space,
                                                   const ModelStructure& structure,
                                                   RouterPlacement router);

// Optimizer rules whose step is elementwise, so that a fused tensor's step, state and all, is
// its experts' steps side by side (AdamW, Adam, NAdam, RAdam, SGD, Lion, AdEMAMix).
bool splits_into_experts(const std::string& rule);

}  // namespace curv
