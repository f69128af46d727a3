// The built-in per-unit analyses, in the order the probe loop runs them (unit_analysis.cpp
// registers them): each factory returns null when the options leave the analysis off.
#pragma once

#include <memory>

#include "curv/analysis/probe_run.h"
#include "curv/analysis/unit_analysis.h"

namespace curv {

std::unique_ptr<UnitAnalysis> make_taylor_analysis(const ProbeRunOptions& options);
std::unique_ptr<UnitAnalysis> make_token_bucket_analysis(const ProbeRunOptions& options);
std::unique_ptr<UnitAnalysis> make_within_analysis(const ProbeRunOptions& options);
std::unique_ptr<UnitAnalysis> make_spectrum_analysis(const ProbeRunOptions& options);
std::unique_ptr<UnitAnalysis> make_comparison_analysis(const ProbeRunOptions& options);

}  // namespace curv
