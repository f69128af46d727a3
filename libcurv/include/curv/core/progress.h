// Progress of long computations, reported through a callback so that the library never prints:
// the command-line tools draw a bar with it, a custom driver logs or ignores it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace curv {

// Called after each unit of work: `done` of `total` units are finished, `label` names the last
// one (e.g. "adamw step 200 delta"). An empty callback is allowed and does nothing.
using ProgressCallback = std::function<void(size_t done, size_t total, const std::string& label)>;

}  // namespace curv
