#include "curv/analysis/unit_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "analysis/builtin_analyses.h"
#include "curv/analysis/taylor.h"
#include "curv/core/error.h"

namespace curv {

bool UnitContext::nonzero() const { return taylor && taylor->status == AuditStatus::kComplete; }

void UnitAnalysis::begin_run(CurvatureEngine&, ProbeReport&) {}

bool UnitAnalysis::checkpoint_done(ProbeReport&, const std::string&, int64_t) const { return true; }

CheckpointWork UnitAnalysis::begin_checkpoint(CheckpointContext&) { return CheckpointWork::kNone; }

bool UnitAnalysis::end_run(ProbeReport&) { return false; }

namespace {

struct Entry {
  std::string name;
  UnitAnalysisFactory factory;
  std::string help;
  bool builtin = false;
};

std::mutex registry_mutex;

std::vector<Entry>& registry() {
  static std::vector<Entry> entries = {
      {"taylor", make_taylor_analysis,
       "Taylor audit, NDS, block coupling and the Gauss-Newton split (always)", true},
      {"token_buckets", make_token_bucket_analysis,
       "the audit per token-frequency bucket (ProbeRunOptions.token_buckets)", true},
      {"within", make_within_analysis,
       "singular-mode and group curvature within matrices (ProbeRunOptions.within)", true},
      {"spectrum", make_spectrum_analysis,
       "eigenvalues, trace, density, preconditioned sharpness per checkpoint; overlap per unit "
       "(ProbeRunOptions.spectrum)",
       true},
      {"comparisons", make_comparison_analysis,
       "paired NDS comparisons (ProbeRunOptions.comparisons)", true},
  };
  return entries;
}

}  // namespace

void register_unit_analysis(const std::string& name, UnitAnalysisFactory factory,
                            const std::string& help) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& entries = registry();
  const auto it =
      std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.name == name; });
  if (it != entries.end()) {
    *it = Entry{name, std::move(factory), help, it->builtin};
  } else {
    entries.push_back(Entry{name, std::move(factory), help, false});
  }
}

std::vector<std::unique_ptr<UnitAnalysis>> make_unit_analyses(const ProbeRunOptions& options) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto& entries = registry();
  for (const auto& name : options.analyses) {
    const bool known = std::any_of(entries.begin(), entries.end(),
                                   [&](const Entry& e) { return !e.builtin && e.name == name; });
    if (!known) {
      std::vector<std::string> names;
      for (const auto& e : entries) {
        if (!e.builtin) names.push_back(e.name);
      }
      throw InvalidOption(
          fmt::format("{{0}}: no registered analysis '{}' (registered: {})",
                      InvalidOption::literal(name),
                      names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))),
          {{"ProbeRunOptions.analyses", ""}});
    }
  }
  std::vector<std::unique_ptr<UnitAnalysis>> out;
  for (const auto& e : entries) {
    const bool wanted = e.builtin || std::find(options.analyses.begin(), options.analyses.end(),
                                               e.name) != options.analyses.end();
    if (!wanted) continue;
    if (auto analysis = e.factory(options)) out.push_back(std::move(analysis));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> known_unit_analyses() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : registry()) out.emplace_back(e.name, e.help);
  return out;
}

}  // namespace curv
