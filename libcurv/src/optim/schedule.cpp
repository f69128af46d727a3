#include "curv/optim/schedule.h"

#include <fmt/format.h>

#include <cmath>

#include "curv/core/error.h"

namespace curv {

void ScheduleOptions::validate() const {
  if (total_steps <= 0)
    throw InvalidArgument(fmt::format("schedule: total_steps = {} must be > 0", total_steps));
  if (warmup_steps < 0)
    throw InvalidArgument(fmt::format("schedule: warmup_steps = {} must be >= 0", warmup_steps));
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) {
    throw InvalidArgument(
        fmt::format("schedule: min_lr_ratio = {} must be in [0, 1]", min_lr_ratio));
  }
}

double lr_multiplier(const ScheduleOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) {
    return static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  }
  const double span = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
  return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace curv
