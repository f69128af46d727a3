// The in-training probe shared by curvtrain and custom trainers: it measures the step just taken
// (Taylor audit, NDS, per-block breakdown) every N steps and appends it to a ProbeReport.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "curv/analysis/taylor.h"
#include "curv/core/blocks.h"
#include "curv/core/distributed.h"
#include "curv/core/objective.h"
#include "curv/core/probe_set.h"

namespace curv {

class ProbeReport;

struct InTrainingProbeOptions {
  int64_t every = 100;            // measure update t (0-based) when t % every == 0
  bool on_training_batch = true;  // direction "update": the batch the step was computed on
  TaylorOptions taylor;           // coupling, realized change, multipliers
  // A trainer running under torchrun hands over its ranks: the training batch is then taken as
  // one shard per rank (each rank passes the same whole batch), the fixed probe set's batches are
  // split over the ranks, and the report must have been made with the same communicator.
  std::shared_ptr<Communicator> communicator;
  void validate() const;
};

// Measures updates as they are taken. For each due step it audits u = θ_{t+1} − θ_t at θ_t on the
// training batch (direction "update") and, when a fixed probe set is given, on it too (direction
// "update.probe"), and commits the report.
class InTrainingProbe {
 public:
  InTrainingProbe(ProbeReport& report, std::string run, BlockPartition blocks,
                  InTrainingProbeOptions options, std::optional<ProbeSet> probe_set = std::nullopt);
  bool due(int64_t step) const;
  // `theta_before` = θ_t, `update` = the applied u; the objective's parameters may be anywhere
  // on entry and are left at θ_t + u on return. Returns the training-batch audit.
  TaylorResult measure(Objective& objective, int64_t step, const ParamVector& theta_before,
                       const ParamVector& update, const Batch& training_batch);

 private:
  ProbeReport& report_;
  std::string run_;
  BlockPartition blocks_;
  InTrainingProbeOptions options_;
  std::optional<ProbeSet> probe_set_;
};

}  // namespace curv
