// The learning-rate schedule curvtrain and custom trainers share: linear warm-up, then cosine
// decay to a floor.
#pragma once

#include <cstdint>

namespace curv {

struct ScheduleOptions {
  int64_t total_steps = 1000;
  int64_t warmup_steps = 0;   // linear warm-up from lr/warmup to lr over these steps
  double min_lr_ratio = 0.1;  // cosine decay ends at lr·min_lr_ratio at total_steps
  void validate() const;
};
// Multiplier of the base learning rate for update number `step` (1-based).
double lr_multiplier(const ScheduleOptions& options, int64_t step);

}  // namespace curv
