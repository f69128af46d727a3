// What the Python package holds for one probe: a live module as a PythonObjective, its probe
// batches, the curvature engine over them and the blocks. Every analysis runs at the module's
// current parameters; the engine's cached gradient and kept graphs are dropped as soon as the
// parameters have changed (torch's version counters), so training may go on between calls.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "curv/analysis/spectrum.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "python_objective.h"

namespace curv::python {

struct SessionOptions {
  EngineOptions engine;
  BlockRule block_rule = BlockRule::kLayer;
  // (name, regex) groups in place of the rule; unmatched parameters go to "rest".
  std::vector<std::pair<std::string, std::string>> block_groups;
};

class Session {
 public:
  // `targets`: one tensor per probe batch, whose first dimension is the batch's examples
  // (integer class ids for cross-entropy; the examples' count matters only, for a scalar loss).
  Session(py::object evaluator, const std::vector<std::string>& names, ParamVector params,
          const std::vector<at::Tensor>& targets, bool has_logits, std::string description,
          const std::string& structure_json, SessionOptions options);
  ~Session();

  double loss();
  ParamVector gradient();
  ParamVector hvp(const ParamVector& v);
  TaylorResult audit(const ParamVector& u, const TaylorOptions& options);
  WithinReport within(const ParamVector& u, WithinOptions options);
  std::vector<BucketResult> token_buckets(const ParamVector& u, const TokenBucketOptions& buckets,
                                          const TaylorOptions& options);
  EigenResult eigenvalues(const EigenOptions& options);
  TraceResult trace(const TraceOptions& options);
  DensityResult density(const DensityOptions& options);

  const BlockPartition& blocks() const { return blocks_; }
  const ParamSpace& space() const { return objective_->space(); }
  ModelStructure structure() const { return objective_->structure(); }
  const ProbeSet& probe() const { return probe_; }
  EngineCounters counters() const { return engine_->counters(); }
  std::string describe() const { return objective_->describe(); }
  PythonObjective& objective() { return *objective_; }

  // Runs `body` without the GIL (the objective takes it to call Python), after dropping what the
  // engine cached at parameters that have changed since; re-raises the evaluator's own Python
  // exception when it failed.
  template <class F>
  auto run(F&& body) -> decltype(body());

 private:
  void refresh();
  std::vector<int64_t> versions() const;

  std::unique_ptr<PythonObjective> objective_;
  ProbeSet probe_;
  SessionOptions options_;
  std::unique_ptr<CurvatureEngine> engine_;
  BlockPartition blocks_;
  std::vector<int64_t> versions_;
};

template <class F>
auto Session::run(F&& body) -> decltype(body()) {
  try {
    py::gil_scoped_release release;
    refresh();
    struct Stamp {
      Session* s;
      ~Stamp() { s->versions_ = s->versions(); }
    } stamp{this};
    return body();
  } catch (const ModelError&) {
    objective_->raise_pending();
    throw;
  }
}

}  // namespace curv::python
