// Directions u in parameter space along which curvature is audited: the interface, what a
// direction may draw on at a checkpoint, and the built-in deltas, negative gradient and seeded
// random baselines. Optimizer steps implement it in optim/; analysis/direction_registry.h names
// them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "curv/core/param_space.h"

namespace curv {

class CurvatureEngine;
struct SavedOptimizer;

// Everything a direction may draw on at one checkpoint.
struct DirectionContext {
  CurvatureEngine* engine = nullptr;  // at θ_t; gives g and the probe set
  // θ_t's checkpoint's optimizer state and record (io's saved_optimizer(ckpt)); may be null.
  const SavedOptimizer* saved = nullptr;
  ParamVector theta;  // θ_t
  // θ_{t+1}, empty when there is no next checkpoint; in host memory when the engine keeps host
  // copies on a GPU (EngineOptions::host_copies): sub() and the engine's point evaluations take it
  // there, tensor by tensor.
  ParamVector theta_next;
  // Blocks (groups of parameter indices) for directions that work block by block; empty means
  // one block per tensor.
  std::vector<std::vector<size_t>> blocks;
  int64_t step = 0;   // t
  uint64_t seed = 0;  // run seed; directions derive their own streams from it
  // Optimizer directions whose checkpoint lacks usable saved state take a what-if step from
  // fresh state instead of failing (and say so in `note`).
  bool whatif_fallback = false;
  std::string note;  // set by compute(): how the direction was obtained
  // Set by optimizer directions: the rule applied to each parameter ("muon", "adamw", ...).
  std::vector<std::string> partition;
  // Set by directions rebuilt from saved state: the rule, and how it was chosen ("recorded in
  // meta.json", "recognised by keys: ...", "named by the user (adam)").
  std::string optimizer_rule, optimizer_recognition;
};

class Direction {
 public:
  virtual ~Direction() = default;
  // The name written to the output, e.g. "delta", "adamw", "muon.whatif".
  virtual std::string name() const = 0;
  // "" when the direction can be computed in this context, else the reason it cannot (written to
  // the output's status table).
  virtual std::string unavailable(const DirectionContext&) const { return ""; }
  // The displacement u (θ_t + u is where the step lands).
  virtual ParamVector compute(DirectionContext& context) = 0;
  // Whether compute() or unavailable() reads context.saved: a loop that runs only directions
  // that do not skips loading the checkpoint's optimizer state. True unless a direction says
  // otherwise, so that a registered direction is never starved of it.
  virtual bool reads_saved_state() const { return true; }
  // Whether it reads context.theta_next: otherwise the loop does not load the next checkpoint.
  virtual bool reads_next_checkpoint() const { return true; }
  // θ + u as a point, where the direction has it exactly (the delta: the next checkpoint's
  // parameters), else null. L(θ + u) is then evaluated there, and serves as that checkpoint's
  // loss too.
  virtual const ParamVector* landing(const DirectionContext&) const { return nullptr; }
};

// Builds a direction from its spec ("adamw", "muon.whatif:match=1"): what a family registers.
using DirectionFactory = std::function<std::unique_ptr<Direction>(const std::string& spec)>;

// Built-ins, exposed for direct use.
std::unique_ptr<Direction> make_delta_direction();     // θ_{t+1} − θ_t
std::unique_ptr<Direction> make_gradient_direction();  // −g
// Seeded Gaussian, rescaled block by block to the norms of a reference direction: the delta when
// a next checkpoint exists, else −g. `blocks` are groups of parameter indices; empty takes the
// context's blocks (one per tensor when those are empty too).
std::unique_ptr<Direction> make_random_direction(std::vector<std::vector<size_t>> blocks);

}  // namespace curv
