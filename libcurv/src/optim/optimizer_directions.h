// The optimizer direction families (one per optimizer) that the direction registry starts with.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "curv/core/directions.h"

namespace curv {

// (name, factory, help) for adamw, muon, normuon, sgd, signsgd, signum, lion.
std::vector<std::tuple<std::string, DirectionFactory, std::string>> optimizer_direction_families();

}  // namespace curv
