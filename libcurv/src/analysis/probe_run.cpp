#include "curv/analysis/probe_run.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "curv/analysis/direction_registry.h"
#include "curv/core/directions.h"
#include "curv/core/distributed.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "curv/core/statistics.h"
#include "curv/io/h5_file.h"

namespace fs = std::filesystem;

namespace curv {

void CheckpointSpectrumOptions::validate() const {
  if (eigenvalues || overlap) {
    EigenOptions e = eigen;
    // --overlap alone needs the top eigenvectors only.
    if (!eigenvalues) e.bottom = 0;
    if (overlap && e.top < 1) {
      throw InvalidOption("overlap needs the top eigenspace: {0} must be >= 1",
                          {{"EigenOptions.top", fmt::format("{}", e.top)}});
    }
    e.validate();
  }
  if (trace) trace_options.validate();
  if (density) density_options.validate();
}

NdsPairSpec NdsPairSpec::parse(const std::string& text) {
  NdsPairSpec spec;
  spec.text = text;
  const auto colon = text.find(':');
  if (colon == std::string::npos || text.find(':', colon + 1) != std::string::npos) {
    throw InvalidArgument(fmt::format(
        "--compare '{}': expected A:B, each side a direction (adamw.whatif:muon.whatif) or "
        "RUN/DIRECTION (adamw/delta:muon/delta)",
        text));
  }
  auto side = [&](const std::string& part, std::string& run, std::string& direction) {
    const auto slash = part.find('/');
    if (slash == std::string::npos) {
      direction = part;
    } else {
      run = part.substr(0, slash);
      direction = part.substr(slash + 1);
      if (run.empty()) {
        throw InvalidArgument(fmt::format("--compare '{}': empty run name in '{}'", text, part));
      }
    }
    if (direction.empty() || direction.find('/') != std::string::npos) {
      throw InvalidArgument(
          fmt::format("--compare '{}': '{}' is not a direction or RUN/DIRECTION", text, part));
    }
  };
  side(text.substr(0, colon), spec.run_a, spec.direction_a);
  side(text.substr(colon + 1), spec.run_b, spec.direction_b);
  if (spec.run_a.empty() != spec.run_b.empty()) {
    throw InvalidArgument(fmt::format(
        "--compare '{}': give a run on both sides (RUN/DIRECTION:RUN/DIRECTION) or on neither",
        text));
  }
  return spec;
}

void ProbeRunOptions::validate() const {
  if (runs.empty()) throw InvalidArgument("no checkpoint directory given (see --help)");
  if (directions.empty()) throw InvalidOption("{0} is empty", {{"ProbeRunOptions.directions", ""}});
  validate_param_order(param_order);
  taylor.validate();
  token_buckets.validate();
  if (within) within_options.validate();
  if (spectrum.any()) spectrum.validate();
}

namespace {

std::string spectrum_path(const std::string& run, int64_t step) {
  return fmt::format("/runs/{}/step_{}/spectrum", run, step);
}

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

void append_pairs(Table& t, const std::string& block, const EigenResult& r) {
  struct Row {
    std::string which;
    int64_t rank;
    const RitzPair* pair;
  };
  std::vector<Row> rows;
  for (const auto& [which, pairs] :
       {std::pair{"largest", &r.largest}, std::pair{"smallest", &r.smallest},
        std::pair{"dominant", &r.dominant}}) {
    for (size_t i = 0; i < pairs->size(); ++i) {
      rows.push_back({which, static_cast<int64_t>(i), &(*pairs)[i]});
    }
  }
  const int64_t converged = r.converged() ? 1 : 0;
  Table part;
  part.add_column("block", rows, [&](const Row&) { return block; });
  part.add_column("which", rows, [](const Row& x) { return x.which; });
  part.add_column("rank", rows, [](const Row& x) { return x.rank; });
  part.add_column("eigenvalue", rows, [](const Row& x) { return x.pair->value; });
  part.add_column("residual", rows, [](const Row& x) { return x.pair->residual; });
  part.add_column("error_bound", rows, [](const Row& x) { return x.pair->error_bound; });
  part.add_column("hvps", rows, [&](const Row&) { return r.hvps; });
  part.add_column("converged", rows, [&](const Row&) { return converged; });
  t.append_rows(part);
}

void append_trace(Table& t, const std::string& block, const TraceResult& r) {
  Table row;
  row.add_column("block", std::vector<std::string>{block});
  row.add_column("estimate", std::vector<double>{r.estimate});
  row.add_column("standard_error", std::vector<double>{r.standard_error});
  row.add_column("matvecs", std::vector<int64_t>{r.matvecs});
  row.add_column("samples", std::vector<int64_t>{r.samples});
  t.append_rows(row);
}

void write_eigen(H5Writer& w, const std::string& group, CurvatureEngine& engine,
                 const BlockPartition& blocks, const CheckpointSpectrumOptions& o,
                 const EigenOptions& options, const EigenResult& global) {
  Table t;
  append_pairs(t, "total", global);
  std::vector<std::string> messages = {"total: " + global.message};
  if (o.per_block) {
    for (const Block& b : blocks.blocks()) {
      HessianOperator hb(engine, b.params);
      EigenOptions bo = o.eigen;
      bo.keep_vectors = false;
      EigenResult r = extreme_eigenpairs(hb, bo);
      append_pairs(t, b.name, r);
      messages.push_back(b.name + ": " + r.message);
    }
  }
  const std::string eg = group + "/eigen";
  w.table(eg, t);
  w.attribute(eg, "method", to_string(options.method));
  w.attribute(eg, "tol", options.tol);
  w.attribute(eg, "bound", to_string(options.bound));
  w.attribute(eg, "max_hvps", options.max_hvps);
  w.attribute(eg, "residuals", "measured: one extra HVP per pair");
  w.attribute(eg, "messages", messages);
}

void write_trace(H5Writer& w, const std::string& group, CurvatureEngine& engine,
                 const BlockPartition& blocks, const CheckpointSpectrumOptions& o) {
  Table t;
  HessianOperator h(engine);
  append_trace(t, "total", estimate_trace(h, o.trace_options));
  if (o.per_block) {
    for (const Block& b : blocks.blocks()) {
      HessianOperator hb(engine, b.params);
      append_trace(t, b.name, estimate_trace(hb, o.trace_options));
    }
  }
  const std::string tg = group + "/trace";
  w.table(tg, t);
  w.attribute(tg, "method", to_string(o.trace_options.method));
  w.attribute(tg, "matvecs", o.trace_options.matvecs);
}

void write_density(H5Writer& w, const std::string& group, CurvatureEngine& engine,
                   const CheckpointSpectrumOptions& o) {
  HessianOperator h(engine);
  DensityResult d = spectral_density(h, o.density_options);
  const std::string dg = group + "/density";
  const auto runs = static_cast<uint64_t>(d.runs), steps = static_cast<uint64_t>(d.steps);
  w.dataset(dg + "/nodes", d.nodes, {runs, steps});
  w.dataset(dg + "/weights", d.weights, {runs, steps});
  w.dataset(dg + "/grid", d.grid);
  w.dataset(dg + "/density", d.density);
  w.attribute(dg, "sigma", d.sigma);
  w.attribute(dg, "runs", d.runs);
  w.attribute(dg, "steps", d.steps);
  w.attribute(dg, "trace", d.trace);
  w.attribute(dg, "trace_standard_error", d.trace_standard_error);
  w.attribute(dg, "hvps", d.hvps);
}

void write_precond(H5Writer& w, const std::string& group, CurvatureEngine& engine,
                   const Checkpoint& ckpt, const CheckpointSpectrumOptions& o) {
  const std::string pg = group + "/precond";
  w.group(pg);
  AdamPreconditioner p;
  const std::string why = adam_preconditioner(saved_optimizer(ckpt), engine.space(), &p);
  if (!why.empty()) {
    w.attribute(pg, "status", "unavailable");
    w.attribute(pg, "message", why);
    return;
  }
  HessianOperator h(engine);
  ScaledOperator scaled(h, p.inverse_sqrt);
  EigenOptions options = o.eigen;
  options.top = 1;
  options.bottom = 0;
  options.keep_vectors = false;
  EigenResult r = extreme_eigenpairs(scaled, options);
  const auto& pair = options.method == EigenMethod::kPower ? r.dominant : r.largest;
  w.attribute(pg, "status", r.converged() ? "converged" : "not_converged");
  w.attribute(pg, "message", r.message);
  w.attribute(pg, "sharpness", pair.empty() ? std::nan("") : pair[0].value);
  w.attribute(pg, "residual", pair.empty() ? std::nan("") : pair[0].residual);
  w.attribute(pg, "hvps", r.hvps + r.residual_hvps);
  w.attribute(pg, "edge_of_stability", p.edge_of_stability());
  w.attribute(pg, "lr", p.lr);
  w.attribute(pg, "beta1", p.beta1);
  w.attribute(pg, "beta2", p.beta2);
  w.attribute(pg, "eps", p.eps);
  w.attribute(pg, "step_count", p.step_count);
}

// Computes and stores the per-checkpoint spectrum results; returns the global top eigenvectors
// (for overlap). With `write` false (a resumed run whose spectrum is already in the file), only
// the eigenvectors that overlap needs are recomputed.
std::vector<Eigen::VectorXd> checkpoint_spectrum(CurvatureEngine& engine, const Checkpoint& ckpt,
                                                 const BlockPartition& blocks,
                                                 const CheckpointSpectrumOptions& o, H5Writer& w,
                                                 const std::string& run, bool write) {
  const std::string g = spectrum_path(run, ckpt.step);
  std::vector<Eigen::VectorXd> top_vectors;
  const int64_t hvps_before = engine.counters().hvps;
  if (write) {
    w.remove(g);
    w.group(g);
    w.attribute(g, "seed", static_cast<int64_t>(o.eigen.seed));
  }
  if (o.eigenvalues || o.overlap) {
    HessianOperator h(engine);
    EigenOptions options = o.eigen;
    // Overlap alone, or a resumed run whose eigenvalues are in the file, needs the top only.
    if (!write || !o.eigenvalues) options.bottom = 0;
    EigenResult global = extreme_eigenpairs(h, options);
    const auto& top = options.method == EigenMethod::kPower ? global.dominant : global.largest;
    for (const auto& p : top) top_vectors.push_back(p.vector);
    if (write && o.eigenvalues) write_eigen(w, g, engine, blocks, o, options, global);
  }
  if (write && o.trace) write_trace(w, g, engine, blocks, o);
  if (write && o.density) write_density(w, g, engine, o);
  if (write && o.precond_sharpness) write_precond(w, g, engine, ckpt, o);
  if (write) w.attribute(g, "hvps", engine.counters().hvps - hvps_before);
  return top_vectors;
}

void write_overlap(H5Writer& w, const std::string& unit, const Overlap& o) {
  const std::string og = unit + "/overlap";
  w.dataset(og + "/per_vector", o.per_vector);
  w.attribute(og, "eigenspace_share", o.eigenspace_share);
  w.attribute(og, "gradient_cosine", o.gradient_cosine);
  w.attribute(og, "k", static_cast<int64_t>(o.per_vector.size()));
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

}  // namespace

ProbeRun::ProbeRun(ProbeRunOptions options) : options_(std::move(options)) {
  options_.validate();
  std::set<std::string> seen;
  for (const auto& spec : options_.directions) {
    directions_.push_back(make_direction(spec));
    if (!seen.insert(directions_.back()->name()).second) {
      throw InvalidArgument(fmt::format("--directions lists '{}' twice", spec));
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
        throw InvalidArgument(fmt::format("--compare '{}': no direction '{}' among {}", pair.text,
                                          *direction, fmt::join(names, ", ")));
      }
    }
    for (const auto* run : {&pair.run_a, &pair.run_b}) {
      if (run->empty()) continue;
      bool found = false;
      for (const auto& r : runs_) found = found || r.name == *run;
      if (!found) {
        std::vector<std::string> names;
        for (const auto& r : runs_) names.push_back(r.name);
        throw InvalidArgument(fmt::format("--compare '{}': no run '{}' among {}", pair.text, *run,
                                          fmt::join(names, ", ")));
      }
    }
  }
}

ProbeRun::~ProbeRun() = default;

size_t ProbeRun::units() const {
  size_t total = 0;
  const size_t per_checkpoint = directions_.size() + (options_.spectrum.any() ? 1 : 0);
  for (const auto& run : runs_) total += run.chosen.size() * per_checkpoint;
  return total;
}

ProbeRunSummary ProbeRun::execute(CurvatureEngine& engine, const BlockPartition& blocks,
                                  ProbeReport& report, const ProgressCallback& progress) {
  ProbeRunSummary summary;
  summary.units = units();
  size_t done = 0;
  if (options_.taylor.ggn) {
    // Before any unit: an objective without logits cannot give the split.
    try {
      engine.objective().logits(engine.probe()[0]);
    } catch (const Error& e) {
      throw InvalidArgument(fmt::format("--ggn: {}", e.what()));
    }
  }
  if (options_.token_buckets.enabled()) {
    token_buckets_ =
        std::make_unique<TokenBuckets>(make_token_buckets(options_.token_buckets, engine.probe()));
    auto& w = report.writer();
    w.attribute("/", "token_buckets", options_.token_buckets.describe());
    w.attribute("/", "token_bucket_names", token_buckets_->names);
    w.attribute("/", "token_bucket_source", token_buckets_->source);
    w.attribute("/", "token_bucket_count_share", token_buckets_->count_share);
    const at::Tensor of = token_buckets_->bucket_of_id.contiguous();
    w.dataset("/token_bucket_of_id",
              std::vector<int64_t>(of.data_ptr<int64_t>(), of.data_ptr<int64_t>() + of.numel()));
  }
  try {
    for (const auto& run : runs_) {
      report.set_run_attribute(run.name, "path", fs::absolute(run.dir).string());
      report.set_run_attribute(run.name, "layout", layout_name(run.all.front().layout));
      for (const auto& info : run.chosen) {
        probe_checkpoint(run, info, engine, blocks, report, progress, done, summary);
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
  if (!options_.comparisons.empty()) {
    // From the committed file, so that units finished by earlier (resumed) invocations count.
    report.writer().table("/comparisons", paired_comparisons(report.path(), options_.comparisons));
    report.commit();
  }
  summary.counters = engine.counters();
  return summary;
}

Table paired_comparisons(const std::string& path, const std::vector<NdsPairSpec>& pairs) {
  H5Reader reader(path);
  std::vector<std::string> text, run_a, run_b, direction_a, direction_b;
  std::vector<int64_t> steps;
  std::map<std::string, std::vector<double>> values;
  // Per-batch NDS of a unit with results (false for a missing unit or a status).
  auto batch_nds = [&](const std::string& unit, std::vector<double>& weight,
                       std::vector<double>& nds) {
    if (!reader.exists(unit + "/batches")) return false;
    const double u = reader.attribute_double(unit, "update_norm");
    if (u == 0.0) return false;  // a zero direction has no NDS to compare
    const Table batches = reader.table(unit + "/batches");
    weight = batches.doubles("weight");
    nds = batches.doubles("curvature");
    for (auto& x : nds) x /= u * u;
    return true;
  };
  const std::vector<std::string> runs =
      reader.exists("/runs") ? reader.children("/runs") : std::vector<std::string>{};
  for (const auto& pair : pairs) {
    std::vector<std::pair<std::string, std::string>> run_pairs;
    if (pair.run_a.empty()) {
      for (const auto& r : runs) run_pairs.emplace_back(r, r);
    } else {
      run_pairs.emplace_back(pair.run_a, pair.run_b);
    }
    for (const auto& [ra, rb] : run_pairs) {
      if (!reader.exists("/runs/" + ra)) continue;
      // Steps in increasing order (the file lists its groups by name: step_1000 before step_200).
      std::vector<int64_t> unit_steps;
      for (const auto& child : reader.children("/runs/" + ra)) {
        if (child.rfind("step_", 0) == 0) unit_steps.push_back(std::stoll(child.substr(5)));
      }
      std::sort(unit_steps.begin(), unit_steps.end());
      for (const int64_t step : unit_steps) {
        std::vector<double> wa, na, wb, nb;
        if (!batch_nds(unit_path(ra, step, pair.direction_a), wa, na) ||
            !batch_nds(unit_path(rb, step, pair.direction_b), wb, nb)) {
          continue;
        }
        const NdsComparison c = compare_batch_nds(wa, na, wb, nb);
        text.push_back(pair.text);
        run_a.push_back(ra);
        run_b.push_back(rb);
        direction_a.push_back(pair.direction_a);
        direction_b.push_back(pair.direction_b);
        steps.push_back(step);
        values["nds_a"].push_back(c.nds_a);
        values["nds_b"].push_back(c.nds_b);
        values["difference"].push_back(c.difference);
        values["difference_stderr"].push_back(c.difference_stderr);
        values["ratio"].push_back(c.ratio);
        values["ratio_stderr"].push_back(c.ratio_stderr);
      }
    }
  }
  Table t;
  t.add_column("pair", text);
  t.add_column("run_a", run_a);
  t.add_column("direction_a", direction_a);
  t.add_column("run_b", run_b);
  t.add_column("direction_b", direction_b);
  t.add_column("step", steps);
  for (const char* c :
       {"nds_a", "nds_b", "difference", "difference_stderr", "ratio", "ratio_stderr"}) {
    t.add_column(c, values[c]);
  }
  return t;
}

namespace {

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
    throw OutOfMemory(fmt::format(
        "{}: {} (every unit finished before it is in {}: the same command with --resume "
        "completes it)",
        label, e.what(), path));
  }
}

}  // namespace

void ProbeRun::probe_checkpoint(const ProbeRunSource& run, const CheckpointInfo& info,
                                CurvatureEngine& engine, const BlockPartition& blocks,
                                ProbeReport& report, const ProgressCallback& progress, size_t& done,
                                ProbeRunSummary& summary) {
  const auto& o = options_;
  const size_t total = summary.units;
  WithinOptions within_options = o.within_options;
  if (o.within_heads_from_model) within_options.n_head = engine.objective().structure().n_head;
  const bool any_spectrum = o.spectrum.any();
  const size_t per_checkpoint = directions_.size() + (any_spectrum ? 1 : 0);
  // Results already in the file belong to the checkpoint as it was then: a checkpoint that
  // changed since (overwritten, re-saved by a resumed training run) is refused by name.
  const std::string digest = checkpoint_digest(info);
  const std::string recorded = report.checkpoint_digest(run.name, info.step);
  if (!recorded.empty() && recorded != digest) {
    throw InvalidArgument(fmt::format(
        "cannot resume '{}': checkpoint '{}' (run '{}', step {}) changed since its results were "
        "written (then {}, now {}); write to a new file, or drop --resume to start over",
        report.path(), info.path, run.name, info.step, recorded, digest));
  }
  const bool spectrum_done =
      !any_spectrum || report.writer().exists(spectrum_path(run.name, info.step));
  bool all_done = spectrum_done;
  for (const auto& d : directions_) {
    all_done = all_done && report.done(run.name, info.step, d->name());
  }
  if (all_done) {
    done += per_checkpoint;
    summary.skipped += per_checkpoint;
    report_progress(progress, report, done, total,
                    fmt::format("{} step {} (already in output)", run.name, info.step));
    return;
  }
  const ParamSpace& space = engine.space();
  // Adam-type state is twice the parameters: read it only when something here uses it.
  // The last direction that reads it releases it. Likewise the next checkpoint.
  bool needs_state = o.spectrum.precond_sharpness, needs_next = false;
  size_t last_state_reader = directions_.size();
  for (size_t k = 0; k < directions_.size(); ++k) {
    if (report.done(run.name, info.step, directions_[k]->name())) continue;
    if (directions_[k]->reads_saved_state()) {
      needs_state = true;
      last_state_reader = k;
    }
    needs_next = needs_next || directions_[k]->reads_next_checkpoint();
  }
  Checkpoint ckpt =
      load_checkpoint(info, needs_state ? CheckpointParts::kAll : CheckpointParts::kModelOnly);
  const ModelStructure structure = engine.objective().structure();
  resolve_optimizer_state(ckpt, space, o.param_order, &structure);
  SavedOptimizer saved = saved_optimizer(ckpt);
  DirectionContext context;
  context.engine = &engine;
  context.saved = &saved;
  context.step = info.step;
  context.seed = o.seed;
  context.whatif_fallback = o.whatif_fallback;
  for (const auto& b : blocks.blocks()) context.blocks.push_back(b.params);
  const ParamVector like = engine.objective().parameters();
  engine.set_parameters(parameters_from(ckpt, space, like, o.allow_extra, &structure));
  ckpt.model.clear();
  // θ is the engine's own parameters (views, no copy): nothing here writes to them, and the
  // engine's excursions to θ + u restore them exactly.
  context.theta = detached(like);
  // The delta goes to the next saved checkpoint, whatever the selection's stride.
  for (size_t k = 0; needs_next && k + 1 < run.all.size(); ++k) {
    if (run.all[k].step == info.step) {
      // Only its parameters: the successor's optimizer state plays no part here.
      Checkpoint next = load_checkpoint(run.all[k + 1], CheckpointParts::kModelOnly);
      context.theta_next = parameters_from(next, space, like, o.allow_extra, &structure);
      break;
    }
  }
  const int64_t gradient_peak =
      as_unit(fmt::format("{} step {}", run.name, info.step), report.path(), engine.device(), [&] {
        report.add_checkpoint(run.name, info.step, engine.loss(), norm(engine.gradient()), digest);
      });
  summary.peak_memory = std::max(summary.peak_memory, gradient_peak);
  std::vector<Eigen::VectorXd> top_vectors;
  if (any_spectrum) {
    bool overlap_needed = false;
    for (const auto& d : directions_) {
      overlap_needed =
          overlap_needed || (o.spectrum.overlap && !report.done(run.name, info.step, d->name()));
    }
    if (!spectrum_done || overlap_needed) {
      const int64_t peak =
          as_unit(fmt::format("{} step {} spectrum", run.name, info.step), report.path(),
                  engine.device(), [&] {
                    top_vectors = checkpoint_spectrum(engine, ckpt, blocks, o.spectrum,
                                                      report.writer(), run.name, !spectrum_done);
                  });
      summary.peak_memory = std::max(summary.peak_memory, peak);
      if (!spectrum_done) report.commit_if_due();
    } else {
      ++summary.skipped;
    }
    report_progress(progress, report, ++done, total,
                    fmt::format("{} step {} spectrum", run.name, info.step));
  }
  std::unique_ptr<TokenBucketAudit> bucket_audit;
  // Once the last direction that reads the optimizer state has its u, the audits run without it.
  auto release_state = [&] {
    saved.tensors.clear();
    ckpt.optimizer.clear();
  };
  for (size_t k = 0; k < directions_.size(); ++k) {
    const auto& d = directions_[k];
    const std::string label = fmt::format("{} step {} {}", run.name, info.step, d->name());
    if (report.done(run.name, info.step, d->name())) {
      ++summary.skipped;
      report_progress(progress, report, ++done, total, label);
      continue;
    }
    const std::string why = d->unavailable(context);
    if (!why.empty()) {
      if (k == last_state_reader) release_state();
      report.add_status(run.name, info.step, d->name(), "unavailable", why);
    } else {
      const std::string unit = unit_path(run.name, info.step, d->name());
      const int64_t peak = as_unit(label, report.path(), engine.device(), [&] {
        context.note.clear();
        context.partition.clear();
        ParamVector u = d->compute(context);
        if (k == last_state_reader) release_state();
        TaylorResult taylor = taylor_audit(engine, u, blocks, o.taylor);
        // A zero direction has its audit and status; nothing is left to break down.
        const bool complete = taylor.status == AuditStatus::kComplete;
        if (!complete) ++summary.zero_directions;
        std::vector<BucketResult> buckets;
        if (token_buckets_ && complete) {
          // Built at the first unit that needs it, after θ is set: its engines share the objective.
          if (!bucket_audit) {
            bucket_audit = std::make_unique<TokenBucketAudit>(engine.objective(), engine.probe(),
                                                              *token_buckets_, engine.options());
          }
          buckets = bucket_audit->audit(u, blocks, o.taylor);
        }
        if (o.within && complete) {
          WithinReport within = within_block(engine, u, within_options);
          report.add_taylor(run.name, info.step, d->name(), taylor, &within);
        } else {
          report.add_taylor(run.name, info.step, d->name(), taylor);
        }
        if (token_buckets_ && complete) {
          report.add_token_buckets(run.name, info.step, d->name(), buckets);
        }
        if (o.spectrum.overlap && complete) {
          write_overlap(report.writer(), unit,
                        direction_overlap(u, top_vectors, engine.gradient()));
        }
        if (!context.note.empty()) report.writer().attribute(unit, "note", context.note);
        // Which rule each parameter got (aligned with the root attribute param_names).
        if (!context.partition.empty()) {
          report.writer().attribute(unit, "partition", context.partition);
        }
      });
      // On a device whose allocator keeps statistics: the unit's peak, for budgeting runs.
      if (peak >= 0) {
        report.writer().attribute(unit, "peak_memory", peak);
        summary.peak_memory = std::max(summary.peak_memory, peak);
      }
    }
    report.commit_if_due();
    report_progress(progress, report, ++done, total, label);
  }
}

BlockPartition BlockOptions::partition(const ParamSpace& space,
                                       const ModelStructure& structure) const {
  if (groups.empty()) {
    return BlockPartition::by_rule(space, structure, BlockPartition::parse_rule(rule));
  }
  return BlockPartition::by_regex(space, groups);
}

std::string BlockOptions::describe() const {
  if (groups.empty()) return rule;
  std::vector<std::string> parts;
  for (const auto& [name, regex] : groups) parts.push_back(name + "=" + regex);
  return "groups:" + fmt::format("{}", fmt::join(parts, ";"));
}

ProbeJobResult::ProbeJobResult() = default;
ProbeJobResult::ProbeJobResult(ProbeJobResult&&) noexcept = default;
ProbeJobResult::~ProbeJobResult() = default;

ProbeJobResult run_probe_job(const ProbeJob& job, const ProgressCallback& progress) {
  job.data.validate();
  job.engine.validate();
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

  // The first checkpoint only names the model; its tensors go before the run starts (at GPT-2
  // small's size they are 0.5 GB that every unit would otherwise carry).
  LoadedModel model = [&] {
    const Checkpoint first =
        load_checkpoint(run.runs().front().chosen.front(), CheckpointParts::kModelOnly);
    StoredWeights weights;
    weights.elements = 0;
    for (const auto& entry : first.model) weights.elements += entry.second.numel();
    weights.origin = first.model_file;
    return load_model(job.model, first.model_config_json(),
                      first.model_config_file.empty() ? first.meta_file : first.model_config_file,
                      weights);
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
  provenance.hvp_method = job.engine.hvp_method == HvpMethod::kExact ? "exact" : "fd";
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
  result.taylor = std::make_unique<Table>(report.taylor_table());
  return result;
}

std::string summarize_probe_file(const std::string& path) {
  // Per (run, direction): the mean over checkpoints of the whole-model values. Its standard error
  // comes from the per-batch terms: the checkpoints share the probe set, so batch b's mean over
  // checkpoints is one replicate of the whole mean, and the SE over batches counts the
  // checkpoints' shared noise once.
  H5Reader reader(path);
  const Table taylor = reader.table("/taylor");
  struct Acc {
    int n = 0, n_rho = 0, n_real = 0;
    double rho = 0;
    std::vector<double> weight, nds, predicted, realized;  // per batch, summed over checkpoints
  };
  std::map<std::pair<std::string, std::string>, Acc> acc;
  const auto& run = taylor.strings("run");
  const auto& step = taylor.int64s("step");
  const auto& dir = taylor.strings("direction");
  const auto& block = taylor.strings("block");
  const auto& rho = taylor.doubles("rho_within");
  const auto& update_norm = taylor.doubles("update_norm");
  auto add = [](std::vector<double>& sum, const std::vector<double>& x, double scale) {
    if (sum.empty()) sum.assign(x.size(), 0.0);
    for (size_t b = 0; b < x.size() && b < sum.size(); ++b) sum[b] += scale * x[b];
  };
  std::vector<std::string> zero_units;  // audited along a zero direction: no NDS to average
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (block[i] != "total") continue;
    if (update_norm[i] == 0.0) {
      zero_units.push_back(fmt::format("{} step {} {}", run[i], step[i], dir[i]));
      continue;
    }
    auto& a = acc[{run[i], dir[i]}];
    const Table batches = reader.table(unit_path(run[i], step[i], dir[i]) + "/batches");
    const auto& first = batches.doubles("first_order");
    const auto& curvature = batches.doubles("curvature");
    const auto& realized = batches.doubles("realized");
    std::vector<double> predicted(first.size());
    for (size_t b = 0; b < first.size(); ++b) predicted[b] = first[b] + 0.5 * curvature[b];
    a.weight = batches.doubles("weight");
    ++a.n;
    add(a.nds, curvature, 1.0 / (update_norm[i] * update_norm[i]));
    add(a.predicted, predicted, 1.0);
    if (std::isfinite(rho[i])) {
      a.rho += rho[i];
      ++a.n_rho;
    }
    if (std::isfinite(batch_mean(realized, a.weight))) {
      add(a.realized, realized, 1.0);
      ++a.n_real;
    }
  }
  auto mean_pm = [](const std::vector<double>& sum, const std::vector<double>& w, int n) {
    if (n == 0 || sum.empty()) return std::string("n/a");
    const double mean = batch_mean(sum, w) / n, se = batch_stderr(sum, w) / n;
    return fmt::format("{:.4g} ± {:.2g}", mean, se);
  };
  // printf's byte-counted widths; "±" and "ρ" take two bytes each.
  char line[320];
  std::snprintf(line, sizeof line, "%-20s %-16s %5s %22s %10s %23s %23s\n", "run", "direction",
                "ckpts", "mean NDS ± SE", "ρ_within", "predicted ΔL ± SE", "realized ΔL ± SE");
  std::string out = line;
  for (const auto& [key, a] : acc) {
    std::snprintf(line, sizeof line, "%-20s %-16s %5d %22s %9.1f%% %23s %23s\n", key.first.c_str(),
                  key.second.c_str(), a.n, mean_pm(a.nds, a.weight, a.n).c_str(),
                  100 * (a.n_rho ? a.rho / a.n_rho : std::nan("")),
                  mean_pm(a.predicted, a.weight, a.n).c_str(),
                  mean_pm(a.realized, a.weight, a.n_real).c_str());
    out += line;
  }
  if (reader.exists("/comparisons")) {
    const Table c = reader.table("/comparisons");
    if (c.num_rows() > 0) {
      std::snprintf(line, sizeof line, "\n%-34s %8s %24s %24s\n", "paired comparison A:B", "step",
                    "NDS_A / NDS_B ± SE", "NDS_A - NDS_B ± SE");
      out += line;
    }
    const auto& pair = c.strings("pair");
    const auto& run_a = c.strings("run_a");
    const auto& run_b = c.strings("run_b");
    const auto& cstep = c.int64s("step");
    for (size_t i = 0; i < c.num_rows(); ++i) {
      const std::string label = run_a[i] == run_b[i] && pair[i].find('/') == std::string::npos
                                    ? fmt::format("{} ({})", pair[i], run_a[i])
                                    : pair[i];
      const auto pm = [](double x, double se) { return fmt::format("{:.4g} ± {:.2g}", x, se); };
      std::snprintf(line, sizeof line, "%-34s %8lld %24s %24s\n", label.c_str(),
                    static_cast<long long>(cstep[i]),
                    pm(c.doubles("ratio")[i], c.doubles("ratio_stderr")[i]).c_str(),
                    pm(c.doubles("difference")[i], c.doubles("difference_stderr")[i]).c_str());
      out += line;
    }
  }
  if (!zero_units.empty()) {
    out += fmt::format("\n{} unit(s) along a zero direction (NaN NDS, status zero_direction): {}\n",
                       zero_units.size(), fmt::join(zero_units, ", "));
  }
  out += "(± one standard error over probe batches; n/a with a single batch: docs/concepts.md)\n";
  return out;
}

}  // namespace curv
