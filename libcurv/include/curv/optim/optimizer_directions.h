// The optimizer direction families (one per optimizer) that the direction registry starts with.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "curv/core/directions.h"

namespace curv {

// (name, factory, help) for every optimizer_table() entry, then "update".
std::vector<std::tuple<std::string, DirectionFactory, std::string>> optimizer_direction_families();

}  // namespace curv
