// Per-unit analyses: what the probe loop computes for each (checkpoint, direction) unit, and once
// per checkpoint or per run around the units. The loop (ProbeRun) calls every analysis the
// options switch on, in registration order, and knows none by name: the Taylor audit, token
// buckets, the within-block breakdown, the spectrum with overlap and the paired comparisons are
// registered here like any other, and a program adds its own with register_unit_analysis.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/param_space.h"

namespace curv {

class BlockPartition;
class CurvatureEngine;
class ProbeReport;
struct ProbeRunOptions;
struct SavedOptimizer;
struct TaylorResult;

// A checkpoint whose parameters are set in the engine, before its directions.
struct CheckpointContext {
  CurvatureEngine& engine;
  const BlockPartition& blocks;
  ProbeReport& report;
  const std::string& run;
  int64_t step;
  // The checkpoint's optimizer state: loaded when a direction or an analysis reads it
  // (reads_saved_state), else empty.
  const SavedOptimizer& saved;
  bool units_pending;  // some direction of this checkpoint is not in the report yet
};

// One unit: a direction u at a checkpoint, for which no results are in the report yet.
struct UnitContext {
  CurvatureEngine& engine;
  const BlockPartition& blocks;
  ProbeReport& report;
  const std::string& run;
  int64_t step;
  const std::string& direction;
  const ParamVector& u;
  // θ + u as a point when the direction has it exactly (Direction::landing: the delta's next
  // checkpoint), else null.
  const ParamVector* landing = nullptr;
  // The unit's Taylor audit, set by the audit (the first analysis) for the analyses after it:
  // they write below the unit's group that it creates.
  const TaylorResult* taylor = nullptr;

  // False along a zero direction, which the analyses after the audit leave alone: they have
  // nothing to break down.
  bool nonzero() const;
};

// What a per-checkpoint step did, for progress, resume and commits.
enum class CheckpointWork {
  kNone,      // nothing (its results are in the report already and no unit needs it)
  kComputed,  // recomputed what the pending units need, wrote nothing
  kWritten,   // wrote its results
};

class UnitAnalysis {
 public:
  virtual ~UnitAnalysis() = default;
  // In progress labels ("run step 100 spectrum") and messages.
  virtual std::string name() const = 0;

  // Once per run, before the first checkpoint: root attributes, checks that need the engine.
  virtual void begin_run(CurvatureEngine& engine, ProbeReport& report);
  // Whether begin_checkpoint reads the checkpoint's optimizer state.
  virtual bool reads_saved_state() const { return false; }
  // True when begin_checkpoint does work of its own that counts as one unit per checkpoint in
  // progress and in ProbeRunSummary (units, skipped); checkpoint_done says whether its results
  // are in the report already.
  virtual bool per_checkpoint() const { return false; }
  virtual bool checkpoint_done(ProbeReport& report, const std::string& run, int64_t step) const;
  // At each checkpoint with pending work, after θ is set and before its directions.
  virtual CheckpointWork begin_checkpoint(CheckpointContext& context);
  // At each unit, after the analyses registered before this one.
  virtual void unit(UnitContext& context) = 0;
  // After the last checkpoint, once everything is committed (results from earlier, resumed
  // invocations included). Returns whether it wrote to the report.
  virtual bool end_run(ProbeReport& report);
};

// The analysis `name` for a run with these options, or null when the options leave it off.
using UnitAnalysisFactory =
    std::function<std::unique_ptr<UnitAnalysis>(const ProbeRunOptions& options)>;

// Registers an analysis after those registered before it (the built-ins first); a taken name is
// replaced in place. Registered analyses other than the built-ins run only when named in
// ProbeRunOptions::analyses; the built-ins when their options switch them on.
void register_unit_analysis(const std::string& name, UnitAnalysisFactory factory,
                            const std::string& help);
// The analyses of a run, in registration order. InvalidOption for a name in options.analyses
// that is not registered, listing the known ones.
std::vector<std::unique_ptr<UnitAnalysis>> make_unit_analyses(const ProbeRunOptions& options);
// Registered names with one-line help, in registration order.
std::vector<std::pair<std::string, std::string>> known_unit_analyses();

}  // namespace curv
