// The probe loop behind ndsprobe, as a library call: for every run, every selected checkpoint
// and every direction, the unit analyses the options switch on (unit_analysis.h: the Taylor
// audit, token buckets, within-block breakdown, eigenspace overlap; the Hessian spectrum once per
// checkpoint), each unit committed to a ProbeReport so that a killed run resumes where it stopped
// (commit_if_due: the commits' share of the run time stays small however large the file grows).
// Custom drivers run the same loop on their own engine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "curv/analysis/report.h"
#include "curv/analysis/spectrum.h"
#include "curv/analysis/taylor.h"
#include "curv/analysis/token_buckets.h"
#include "curv/analysis/within.h"
#include "curv/core/blocks.h"
#include "curv/core/engine.h"
#include "curv/core/precision.h"
#include "curv/core/progress.h"
#include "curv/io/checkpoint.h"
#include "curv/io/probe_data.h"
#include "curv/models/model_loader.h"

namespace curv {

class CheckpointReader;
class Direction;
class UnitAnalysis;

// What is computed once per checkpoint besides the directions (docs/cli.md, "Spectrum").
struct CheckpointSpectrumOptions {
  bool eigenvalues = false;        // extreme eigenpairs of H (`eigen`)
  bool per_block = false;          // also eigenpairs and traces of each block's H_ll
  bool trace = false;              // trace of H (`trace_options`)
  bool density = false;            // spectral density by SLQ (`density_options`)
  bool precond_sharpness = false;  // λ_max of Adam's preconditioned H, from the saved state
  bool overlap = false;            // per direction: share of ‖u‖² in the top eigenspace
  EigenOptions eigen;              // eigen.top also sets the eigenspace of `overlap`
  TraceOptions trace_options;
  DensityOptions density_options;

  bool any() const { return eigenvalues || trace || density || precond_sharpness || overlap; }
  // The option structs of what is switched on; `overlap` needs eigen.top >= 1.
  void validate() const;
};

// A paired NDS comparison `--compare A:B`: each side a direction name as written in the output,
// optionally prefixed by a run name ("muon/delta"). Without runs it applies within every run;
// with runs it pairs the two runs' units at equal steps. Both sides see the same probe batches.
struct NdsPairSpec {
  std::string run_a, direction_a, run_b, direction_b;  // empty run = every run
  std::string text;                                    // as given, for messages and the output
  static NdsPairSpec parse(const std::string& text);   // InvalidArgument naming the text
};

// The loop's choices, independent of how the model and the probe set were obtained.
struct ProbeRunOptions {
  std::vector<std::string> runs;  // checkpoint directories, one run each
  CheckpointLayout layout = CheckpointLayout::kAuto;
  ParamOrderSpec param_order;  // how a torch optimizer's indices map to names
  // The optimizer that saved the runs' states, as a spec (OptimizerConfig::parse: "adam",
  // "muon:ns_steps=5"): checked against each state instead of recognising it by its keys, its
  // key=values over the saved hyper-parameters; "" recognises (name_optimizer).
  std::string optimizer;
  StepSelection steps;       // which checkpoints of each run
  bool allow_extra = false;  // ignore checkpoint tensors that are not model parameters
  // Direction specs (analysis/direction_registry.h), each at most once.
  std::vector<std::string> directions = {"delta", "gradient", "random"};
  // Optimizer directions without usable saved state take a what-if step instead of failing.
  bool whatif_fallback = false;
  TaylorOptions taylor;
  bool within = false;  // within-block breakdown of each direction (`within_options`)
  WithinOptions within_options;
  // Head groups use the attention heads of the model's structure (Objective::structure()), in
  // place of within_options.n_head; false keeps within_options.n_head as given.
  bool within_heads_from_model = true;
  CheckpointSpectrumOptions spectrum;
  // Token-frequency buckets: each direction's audit also per bucket of target tokens, built once
  // from the probe set (or a counts file) and written to the unit's token_buckets table.
  TokenBucketOptions token_buckets;
  std::vector<NdsPairSpec> comparisons;  // written to /comparisons after the loop
  uint64_t seed = 0;                     // seeds random directions and every estimator
  // Analyses registered with register_unit_analysis to run beside the built-ins, by name
  // (curv/analysis/unit_analysis.h); the built-ins follow the options above.
  std::vector<std::string> analyses;
  // Read the checkpoints the next turn of the loop needs on background threads while the current
  // one's units compute, and keep the delta's successor read for its own turn: each file read
  // once, its reading hidden behind the HVPs. Off on the CPU when the engine has a memory bound
  // (EngineOptions::max_memory).
  bool prefetch = true;
  // The host bytes the checkpoints read ahead may hold (their model tensors): a checkpoint that
  // does not fit is only opened ahead (its listing and optimizer state) and its model read into
  // the parameters at its turn, tensor by tensor. 0: none held.
  int64_t prefetch_bytes = int64_t{4} << 30;
  // The checkpoint digest that guards --resume: every byte of every file (true), or what the
  // files record about themselves (false: DigestKind::kRecorded, a few kilobytes per file).
  bool full_digest = false;
  // Float32 matrix products during execute() (curv/core/precision.h). Below kHighest, each run's
  // first probed checkpoint records matmul_precision_error's relative errors as its attributes.
  MatmulPrecision matmul_precision = MatmulPrecision::kHighest;

  void validate() const;  // InvalidArgument naming the field and value
};

// One run as the loop sees it: its name in the output and its checkpoints.
struct ProbeRunSource {
  std::string name;  // the directory's name, made unique ("run", "run.2")
  std::string dir;
  std::vector<CheckpointInfo> all;     // every checkpoint (the delta goes to the next one)
  std::vector<CheckpointInfo> chosen;  // the selection to probe
};

struct ProbeRunSummary {
  size_t units = 0;    // (checkpoint, direction) units and checkpoint spectra in the plan
  size_t skipped = 0;  // already in the output (resume)
  // Units audited along a zero direction (AuditStatus::kZeroDirection: NaN ratios, run goes on).
  size_t zero_directions = 0;
  // The most bytes the device's tensors held in any unit (a checkpoint's gradient pass counted);
  // -1 where the device keeps no statistics (the CPU).
  int64_t peak_memory = -1;
  // Checkpoint loads served by a read made ahead (ProbeRunOptions::prefetch): in the background,
  // or kept from the delta's read of its successor.
  int64_t checkpoints_read_ahead = 0;
  EngineCounters counters;
};

class ProbeRun {
 public:
  // Validates the options, builds the directions and lists every run's checkpoints: every
  // error that needs no model surfaces here, before any compute.
  explicit ProbeRun(ProbeRunOptions options);
  ~ProbeRun();
  ProbeRun(const ProbeRun&) = delete;
  ProbeRun& operator=(const ProbeRun&) = delete;

  const ProbeRunOptions& options() const { return options_; }
  const std::vector<ProbeRunSource>& runs() const { return runs_; }
  size_t units() const;  // what progress counts to

  // Probes every selected checkpoint of every run at the engine's objective and probe set and
  // commits each unit to `report` (skipping units already there) with ProbeReport::commit_if_due;
  // everything is committed before it returns, and before an exception from `progress` (a stop
  // signal in a tool) leaves it.
  ProbeRunSummary execute(CurvatureEngine& engine, const BlockPartition& blocks,
                          ProbeReport& report, const ProgressCallback& progress = {});

  // Hands over a checkpoint the caller has read already with CheckpointParts::kModelOnly (as
  // run_probe_job reads the first to build the model), so that execute() reads it no more. A
  // no-op without ProbeRunOptions::prefetch.
  void keep_checkpoint(const CheckpointInfo& info, Checkpoint ckpt);

 private:
  struct Pass;
  struct CheckpointState;
  struct CheckpointNeeds;
  size_t units_per_checkpoint() const;  // directions and per-checkpoint analyses
  // What is left to do at a checkpoint, and which of its files that needs.
  CheckpointNeeds needs_of(const ProbeRunSource& run, const CheckpointInfo& info,
                           ProbeReport& report) const;
  // `next`: the checkpoint probed after this one, read ahead (nullptr: none).
  void probe_checkpoint(const ProbeRunSource& run, const CheckpointInfo& info,
                        const CheckpointInfo* next, Pass& pass);
  // Reads what `needs` (needs_of for this checkpoint) asks for and sets the engine's parameters.
  void load_checkpoint_state(const ProbeRunSource& run, const CheckpointInfo& info,
                             const CheckpointNeeds& needs, Pass& pass,
                             CheckpointState& state) const;
  void read_ahead(const ProbeRunSource& run, const CheckpointInfo* next, Pass& pass) const;
  void probe_unit(const ProbeRunSource& run, const CheckpointInfo& info, size_t k,
                  CheckpointState& state, Pass& pass);

  ProbeRunOptions options_;
  std::vector<std::unique_ptr<Direction>> directions_;
  std::vector<std::unique_ptr<UnitAnalysis>> analyses_;  // in the order they run
  std::vector<ProbeRunSource> runs_;
  std::unique_ptr<CheckpointReader> reader_;
};

// Blocks by rule ("layer", "tensor", "whole") or, when `groups` is not empty, by NAME=REGEX
// groups (unmatched parameters go to "rest").
struct BlockOptions {
  BlockRule rule = BlockRule::kLayer;
  std::vector<std::pair<std::string, std::string>> groups;
  // Rules read the parameters' roles in `structure` (the objective's structure()).
  BlockPartition partition(const ParamSpace& space, const ModelStructure& structure) const;
  std::string describe() const;  // "layer" or "groups:name=regex;..." (provenance)
};

// Everything ndsprobe does, from files: the model (ModelSource, or the checkpoints' recorded
// config), the probe data, the engine, the report with its provenance, then the loop.
struct ProbeJob {
  ProbeRunOptions run;
  ModelSource model;
  ProbeDataSource data;
  BlockOptions blocks;
  EngineOptions engine;
  std::string output = "ndsprobe.h5";
  bool resume = false;  // keep results already in `output` and skip finished units
  // Refuse to start when the memory plan (plan_probe_job, analysis/memory_plan.h) exceeds this
  // many bytes of the device, naming its largest part (OutOfMemory); 0: no bound.
  int64_t memory_budget = 0;
  // Tool, version, command line, dtype, seed and threads (make_provenance); run_probe_job adds
  // the model, the probe set and the blocks.
  Provenance provenance;
};

struct ProbeJobResult {
  ProbeRunSummary summary;
  std::string output;
  // Every table of the output as written, by its path in the file (docs/hdf5-schema.md): the long
  // tables "/taylor", "/status", "/token_buckets", "/comparisons", and each unit's and
  // checkpoint's, "/runs/<run>/step_<N>/<direction>/blocks", ".../batches", ".../multipliers",
  // ".../within/<param>/modes", ".../spectrum/eigen", ...: the columns, order and units the file
  // gives them, so a program reads its results without opening the file. A resumed job's hold the
  // units finished before it too. Held on rank 0 only (empty on the others).
  std::map<std::string, Table> tables;

  // The table at `path`; InvalidArgument naming it and the output when there is none.
  const Table& table(const std::string& path) const;
  // One unit's table: `name` is "blocks", "batches", "within/<param>/modes", ... below the unit's
  // group; InvalidArgument as table().
  const Table& unit_table(const std::string& run, int64_t step, const std::string& direction,
                          const std::string& name) const;
};

ProbeJobResult run_probe_job(const ProbeJob& job, const ProgressCallback& progress = {});

// The paired comparisons of a results file, from the units' per-batch terms: one row per pair and
// step where both units have results (columns in docs/hdf5-schema.md, "/comparisons").
Table paired_comparisons(const std::string& path, const std::vector<NdsPairSpec>& pairs);

}  // namespace curv
