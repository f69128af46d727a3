// The text summary ndsprobe prints after a run, read back from its results file.
#pragma once

#include <string>

namespace curv {

// Per (run, direction) of a results file: checkpoints, mean NDS, ρ_within, predicted and realized
// change of the whole model over the checkpoints, with standard errors over probe batches from
// each unit's per-batch terms; then the paired comparisons and the units along a zero direction.
std::string summarize_probe_file(const std::string& path);

}  // namespace curv
