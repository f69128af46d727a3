#include "curv/core/frequency_buckets.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "curv/core/error.h"

namespace curv {

at::Tensor head_tail_buckets(const std::vector<double>& probabilities, double head_mass,
                             const std::string& what) {
  if (!(head_mass > 0 && head_mass <= 1)) {
    throw InvalidArgument(fmt::format("{}: head_mass = {} must be in (0, 1]", what, head_mass));
  }
  const auto n = static_cast<int64_t>(probabilities.size());
  std::vector<int64_t> order(probabilities.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  // Ties broken by id, so the buckets are a function of the probabilities alone.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return probabilities[a] > probabilities[b]; });
  const double total = std::accumulate(probabilities.begin(), probabilities.end(), 0.0);
  // A head that holds head_mass up to rounding is complete (e.g. 8 of 16 equal classes for 0.5).
  const double target = head_mass * total * (1 - 1e-12);
  auto buckets = at::full({n}, kTailBucket, at::kLong);
  auto* b = buckets.data_ptr<int64_t>();
  double mass = 0;
  for (auto id : order) {
    if (probabilities[id] <= 0 || mass >= target) break;
    b[id] = kHeadBucket;
    mass += probabilities[id];
  }
  return buckets;
}

at::Tensor quantile_buckets(const std::vector<double>& probabilities, int64_t buckets,
                            const std::string& what) {
  if (buckets < 2) {
    throw InvalidArgument(fmt::format("{}: {} buckets; at least 2 are needed", what, buckets));
  }
  const double total = std::accumulate(probabilities.begin(), probabilities.end(), 0.0);
  if (!(total > 0)) throw InvalidArgument(fmt::format("{}: the total mass is {}", what, total));
  const auto n = static_cast<int64_t>(probabilities.size());
  std::vector<int64_t> order(probabilities.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return probabilities[a] > probabilities[b]; });
  auto out = at::full({n}, buckets - 1, at::kLong);
  auto* b = out.data_ptr<int64_t>();
  double before = 0;  // mass of the ids ranked above this one
  for (auto id : order) {
    if (probabilities[id] <= 0) break;
    // The bucket that holds the middle of the id's mass in the ranked order.
    const double middle = (before + 0.5 * probabilities[id]) / total;
    b[id] = std::min<int64_t>(
        buckets - 1, static_cast<int64_t>(std::floor(static_cast<double>(buckets) * middle)));
    before += probabilities[id];
  }
  return out;
}

}  // namespace curv
