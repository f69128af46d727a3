// Paired NDS comparisons (--compare): parsing the pairs, and the /comparisons table computed from
// a results file's per-batch terms after the run.
#include <fmt/format.h>

#include <algorithm>

#include "analysis/builtin_analyses.h"
#include "analysis/output_tables.h"
#include "curv/analysis/report.h"
#include "curv/core/error.h"
#include "curv/io/h5_file.h"

namespace curv {

NdsPairSpec NdsPairSpec::parse(const std::string& text) {
  NdsPairSpec spec;
  spec.text = text;
  // A message naming the pair as the option ProbeRunOptions.comparisons, then `rest`.
  const auto invalid = [&](const std::string& rest) {
    return InvalidOption(
        "{0}: " + InvalidOption::literal(rest),
        {{"ProbeRunOptions.comparisons", "'" + InvalidOption::literal(text) + "'"}});
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos || text.find(':', colon + 1) != std::string::npos) {
    throw invalid(
        "expected A:B, each side a direction (adamw.whatif:muon.whatif) or RUN/DIRECTION "
        "(adamw/delta:muon/delta)");
  }
  auto side = [&](const std::string& part, std::string& run, std::string& direction) {
    const auto slash = part.find('/');
    if (slash == std::string::npos) {
      direction = part;
    } else {
      run = part.substr(0, slash);
      direction = part.substr(slash + 1);
      if (run.empty()) {
        throw invalid(fmt::format("empty run name in '{}'", part));
      }
    }
    if (direction.empty() || direction.find('/') != std::string::npos) {
      throw invalid(fmt::format("'{}' is not a direction or RUN/DIRECTION", part));
    }
  };
  side(text.substr(0, colon), spec.run_a, spec.direction_a);
  side(text.substr(colon + 1), spec.run_b, spec.direction_b);
  if (spec.run_a.empty() != spec.run_b.empty()) {
    throw invalid("give a run on both sides (RUN/DIRECTION:RUN/DIRECTION) or on neither");
  }
  return spec;
}

Table paired_comparisons(const std::string& path, const std::vector<NdsPairSpec>& pairs) {
  H5Reader reader(path);
  // Per-batch NDS of a unit with results (false for a missing unit or a status).
  auto batch_nds = [&](const std::string& unit, std::vector<double>& weight,
                       std::vector<double>& nds) {
    if (!reader.exists(unit + "/batches")) return false;
    const double u = reader.attribute_double(unit, "update_norm");
    if (u == 0.0) return false;  // a zero direction has no NDS to compare
    const Table batches = reader.table(unit + "/batches");
    weight = batches.doubles("weight");
    nds = batches.doubles("curvature");
    for (auto& x : nds) x /= u * u;
    return true;
  };
  const std::vector<std::string> runs =
      reader.exists("/runs") ? reader.children("/runs") : std::vector<std::string>{};
  std::vector<ComparisonRow> rows;
  for (const auto& pair : pairs) {
    std::vector<std::pair<std::string, std::string>> run_pairs;
    if (pair.run_a.empty()) {
      for (const auto& r : runs) run_pairs.emplace_back(r, r);
    } else {
      run_pairs.emplace_back(pair.run_a, pair.run_b);
    }
    for (const auto& [ra, rb] : run_pairs) {
      if (!reader.exists("/runs/" + ra)) continue;
      // Steps in increasing order (the file lists its groups by name: step_1000 before step_200).
      std::vector<int64_t> unit_steps;
      for (const auto& child : reader.children("/runs/" + ra)) {
        if (child.rfind("step_", 0) == 0) unit_steps.push_back(std::stoll(child.substr(5)));
      }
      std::sort(unit_steps.begin(), unit_steps.end());
      for (const int64_t step : unit_steps) {
        std::vector<double> wa, na, wb, nb;
        if (!batch_nds(unit_path(ra, step, pair.direction_a), wa, na) ||
            !batch_nds(unit_path(rb, step, pair.direction_b), wb, nb)) {
          continue;
        }
        rows.push_back({pair.text, ra, pair.direction_a, rb, pair.direction_b, step,
                        compare_batch_nds(wa, na, wb, nb)});
      }
    }
  }
  return comparisons_layout().table(rows);
}

namespace {

class ComparisonAnalysis : public UnitAnalysis {
 public:
  explicit ComparisonAnalysis(std::vector<NdsPairSpec> pairs) : pairs_(std::move(pairs)) {}
  std::string name() const override { return "comparisons"; }
  void unit(UnitContext&) override {}
  // From the committed file, so that units finished by earlier (resumed) invocations count.
  bool end_run(ProbeReport& report) override {
    report.root().table(comparisons_layout().spec().name,
                        paired_comparisons(report.path(), pairs_));
    return true;
  }

 private:
  std::vector<NdsPairSpec> pairs_;
};

}  // namespace

std::unique_ptr<UnitAnalysis> make_comparison_analysis(const ProbeRunOptions& options) {
  if (options.comparisons.empty()) return nullptr;
  return std::make_unique<ComparisonAnalysis>(options.comparisons);
}

}  // namespace curv
