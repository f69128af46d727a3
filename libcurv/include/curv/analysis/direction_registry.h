// The registry of direction families by name ("delta", "gradient", "random", and one per
// optimizer), so tools and drivers build directions from specs and new directions plug in.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/directions.h"

namespace curv {

// Registers a family of directions under `name` (specs "name" or "name:options"). Registering a
// taken name replaces it.
void register_direction(const std::string& name, DirectionFactory factory, const std::string& help);
// Builds a direction from a spec such as "delta", "gradient", "random", "adamw" (rebuilt from the
// checkpoint's optimizer state), "muon.whatif" (fresh state, configured lr),
// "muon.whatif:match=1,lr=0.01" (rescaled to the delta's norm); see docs/optimizers.md.
// InvalidArgument names the spec and lists the known directions.
std::unique_ptr<Direction> make_direction(const std::string& spec);
// Known direction names with one-line help, sorted.
std::vector<std::pair<std::string, std::string>> known_directions();

}  // namespace curv
