// The optimizer direction families (one per optimizer) that the direction registry starts with,
// and the rebuilt step of a saved optimizer that they and the Python package take.
#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "curv/core/directions.h"
#include "curv/core/param_space.h"

namespace curv {

struct SavedOptimizer;

// key=value overrides of an optimizer's hyper-parameters, as OptimizerConfig::set takes them.
using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct RebuiltStep {
  ParamVector u;     // u = θ' − θ, aligned with the space
  std::string rule;  // the optimizer_table() entry that took it
  // "rebuilt from saved adamw state (step count 12)", the number of parameter groups, and what
  // the rule's step leaves out of its reference's (Optimizer::step_note).
  std::string note;
};

// The step the optimizer that saved `saved` takes next from θ with gradient g: each parameter
// group of its record stepped by the rule configured with the group's hyper-parameters (then
// `overrides`), reading each parameter's saved state when its step is taken. The state must be
// resolved to names (resolve_optimizer_state). InvalidArgument when the record names no rule
// (with its refusal) or the vectors do not fit the space; FormatError for a group naming a
// parameter outside it.
RebuiltStep rebuild_saved_step(const SavedOptimizer& saved, const ParamSpace& space,
                               const ParamVector& theta, const ParamVector& grad,
                               const KeyValues& overrides = {});

// (name, factory, help) for every optimizer_table() entry, then "update".
std::vector<std::tuple<std::string, DirectionFactory, std::string>> optimizer_direction_families();

}  // namespace curv
