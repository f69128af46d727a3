#include "curv/training.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "curv/engine.h"
#include "curv/error.h"
#include "curv/report.h"

namespace curv {

void ScheduleOptions::validate() const {
  if (total_steps <= 0) throw InvalidArgument(fmt::format("schedule: total_steps = {} must be > 0", total_steps));
  if (warmup_steps < 0) throw InvalidArgument(fmt::format("schedule: warmup_steps = {} must be >= 0", warmup_steps));
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) {
    throw InvalidArgument(fmt::format("schedule: min_lr_ratio = {} must be in [0, 1]", min_lr_ratio));
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

void InTrainingProbeOptions::validate() const {
  if (every <= 0) throw InvalidArgument(fmt::format("in-training probe: every = {} must be > 0", every));
  taylor.validate();
}

InTrainingProbe::InTrainingProbe(ProbeReport& report, std::string run, BlockPartition blocks,
                                 InTrainingProbeOptions options, std::optional<ProbeSet> probe_set)
    : report_(report), run_(std::move(run)), blocks_(std::move(blocks)),
      options_(std::move(options)), probe_set_(std::move(probe_set)) {
  options_.validate();
}

bool InTrainingProbe::due(int64_t step) const { return step == 0 || step % options_.every == 0; }

TaylorResult InTrainingProbe::measure(Objective& objective, int64_t step, const ParamVector& theta_before,
                                      const ParamVector& update, const Batch& training_batch) {
  load_parameters(objective, theta_before);
  TaylorResult on_batch;
  {
    CurvatureEngine engine(objective, ProbeSet({training_batch}));
    on_batch = taylor_audit(engine, update, blocks_, options_.taylor);
    if (options_.on_training_batch) {
      report_.add_checkpoint(run_, step, on_batch.loss, norm(engine.gradient()));
      report_.add_taylor(run_, step, "update", on_batch);
    }
  }
  if (probe_set_) {
    CurvatureEngine engine(objective, *probe_set_);
    report_.add_taylor(run_, step, "update.probe", taylor_audit(engine, update, blocks_, options_.taylor));
  }
  report_.commit();
  load_parameters(objective, add(theta_before, update));
  return on_batch;
}

}  // namespace curv
