// The probe run's options: their validation, the block options' partition and the job result's
// table lookups (curv/analysis/probe_run.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "curv/analysis/probe_run.h"
#include "curv/core/error.h"
#include "curv/optim/optimizers.h"

namespace curv {

void CheckpointSpectrumOptions::validate() const {
  if (eigenvalues || overlap) {
    EigenOptions e = eigen;
    // --overlap alone needs the top eigenvectors only.
    if (!eigenvalues) e.bottom = 0;
    if (overlap && e.top < 1) {
      throw InvalidOption("overlap needs the top eigenspace: {0} must be >= 1",
                          {{"EigenOptions.top", fmt::format("{}", e.top)}});
    }
    e.validate();
  }
  if (trace) trace_options.validate();
  if (density) density_options.validate();
}

void ProbeRunOptions::validate() const {
  if (runs.empty()) {
    throw InvalidOption("no checkpoint directory given: {0} is empty",
                        {{"ProbeRunOptions.runs", ""}});
  }
  if (directions.empty()) throw InvalidOption("{0} is empty", {{"ProbeRunOptions.directions", ""}});
  validate_param_order(param_order);
  NamedOptimizer::parse(optimizer);
  if (prefetch_bytes < 0) {
    throw InvalidOption("{0} must be >= 0",
                        {{"ProbeRunOptions.prefetch_bytes", std::to_string(prefetch_bytes)}});
  }
  taylor.validate();
  token_buckets.validate();
  if (within) within_options.validate();
  if (spectrum.any()) spectrum.validate();
}

BlockPartition BlockOptions::partition(const ParamSpace& space,
                                       const ModelStructure& structure) const {
  if (groups.empty()) {
    return BlockPartition::by_rule(space, structure, rule);
  }
  return BlockPartition::by_regex(space, groups);
}

std::string BlockOptions::describe() const {
  if (groups.empty()) return BlockPartition::rule_name(rule);
  std::vector<std::string> parts;
  for (const auto& [name, regex] : groups) parts.push_back(name + "=" + regex);
  return "groups:" + fmt::format("{}", fmt::join(parts, ";"));
}

const Table& ProbeJobResult::table(const std::string& path) const {
  const auto it = tables.find(path);
  if (it == tables.end()) {
    throw InvalidArgument(fmt::format("{}: no table {} in the results", output, path));
  }
  return it->second;
}

const Table& ProbeJobResult::unit_table(const std::string& run, int64_t step,
                                        const std::string& direction,
                                        const std::string& name) const {
  return table(unit_path(run, step, direction) + "/" + name);
}

}  // namespace curv
