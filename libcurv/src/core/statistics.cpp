#include "curv/core/statistics.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "curv/core/error.h"

namespace curv {

namespace {

void check_lengths(const std::vector<double>& x, const std::vector<double>& weights,
                   const char* op) {
  if (x.size() != weights.size()) {
    throw InvalidArgument(
        fmt::format("{}: {} batch terms for {} batch weights", op, x.size(), weights.size()));
  }
}

}  // namespace

double batch_mean(const std::vector<double>& x, const std::vector<double>& weights) {
  check_lengths(x, weights, "batch_mean");
  double mean = 0.0;
  for (size_t b = 0; b < x.size(); ++b) mean += weights[b] * x[b];
  return mean;
}

double batch_stderr(const std::vector<double>& x, const std::vector<double>& weights) {
  check_lengths(x, weights, "batch_stderr");
  const size_t B = x.size();
  if (B < 2) return std::numeric_limits<double>::quiet_NaN();
  const double mean = batch_mean(x, weights);
  double sum = 0.0;
  for (size_t b = 0; b < B; ++b) {
    const double d = weights[b] * (x[b] - mean);
    sum += d * d;
  }
  return std::sqrt(static_cast<double>(B) / static_cast<double>(B - 1) * sum);
}

double ratio_stderr(const std::vector<double>& a, const std::vector<double>& c,
                    const std::vector<double>& weights) {
  check_lengths(a, weights, "ratio_stderr");
  check_lengths(c, weights, "ratio_stderr");
  const double c_mean = batch_mean(c, weights);
  if (a.size() < 2 || c_mean == 0.0) return std::numeric_limits<double>::quiet_NaN();
  const double ratio = batch_mean(a, weights) / c_mean;
  std::vector<double> z(a.size());
  for (size_t b = 0; b < a.size(); ++b) z[b] = (a[b] - ratio * c[b]) / c_mean;
  return batch_stderr(z, weights);
}

}  // namespace curv
