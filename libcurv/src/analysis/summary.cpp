#include "curv/analysis/summary.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "curv/analysis/report.h"
#include "curv/core/statistics.h"
#include "curv/io/h5_file.h"

namespace curv {

std::string summarize_probe_file(const std::string& path) {
  // Per (run, direction): the mean over checkpoints of the whole-model values. Its standard error
  // comes from the per-batch terms: the checkpoints share the probe set, so batch b's mean over
  // checkpoints is one replicate of the whole mean, and the SE over batches counts the
  // checkpoints' shared noise once.
  H5Reader reader(path);
  const Table taylor = reader.table("/taylor");
  struct Acc {
    int n = 0, n_rho = 0, n_real = 0;
    double rho = 0;
    std::vector<double> weight, nds, predicted, realized;  // per batch, summed over checkpoints
  };
  std::map<std::pair<std::string, std::string>, Acc> acc;
  const auto& run = taylor.strings("run");
  const auto& step = taylor.int64s("step");
  const auto& dir = taylor.strings("direction");
  const auto& block = taylor.strings("block");
  const auto& rho = taylor.doubles("rho_within");
  const auto& update_norm = taylor.doubles("update_norm");
  auto add = [](std::vector<double>& sum, const std::vector<double>& x, double scale) {
    if (sum.empty()) sum.assign(x.size(), 0.0);
    for (size_t b = 0; b < x.size() && b < sum.size(); ++b) sum[b] += scale * x[b];
  };
  std::vector<std::string> zero_units;  // audited along a zero direction: no NDS to average
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (block[i] != "total") continue;
    if (update_norm[i] == 0.0) {
      zero_units.push_back(fmt::format("{} step {} {}", run[i], step[i], dir[i]));
      continue;
    }
    auto& a = acc[{run[i], dir[i]}];
    const Table batches = reader.table(unit_path(run[i], step[i], dir[i]) + "/batches");
    const auto& first = batches.doubles("first_order");
    const auto& curvature = batches.doubles("curvature");
    const auto& realized = batches.doubles("realized");
    std::vector<double> predicted(first.size());
    for (size_t b = 0; b < first.size(); ++b) predicted[b] = first[b] + 0.5 * curvature[b];
    a.weight = batches.doubles("weight");
    ++a.n;
    add(a.nds, curvature, 1.0 / (update_norm[i] * update_norm[i]));
    add(a.predicted, predicted, 1.0);
    if (std::isfinite(rho[i])) {
      a.rho += rho[i];
      ++a.n_rho;
    }
    if (std::isfinite(batch_mean(realized, a.weight))) {
      add(a.realized, realized, 1.0);
      ++a.n_real;
    }
  }
  auto mean_pm = [](const std::vector<double>& sum, const std::vector<double>& w, int n) {
    if (n == 0 || sum.empty()) return std::string("n/a");
    const double mean = batch_mean(sum, w) / n, se = batch_stderr(sum, w) / n;
    return fmt::format("{:.4g} ± {:.2g}", mean, se);
  };
  // printf's byte-counted widths; "±" and "ρ" take two bytes each.
  char line[320];
  std::snprintf(line, sizeof line, "%-20s %-16s %5s %22s %10s %23s %23s\n", "run", "direction",
                "ckpts", "mean NDS ± SE", "ρ_within", "predicted ΔL ± SE", "realized ΔL ± SE");
  std::string out = line;
  for (const auto& [key, a] : acc) {
    std::snprintf(line, sizeof line, "%-20s %-16s %5d %22s %9.1f%% %23s %23s\n", key.first.c_str(),
                  key.second.c_str(), a.n, mean_pm(a.nds, a.weight, a.n).c_str(),
                  100 * (a.n_rho ? a.rho / a.n_rho : std::nan("")),
                  mean_pm(a.predicted, a.weight, a.n).c_str(),
                  mean_pm(a.realized, a.weight, a.n_real).c_str());
    out += line;
  }
  if (reader.exists("/comparisons")) {
    const Table c = reader.table("/comparisons");
    if (c.num_rows() > 0) {
      std::snprintf(line, sizeof line, "\n%-34s %8s %24s %24s\n", "paired comparison A:B", "step",
                    "NDS_A / NDS_B ± SE", "NDS_A - NDS_B ± SE");
      out += line;
    }
    const auto& pair = c.strings("pair");
    const auto& run_a = c.strings("run_a");
    const auto& run_b = c.strings("run_b");
    const auto& cstep = c.int64s("step");
    for (size_t i = 0; i < c.num_rows(); ++i) {
      const std::string label = run_a[i] == run_b[i] && pair[i].find('/') == std::string::npos
                                    ? fmt::format("{} ({})", pair[i], run_a[i])
                                    : pair[i];
      const auto pm = [](double x, double se) { return fmt::format("{:.4g} ± {:.2g}", x, se); };
      std::snprintf(line, sizeof line, "%-34s %8lld %24s %24s\n", label.c_str(),
                    static_cast<long long>(cstep[i]),
                    pm(c.doubles("ratio")[i], c.doubles("ratio_stderr")[i]).c_str(),
                    pm(c.doubles("difference")[i], c.doubles("difference_stderr")[i]).c_str());
      out += line;
    }
  }
  if (!zero_units.empty()) {
    out += fmt::format("\n{} unit(s) along a zero direction (NaN NDS, status zero_direction): {}\n",
                       zero_units.size(), fmt::join(zero_units, ", "));
  }
  out += "(± one standard error over probe batches; n/a with a single batch: docs/concepts.md)\n";
  return out;
}

}  // namespace curv
