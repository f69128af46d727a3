#include "curv/analysis/probe_run.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "analysis/checkpoint_reader.h"
#include "curv/analysis/direction_registry.h"
#include "curv/analysis/memory_plan.h"
#include "curv/analysis/unit_analysis.h"
#include "curv/core/directions.h"
#include "curv/core/distributed.h"
#include "curv/core/error.h"
#include "curv/core/runtime.h"
#include "curv/io/h5_file.h"
#include "curv/optim/optimizers.h"

namespace fs = std::filesystem;

namespace curv {

namespace {

// Run names from directory names, made unique ("run", "run.2", ...).
std::vector<std::string> run_names(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  std::map<std::string, int> seen;
  for (const auto& d : dirs) {
    std::string name = fs::path(d).lexically_normal().filename().string();
    if (name.empty() || name == ".") {
      name = fs::path(d).lexically_normal().parent_path().filename().string();
    }
    if (name.empty() || name == "." || name == "..") name = "run";
    const int n = ++seen[name];
    out.push_back(n == 1 ? name : fmt::format("{}.{}", name, n));
  }
  return out;
}

// Fails before any compute is spent when the output cannot be written.
void check_writable(const std::string& path) {
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : ".";
  if (!fs::is_directory(parent)) {
    throw InvalidArgument(
        fmt::format("output '{}': directory '{}' does not exist", path, parent.string()));
  }
  if (fs::is_directory(path))
    throw InvalidArgument(fmt::format("output '{}' is a directory", path));
  const fs::path probe = parent / fmt::format(".ndsprobe-write-test-{}", ::getpid());
  std::ofstream out(probe);
  if (!out) {
    throw InvalidArgument(
        fmt::format("output '{}': cannot write in directory '{}'", path, parent.string()));
  }
  out.close();
  fs::remove(probe);
}

// The progress callback is where a tool stops the run (a stop signal throws from it): units not
// yet in the file are committed first, so that the output holds every finished unit.
void report_progress(const ProgressCallback& progress, ProbeReport& report, size_t done,
                     size_t total, const std::string& label) {
  if (!progress) return;
  try {
    progress(done, total, label);
  } catch (...) {
    if (report.has_uncommitted()) report.commit();
    throw;
  }
}

// Runs one unit's work from a fresh peak of device memory and returns the unit's peak (-1 where
// the device keeps no statistics); an OutOfMemory leaves naming the unit and how to go on.
template <class Work>
int64_t as_unit(const std::string& label, const std::string& path, const c10::Device& device,
                Work&& work) {
  reset_peak_memory(device);
  try {
    work();
    return device_memory(device).peak;
  } catch (const OutOfMemory& e) {
    // The engine's message names the options that lower memory; resuming is one more.
    std::vector<NamedOption> options = e.options();
    options.push_back({"ProbeJob.resume", ""});
    throw OutOfMemory(
        Error::literal(label) + ": " + e.text() +
            Error::literal(fmt::format(" (every unit finished before it is in {}: ", path)) +
            fmt::format("the same run with {{{}}} completes it)", options.size() - 1),
        options);
  }
}

}  // namespace

ProbeRun::ProbeRun(ProbeRunOptions options) : options_(std::move(options)) {
  options_.validate();
  std::set<std::string> seen;
  for (const auto& spec : options_.directions) {
    directions_.push_back(make_direction(spec));
    if (!seen.insert(directions_.back()->name()).second) {
      throw InvalidOption("{0} lists '" + InvalidOption::literal(spec) + "' twice",
                          {{"ProbeRunOptions.directions", ""}});
    }
  }
  const auto names = run_names(options_.runs);
  for (size_t r = 0; r < options_.runs.size(); ++r) {
    ProbeRunSource source;
    source.name = names[r];
    source.dir = options_.runs[r];
    source.all = list_checkpoints(source.dir, {}, options_.layout);
    source.chosen = options_.steps.select(source.all);
    if (source.chosen.empty()) {
      throw InvalidArgument(fmt::format("no checkpoint of '{}' in the selection {}", source.dir,
                                        options_.steps.describe()));
    }
    runs_.push_back(std::move(source));
  }
  // Every name a comparison uses must be one this invocation writes.
  for (const auto& pair : options_.comparisons) {
    for (const auto* direction : {&pair.direction_a, &pair.direction_b}) {
      if (!seen.count(*direction)) {
        std::vector<std::string> names(seen.begin(), seen.end());
        throw InvalidOption(
            "{0}: " + InvalidOption::literal(fmt::format("no direction '{}' among {}", *direction,
                                                         fmt::join(names, ", "))),
            {{"ProbeRunOptions.comparisons", "'" + InvalidOption::literal(pair.text) + "'"}});
      }
    }
    for (const auto* run : {&pair.run_a, &pair.run_b}) {
      if (run->empty()) continue;
      bool found = false;
      for (const auto& r : runs_) found = found || r.name == *run;
      if (!found) {
        std::vector<std::string> names;
        for (const auto& r : runs_) names.push_back(r.name);
        throw InvalidOption(
            "{0}: " + InvalidOption::literal(
                          fmt::format("no run '{}' among {}", *run, fmt::join(names, ", "))),
            {{"ProbeRunOptions.comparisons", "'" + InvalidOption::literal(pair.text) + "'"}});
      }
    }
  }
  analyses_ = make_unit_analyses(options_);
  reader_ = std::make_unique<CheckpointReader>(
      options_.prefetch, options_.prefetch_bytes,
      options_.full_digest ? DigestKind::kFull : DigestKind::kRecorded);
}

void ProbeRun::keep_checkpoint(const CheckpointInfo& info, Checkpoint ckpt) {
  reader_->keep(info, CheckpointParts::kModelOnly, std::move(ckpt));
}

ProbeRun::~ProbeRun() = default;

size_t ProbeRun::units() const {
  size_t total = 0;
  for (const auto& run : runs_) total += run.chosen.size() * units_per_checkpoint();
  return total;
}

size_t ProbeRun::units_per_checkpoint() const {
  size_t n = directions_.size();
  for (const auto& a : analyses_) n += a->per_checkpoint() ? 1 : 0;
  return n;
}

// What one execute() shares between its checkpoints and units.
struct ProbeRun::Pass {
  CurvatureEngine& engine;
  const BlockPartition& blocks;
  ProbeReport& report;
  const ProgressCallback& progress;
  ProbeRunSummary summary;
  size_t done = 0;  // units finished or skipped, for progress
  CheckpointReader& reader;
  std::set<std::string> precision_measured;  // runs whose reduced precision's error is written
  // L(θ_next) of a (run, step) that a unit's Taylor audit evaluated where the delta lands: the
  // loss that checkpoint records, when its own turn needs no gradient pass (a run's last).
  std::map<std::pair<std::string, int64_t>, double> landed_loss;

  void advance(const std::string& label) {
    report_progress(progress, report, ++done, summary.units, label);
  }
};

// A checkpoint being probed: its tensors, its optimizer state and the directions' view of it.
struct ProbeRun::CheckpointState {
  Checkpoint ckpt;
  SavedOptimizer saved;
  DirectionContext context;
  size_t last_state_reader = 0;  // the last pending direction that reads the optimizer state

  // Once the last direction that reads the optimizer state has its u, the audits run without it.
  void release_state() {
    saved.state = ckpt.optimizer_source = nullptr;
    ckpt.optimizer.clear();
  }
};

ProbeRunSummary ProbeRun::execute(CurvatureEngine& engine, const BlockPartition& blocks,
                                  ProbeReport& report, const ProgressCallback& progress) {
  const bool prefetch =
      options_.prefetch && !(engine.device().is_cpu() && engine.options().max_memory > 0);
  reader_->set_prefetch(prefetch);
  const ScopedMatmulPrecision precision(options_.matmul_precision);
  Pass pass{engine, blocks, report, progress, {}, 0, *reader_, {}, {}};
  pass.summary.units = units();
  for (const auto& a : analyses_) a->begin_run(engine, report);
  try {
    for (const auto& run : runs_) {
      report.set_run_attribute(run.name, "path", fs::absolute(run.dir).string());
      report.set_run_attribute(run.name, "layout", layout_name(run.all.front().layout));
      // The first checkpoint's digest and tensors (and its successor's) on threads of their own,
      // so that the digest's pass over the files runs beside the reads.
      read_ahead(run, run.chosen.empty() ? nullptr : &run.chosen.front(), pass);
      for (size_t c = 0; c < run.chosen.size(); ++c) {
        probe_checkpoint(run, run.chosen[c],
                         c + 1 < run.chosen.size() ? &run.chosen[c + 1] : nullptr, pass);
      }
    }
  } catch (...) {
    // Keeps the finished units of a run that fails. Not with several ranks: the failure may be
    // one rank's alone, and a commit is a collective.
    if (report.has_uncommitted() && !engine.communicator().distributed()) {
      try {
        report.commit();
      } catch (const std::exception&) {
        // The original failure is the one to report (this commit fails when the disk is full).
      }
    }
    throw;
  }
  report.commit();
  bool wrote = false;
  for (const auto& a : analyses_) wrote = a->end_run(report) || wrote;
  if (wrote) report.commit();
  pass.summary.counters = engine.counters();
  pass.summary.checkpoints_read_ahead = pass.reader.reads_saved();
  return pass.summary;
}

struct ProbeRun::CheckpointNeeds {
  bool units_pending = false;  // a direction's unit is not in the report yet
  bool all_done = false;       // nor is anything else left to do here
  bool state = false;          // a pending unit or analysis reads the optimizer state
  bool next = false;           // a pending direction reads the next checkpoint (the delta)
  size_t last_state_reader = 0;

  CheckpointParts parts() const {
    return state ? CheckpointParts::kAll : CheckpointParts::kModelOnly;
  }
};

ProbeRun::CheckpointNeeds ProbeRun::needs_of(const ProbeRunSource& run, const CheckpointInfo& info,
                                             ProbeReport& report) const {
  CheckpointNeeds n;
  n.last_state_reader = directions_.size();
  for (size_t k = 0; k < directions_.size(); ++k) {
    if (report.done(run.name, info.step, directions_[k]->name())) continue;
    n.units_pending = true;
    if (directions_[k]->reads_saved_state()) {
      n.state = true;
      n.last_state_reader = k;
    }
    n.next = n.next || directions_[k]->reads_next_checkpoint();
  }
  // Adam-type state is twice the parameters: read only when something here uses it.
  for (const auto& a : analyses_) n.state = n.state || a->reads_saved_state();
  n.all_done = !n.units_pending;
  for (const auto& a : analyses_) {
    if (a->per_checkpoint())
      n.all_done = n.all_done && a->checkpoint_done(report, run.name, info.step);
  }
  return n;
}

namespace {

// The checkpoint after `info` in its run, where the delta goes; nullptr for the last.
const CheckpointInfo* successor(const ProbeRunSource& run, const CheckpointInfo& info) {
  for (size_t k = 0; k + 1 < run.all.size(); ++k) {
    if (run.all[k].step == info.step) return &run.all[k + 1];
  }
  return nullptr;
}

// What the next checkpoint's parameters are read like: the model's dtype and device, or the
// host with EngineOptions::host_copies on a GPU (parameters_from reads only their dtype and
// device, so empty tensors serve).
ParamVector next_checkpoint_like(const CurvatureEngine& engine, const ParamVector& like) {
  if (!engine.options().host_copies || like.empty() || like.front().device().is_cpu()) return like;
  ParamVector host;
  host.reserve(like.size());
  for (const auto& t : like) host.push_back(at::empty({0}, t.options().device(at::kCPU)));
  return host;
}

}  // namespace

void ProbeRun::read_ahead(const ProbeRunSource& run, const CheckpointInfo* next, Pass& pass) const {
  CheckpointReader& reader = pass.reader;
  if (!reader.prefetching()) return;
  std::set<std::string> wanted;
  if (next != nullptr) {
    const CheckpointNeeds n = needs_of(run, *next, pass.report);
    if (!n.all_done) {
      reader.prefetch(*next, n.parts(), /*with_digest=*/true);
      wanted.insert(next->path);
      const CheckpointInfo* after = n.next ? successor(run, *next) : nullptr;
      if (after != nullptr) {
        reader.prefetch(*after, CheckpointParts::kModelOnly, /*with_digest=*/false);
        wanted.insert(after->path);
      }
    }
  }
  reader.retain(wanted);
}

void ProbeRun::probe_checkpoint(const ProbeRunSource& run, const CheckpointInfo& info,
                                const CheckpointInfo* next, Pass& pass) {
  ProbeReport& report = pass.report;
  CurvatureEngine& engine = pass.engine;
  // Results already in the file belong to the checkpoint as it was then: a checkpoint that
  // changed since (overwritten, re-saved by a resumed training run) is refused by name.
  const std::string recorded = report.checkpoint_digest(run.name, info.step);
  const std::string digest = pass.reader.digest(info, recorded);
  if (!recorded.empty() && recorded != digest) {
    throw InvalidArgument(
        InvalidOption::literal(
            fmt::format("cannot resume '{}': checkpoint '{}' (run '{}', step {}) changed since its "
                        "results were "
                        "written (then {}, now {}); write to a new file, or start over without ",
                        report.path(), info.path, run.name, info.step, recorded, digest)) +
            "{0}",
        {{"ProbeJob.resume", ""}});
  }
  const CheckpointNeeds needs = needs_of(run, info, report);
  if (needs.all_done) {
    pass.done += units_per_checkpoint();
    pass.summary.skipped += units_per_checkpoint();
    report_progress(pass.progress, report, pass.done, pass.summary.units,
                    fmt::format("{} step {} (already in output)", run.name, info.step));
    return;
  }
  CheckpointState state;
  load_checkpoint_state(run, info, needs, pass, state);
  read_ahead(run, next, pass);
  // The gradient pass (with its kept graphs) only when a number reported here uses it: not at a
  // checkpoint whose every pending direction is unavailable (the delta at a run's last
  // checkpoint) and with no checkpoint analysis left, where the loss alone is one forward.
  bool gradient_used = false;
  for (const auto& a : analyses_) {
    gradient_used =
        gradient_used || (a->per_checkpoint() && !a->checkpoint_done(report, run.name, info.step));
  }
  for (const auto& d : directions_) {
    gradient_used = gradient_used || (!report.done(run.name, info.step, d->name()) &&
                                      d->unavailable(state.context).empty());
  }
  const int64_t gradient_peak =
      as_unit(fmt::format("{} step {}", run.name, info.step), report.path(), engine.device(), [&] {
        if (gradient_used) {
          report.add_checkpoint(run.name, info.step, engine.loss(), norm(engine.gradient()),
                                digest);
        } else {
          const auto landed = pass.landed_loss.find({run.name, info.step});
          const double loss =
              landed != pass.landed_loss.end() ? landed->second : engine.forward_loss();
          report.add_checkpoint(run.name, info.step, loss, std::nullopt, digest);
        }
      });
  // Which files the audited weights are (a DeepSpeed run's fp32 master weights, not its module's).
  const std::string& weights = state.ckpt.model_file;
  const bool inside = weights.rfind(info.path + "/", 0) == 0;
  report.checkpoint_group(run.name, info.step)
      .attribute("weights", inside ? weights.substr(info.path.size() + 1) : weights);
  pass.summary.peak_memory = std::max(pass.summary.peak_memory, gradient_peak);
  if (options_.matmul_precision != MatmulPrecision::kHighest &&
      pass.precision_measured.insert(run.name).second) {
    const PrecisionError e = matmul_precision_error(engine, options_.matmul_precision);
    const ReportGroup group = report.checkpoint_group(run.name, info.step);
    group.attribute("matmul_precision", to_string(options_.matmul_precision));
    group.attribute("matmul_precision_loss_error", e.loss);
    group.attribute("matmul_precision_gradient_error", e.gradient);
    group.attribute("matmul_precision_hvp_error", e.hvp);
    group.attribute("matmul_precision_curvature_error", e.curvature);
  }
  CheckpointContext context{engine,      pass.blocks,        report, run.name, info.step,
                            state.saved, needs.units_pending};
  for (const auto& a : analyses_) {
    if (!a->per_checkpoint()) {
      a->begin_checkpoint(context);
      continue;
    }
    const std::string label = fmt::format("{} step {} {}", run.name, info.step, a->name());
    CheckpointWork work = CheckpointWork::kNone;
    const int64_t peak = as_unit(label, report.path(), engine.device(),
                                 [&] { work = a->begin_checkpoint(context); });
    if (work == CheckpointWork::kNone) {
      ++pass.summary.skipped;
    } else {
      pass.summary.peak_memory = std::max(pass.summary.peak_memory, peak);
    }
    if (work == CheckpointWork::kWritten) report.commit_if_due();
    pass.advance(label);
  }
  for (size_t k = 0; k < directions_.size(); ++k) probe_unit(run, info, k, state, pass);
}

void ProbeRun::load_checkpoint_state(const ProbeRunSource& run, const CheckpointInfo& info,
                                     const CheckpointNeeds& needs, Pass& pass,
                                     CheckpointState& state) const {
  const auto& o = options_;
  CurvatureEngine& engine = pass.engine;
  const ParamSpace& space = engine.space();
  // The last direction that reads the optimizer state releases it.
  state.last_state_reader = needs.last_state_reader;
  state.ckpt = pass.reader.load(info, needs.parts());
  const ModelStructure structure = engine.objective().structure();
  const NamedOptimizer named = NamedOptimizer::parse(o.optimizer);
  name_optimizer(state.ckpt, named.rule, named.hyper, named.muon_params);
  resolve_optimizer_state(state.ckpt, space, o.param_order, &structure);
  state.saved = saved_optimizer(state.ckpt);
  DirectionContext& context = state.context;
  context.engine = &engine;
  context.saved = &state.saved;
  context.step = info.step;
  context.seed = o.seed;
  context.whatif_fallback = o.whatif_fallback;
  for (const auto& b : pass.blocks.blocks()) context.blocks.push_back(b.params);
  const ParamVector like = engine.objective().parameters();
  // Each tensor straight from its file into the model's own parameters: no copy of the whole
  // checkpoint is held.
  fill_parameters(state.ckpt, space, like, o.allow_extra, &structure);
  engine.parameters_changed();
  state.ckpt.model.clear();
  state.ckpt.model_source.reset();
  // θ is the engine's own parameters (views, no copy): nothing here writes to them, and the
  // engine's excursions to θ + u restore them exactly.
  context.theta = detached(like);
  // The delta goes to the next saved checkpoint, whatever the selection's stride. Only its
  // parameters: the successor's optimizer state plays no part here. Its tensors are kept for its
  // own turn. With the engine's host copies they stay in host memory beside the saved θ: the
  // delta is then formed tensor by tensor on the device, and L(θ_{t+1}) copies them in one by one.
  const CheckpointInfo* after = needs.next ? successor(run, info) : nullptr;
  if (after != nullptr) {
    Checkpoint next = pass.reader.load(*after, CheckpointParts::kModelOnly);
    context.theta_next =
        parameters_from(next, space, next_checkpoint_like(engine, like), o.allow_extra, &structure);
    pass.reader.keep(*after, CheckpointParts::kModelOnly, std::move(next));
  }
}

void ProbeRun::probe_unit(const ProbeRunSource& run, const CheckpointInfo& info, size_t k,
                          CheckpointState& state, Pass& pass) {
  ProbeReport& report = pass.report;
  CurvatureEngine& engine = pass.engine;
  Direction& d = *directions_[k];
  const std::string direction = d.name();
  const std::string label = fmt::format("{} step {} {}", run.name, info.step, direction);
  if (report.done(run.name, info.step, direction)) {
    ++pass.summary.skipped;
    pass.advance(label);
    return;
  }
  DirectionContext& context = state.context;
  const std::string why = d.unavailable(context);
  if (!why.empty()) {
    if (k == state.last_state_reader) state.release_state();
    report.add_status(run.name, info.step, direction, UnitStatus::kUnavailable, why);
  } else {
    const int64_t peak = as_unit(label, report.path(), engine.device(), [&] {
      context.note.clear();
      context.partition.clear();
      context.optimizer_rule.clear();
      context.optimizer_recognition.clear();
      // In the engine's vector dtype whatever the direction was built in.
      ParamVector u = converted(d.compute(context), engine.vector_dtype());
      if (k == state.last_state_reader) state.release_state();
      UnitContext unit{engine, pass.blocks, report, run.name, info.step, direction, u};
      unit.landing = d.landing(context);
      for (const auto& a : analyses_) a->unit(unit);
      const CheckpointInfo* after = successor(run, info);
      if (unit.landing && unit.taylor && after && std::isfinite(unit.taylor->loss_after)) {
        pass.landed_loss[{run.name, after->step}] = unit.taylor->loss_after;
      }
      if (unit.taylor && !unit.nonzero()) ++pass.summary.zero_directions;
      const ReportGroup group = report.unit_group(run.name, info.step, direction);
      record_precision(group, engine);
      if (!context.note.empty()) group.attribute("note", context.note);
      // Which rule each parameter got (aligned with the root attribute param_names).
      if (!context.partition.empty()) group.attribute("partition", context.partition);
      if (!context.optimizer_rule.empty()) {
        group.attribute("optimizer_rule", context.optimizer_rule);
        group.attribute("optimizer_recognition", context.optimizer_recognition);
      }
    });
    // On a device whose allocator keeps statistics: the unit's peak, for budgeting runs.
    if (peak >= 0) {
      report.unit_group(run.name, info.step, direction).attribute("peak_memory", peak);
      pass.summary.peak_memory = std::max(pass.summary.peak_memory, peak);
    }
  }
  report.commit_if_due();
  pass.advance(label);
}

ProbeJobResult run_probe_job(const ProbeJob& job, const ProgressCallback& progress) {
  job.data.validate();
  job.engine.validate();
  if (job.memory_budget < 0) {
    throw InvalidOption("{0} must be >= 0 (0 = no bound)",
                        {{"ProbeJob.memory_budget", std::to_string(job.memory_budget)}});
  }
  if (c10::Device(job.model.init.device).is_cpu() && !cpu_matrix_products(job.model.init.dtype)) {
    throw InvalidOption(
        fmt::format("{{0}} {}: this LibTorch has no {} matrix products on the CPU "
                    "(LibTorch 2 has them): use bfloat16, or a GPU",
                    dtype_name(job.model.init.dtype), dtype_name(job.model.init.dtype)),
        {{"ModelInit.dtype", ""}});
  }
  if (job.memory_budget > 0) check_memory_budget(plan_probe_job(job), job.memory_budget);
  ProbeRunOptions run_options = job.run;
  ProbeRun run(std::move(run_options));  // lists and checks every run's checkpoints
  Communicator& comm = job.engine.communicator ? *job.engine.communicator : *single_process();
  {
    // Only rank 0 writes the output; its checks stop every rank.
    std::exception_ptr failure;
    if (comm.is_root()) {
      try {
        check_writable(job.output);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    raise_if_any_rank_failed(comm, failure);
  }

  // The first checkpoint names the model; its tensors go to the run, which reads it no more
  // (without prefetch they go before the run starts: at GPT-2 small's size 0.5 GB that every
  // unit would otherwise carry). Every parameter comes from a checkpoint (parameters_from
  // refuses a missing one), so the model's own are not drawn.
  LoadedModel model = [&] {
    const CheckpointInfo& info = run.runs().front().chosen.front();
    Checkpoint first = open_checkpoint(info, CheckpointParts::kModelOnly);
    StoredWeights weights;
    weights.elements = 0;
    for (const auto& entry : first.model_source->entries()) weights.elements += entry.numel();
    weights.origin = first.model_file;
    ModelSource source = job.model;
    source.init.draw = false;
    LoadedModel loaded = load_model(
        source, first.model_config_json(),
        first.model_config_file.empty() ? first.meta_file : first.model_config_file, weights);
    run.keep_checkpoint(info, std::move(first));
    return loaded;
  }();
  Objective& objective = *model.objective;
  ProbeSet probe = job.data.load();
  const BlockPartition blocks = job.blocks.partition(objective.space(), objective.structure());
  CurvatureEngine engine(objective, probe, job.engine);

  Provenance provenance = job.provenance;
  provenance.model = model.description;
  provenance.probe_examples = probe.num_examples();
  provenance.probe_batches = static_cast<int64_t>(probe.size());
  provenance.probe_hash = probe.hash();
  provenance.blocks = job.blocks.describe();
  provenance.hvp_method = job.engine.hvp_method;
  provenance.vector_dtype = dtype_name(engine.vector_dtype());
  provenance.extra["matmul_precision"] = to_string(job.run.matmul_precision);
  provenance.extra["probe_data"] = job.data.path;
  provenance.extra["param_names"] = fmt::format("{}", fmt::join(objective.space().names(), ","));
  provenance.extra["block_names"] = fmt::format("{}", fmt::join(blocks.names(), ","));
  provenance.world_size = comm.world_size();
  provenance.distributed_backend = comm.backend();
  ProbeReport report(job.output, provenance, job.resume,
                     job.engine.communicator ? job.engine.communicator : single_process());

  ProbeJobResult result;
  result.summary = run.execute(engine, blocks, report, progress);
  result.output = job.output;
  if (comm.is_root()) result.tables = report.tables();
  return result;
}

}  // namespace curv
