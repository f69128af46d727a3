// What a probe job will hold on its device, estimated before anything is allocated: from the
// first checkpoint's tensor index and model config (the model built on the meta device: shapes,
// no storage), the probe set's shapes and the job's options. Each part is a count of elements
// times the bytes of its dtype; the kept graphs' activations are an estimate per token from the
// model's linear maps, attention and vocabulary (docs/performance.md compares it with measured
// peaks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace curv {

struct ProbeJob;

// The phases of a checkpoint's turn that hold different things at once: the units' audits (a
// direction, its realized change), the checkpoint's spectrum (the solver's vectors), and the
// building of a direction (a rebuilt optimizer step's saved state, beside the audit's vectors
// but not during a pass). kBoth: held in every phase.
enum class MemoryPhase { kBoth, kAudit, kSpectrum, kDirection };

struct MemoryPart {
  std::string name;  // "parameters", "kept graphs", ...
  int64_t bytes = 0;
  std::string how;  // how it was counted: "124,439,808 × 2 B (bfloat16)"
  // What lowers it, naming options as check_memory_budget's message lists them ({1}: the
  // micro-batch, {2}: kept graphs, {3}: the vector dtype, {4}: the Krylov basis, {5}: the dtype,
  // {6}: the engine's host copies).
  std::string fix;
  MemoryPhase phase = MemoryPhase::kBoth;
  // Held in host memory instead (EngineOptions::host_copies on a GPU): listed, not counted.
  bool on_host = false;
  // Held only while a pass over the probe set runs (a recomputed graph, the second backward, θ's
  // saved copy, finite differences' gradients): not while a direction is built.
  bool in_passes = false;
};

struct MemoryPlan {
  std::string device;  // where the parts live
  std::vector<MemoryPart> parts;
  // The largest of the phases' sums: what the run holds at its peak.
  int64_t total() const;
  // What `phase` (not kBoth) holds: the parts of kBoth and of the phase; kDirection also holds
  // the audit's parts, but none of those held only during passes.
  int64_t phase_total(MemoryPhase phase) const;
  const MemoryPart& largest() const;  // of the phase that makes the peak
  // One line per part, largest first (its phase where it is held in one only), then each
  // phase's sum and the total, then the parts held in host memory.
  std::string describe() const;
};

// The plan of `job` (ProbeJob::memory_budget plays no part in it).
MemoryPlan plan_probe_job(const ProbeJob& job);

// OutOfMemory naming the total, the budget and the largest part with what lowers it when the
// plan's total exceeds `budget` bytes (> 0).
void check_memory_budget(const MemoryPlan& plan, int64_t budget);

}  // namespace curv
