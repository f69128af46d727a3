#include "curv/analysis/in_training_probe.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "curv/analysis/report.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"

namespace curv {

void InTrainingProbeOptions::validate() const {
  if (every <= 0)
    throw InvalidArgument(fmt::format("in-training probe: every = {} must be > 0", every));
  taylor.validate();
}

InTrainingProbe::InTrainingProbe(ProbeReport& report, std::string run, BlockPartition blocks,
                                 InTrainingProbeOptions options, std::optional<ProbeSet> probe_set)
    : report_(report),
      run_(std::move(run)),
      blocks_(std::move(blocks)),
      options_(std::move(options)),
      probe_set_(std::move(probe_set)) {
  options_.validate();
}

bool InTrainingProbe::due(int64_t step) const { return step == 0 || step % options_.every == 0; }

TaylorResult InTrainingProbe::measure(Objective& objective, int64_t step,
                                      const ParamVector& theta_before, const ParamVector& update,
                                      const Batch& training_batch) {
  load_parameters(objective, theta_before);
  EngineOptions engine_options;
  engine_options.communicator = options_.communicator;
  const int world = options_.communicator ? options_.communicator->world_size() : 1;
  TaylorResult on_batch;
  {
    CurvatureEngine engine(objective, ProbeSet::shards(training_batch, world), engine_options);
    on_batch = taylor_audit(engine, update, blocks_, options_.taylor);
    if (options_.on_training_batch) {
      report_.add_checkpoint(run_, step, on_batch.loss, norm(engine.gradient()));
      report_.add_taylor(run_, step, "update", on_batch);
      record_precision(report_.unit_group(run_, step, "update"), engine);
    }
  }
  if (probe_set_) {
    CurvatureEngine engine(objective, *probe_set_, engine_options);
    report_.add_taylor(run_, step, "update.probe",
                       taylor_audit(engine, update, blocks_, options_.taylor));
    record_precision(report_.unit_group(run_, step, "update.probe"), engine);
  }
  report_.commit();
  load_parameters(objective, add(theta_before, update));
  return on_batch;
}

}  // namespace curv
