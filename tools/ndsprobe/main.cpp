// ndsprobe: curvature along optimizer update directions on directories of training checkpoints.
// For every checkpoint and direction it writes a second-order Taylor audit, NDS, the per-block and
// coupling breakdown and (optionally) within-block modes to one HDF5 file; see docs/cli.md.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cli_common.h"
#include "curv/blocks.h"
#include "curv/checkpoint.h"
#include "curv/directions.h"
#include "curv/engine.h"
#include "curv/error.h"
#include "curv/h5_file.h"
#include "curv/probe_data.h"
#include "curv/report.h"
#include "curv/runtime.h"
#include "curv/taylor.h"
#include "curv/within.h"

namespace fs = std::filesystem;
using namespace curv;

namespace {

struct Args {
  std::vector<std::string> runs;
  tools::ModelArgs model;
  tools::RuntimeArgs runtime;
  std::string data;
  int64_t block_size = 0;
  std::string layout = "auto";
  std::string param_order = "auto";
  int64_t batch_size = 32;
  int64_t examples = 0;
  std::vector<std::string> directions = {"delta", "gradient", "random"};
  std::string steps;
  int64_t stride = 1;
  std::string blocks = "layer";
  std::vector<std::string> block_groups;
  std::string coupling = "full";
  int64_t coupling_samples = 32;
  std::vector<double> multipliers;
  bool no_realized = false;
  bool within = false;
  std::string within_params;
  int64_t modes = 4;
  int64_t row_chunks = 0;
  int64_t within_max_hvps = 0;
  std::string output = "ndsprobe.h5";
  bool resume = false;
  std::string hvp = "exact";
  int64_t max_kept_graphs = 0;
  bool allow_extra = false;
  bool whatif_fallback = false;
  bool list_directions = false;
};

// Fails before any compute is spent when the output cannot be written.
void check_writable(const std::string& path) {
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : ".";
  if (!fs::is_directory(parent)) {
    throw InvalidArgument(fmt::format("output '{}': directory '{}' does not exist", path,
                                      parent.string()));
  }
  if (fs::is_directory(path)) {
    throw InvalidArgument(fmt::format("output '{}' is a directory", path));
  }
  const fs::path probe = parent / fmt::format(".ndsprobe-write-test-{}", ::getpid());
  std::ofstream out(probe);
  if (!out) {
    throw InvalidArgument(fmt::format("output '{}': cannot write in directory '{}'", path,
                                      parent.string()));
  }
  out.close();
  fs::remove(probe);
}

BlockPartition make_blocks(const Args& a, const ParamSpace& space) {
  if (a.block_groups.empty()) return BlockPartition::by_rule(space, BlockPartition::parse_rule(a.blocks));
  std::vector<std::pair<std::string, std::string>> groups;
  for (const auto& g : a.block_groups) {
    const auto eq = g.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == g.size()) {
      throw InvalidArgument(fmt::format("--block-group '{}': expected NAME=REGEX", g));
    }
    groups.emplace_back(g.substr(0, eq), g.substr(eq + 1));
  }
  return BlockPartition::by_regex(space, groups);
}

// Run names from directory names, made unique ("run", "run.2", ...).
std::vector<std::string> run_names(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  std::map<std::string, int> seen;
  for (const auto& d : dirs) {
    std::string name = fs::path(d).lexically_normal().filename().string();
    if (name.empty() || name == ".") name = fs::path(d).lexically_normal().parent_path().filename().string();
    if (name.empty() || name == "." || name == "..") name = "run";
    const int n = ++seen[name];
    out.push_back(n == 1 ? name : fmt::format("{}.{}", name, n));
  }
  return out;
}

void print_summary(const Table& taylor) {
  // Per (run, direction): mean over checkpoints of the whole-model rows.
  struct Acc { int n = 0; double nds = 0, rho = 0, predicted = 0, realized = 0; int n_rho = 0, n_real = 0; };
  std::map<std::pair<std::string, std::string>, Acc> acc;
  const auto& run = taylor.strings("run");
  const auto& dir = taylor.strings("direction");
  const auto& block = taylor.strings("block");
  const auto& nds = taylor.doubles("nds");
  const auto& rho = taylor.doubles("rho_within");
  const auto& predicted = taylor.doubles("predicted");
  const auto& realized = taylor.doubles("realized");
  for (size_t i = 0; i < taylor.num_rows(); ++i) {
    if (block[i] != "total") continue;
    auto& a = acc[{run[i], dir[i]}];
    ++a.n;
    a.nds += nds[i];
    a.predicted += predicted[i];
    if (std::isfinite(rho[i])) { a.rho += rho[i]; ++a.n_rho; }
    if (std::isfinite(realized[i])) { a.realized += realized[i]; ++a.n_real; }
  }
  std::printf("%-20s %-16s %5s %12s %10s %13s %13s\n", "run", "direction", "ckpts", "mean NDS",
              "ρ_within", "predicted ΔL", "realized ΔL");
  for (const auto& [key, a] : acc) {
    auto mean = [](double s, int n) { return n ? s / n : std::nan(""); };
    std::printf("%-20s %-16s %5d %12.5g %9.1f%% %13.4e %13.4e\n", key.first.c_str(),
                key.second.c_str(), a.n, a.nds / a.n, 100 * mean(a.rho, a.n_rho),
                a.predicted / a.n, mean(a.realized, a.n_real));
  }
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"ndsprobe: curvature along optimizer update directions, per layer and within "
               "layers, on directories of training checkpoints. Writes HDF5 (docs/hdf5-schema.md)."};
  app.add_option("checkpoints", a.runs, "Checkpoint directories, one run each (step_<N>/, "
                 "nanoGPT ckpt*.pt, Hugging Face checkpoint-<N>/ or step_<N>.pt; see --layout)");
  tools::add_model_args(app, a.model);
  app.add_option("--layout", a.layout, "Checkpoint layout: auto (detected), native, nanogpt, hf, pt")
      ->capture_default_str()->check(CLI::IsMember({"auto", "native", "nanogpt", "hf", "pt"}));
  app.add_option("--param-order", a.param_order,
                 "Order of a torch optimizer's parameter indices: auto, model, ndim (nanoGPT: "
                 "matrices first), hidden (Muon: hidden matrices first) or file:PATH (one name "
                 "per line)")->capture_default_str();
  app.add_option("--data", a.data, "Probe data: safetensors file with 'inputs' and 'targets', or "
                 "a uint16 token file (nanoGPT's .bin; needs --block-size)");
  app.add_option("--block-size", a.block_size, "Window length T for uint16 token data: --examples "
                 "windows at seeded offsets")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", a.batch_size, "Probe batch size (examples per HVP batch)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--examples", a.examples, "Use the first N probe examples (0 = all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--directions", a.directions, "Directions, comma-separated (see --list-directions)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--steps", a.steps, "Checkpoint steps to probe: FIRST:LAST, FIRST:, :LAST (inclusive)");
  app.add_option("--stride", a.stride, "Probe every K-th selected checkpoint")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--blocks", a.blocks, "Block rule: layer (transformer layers + embeddings + head), "
                 "tensor, whole")->capture_default_str()->check(CLI::IsMember({"layer", "tensor", "whole"}));
  app.add_option("--block-group", a.block_groups,
                 "User block NAME=REGEX (repeatable; overrides --blocks; unmatched go to 'rest')");
  app.add_option("--coupling", a.coupling, "Coupling matrix: full (one HVP per block), random "
                 "(Rademacher estimate of each C_ll), none (row sums only)")
      ->capture_default_str()->check(CLI::IsMember({"full", "random", "none"}));
  app.add_option("--coupling-samples", a.coupling_samples, "HVPs of --coupling random")
      ->capture_default_str()->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  app.add_option("--multipliers", a.multipliers,
                 "Also compare predicted and realized change at θ + η·u for these η")->delimiter(',');
  app.add_flag("--no-realized", a.no_realized, "Skip evaluating L(θ+u) (saves one forward pass per batch)");
  app.add_flag("--within", a.within, "Within-block breakdown of matrix parameters: singular-mode "
               "curvature, head / Q,K,V groups, update isotropy");
  app.add_option("--within-params", a.within_params,
                 "Regex of parameters for --within (default: 2-D, not embeddings or head)");
  app.add_option("--modes", a.modes, "Singular modes per matrix for --within (one HVP each)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--row-chunks", a.row_chunks, "Row groups for non-attention matrices in --within")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--within-max-hvps", a.within_max_hvps, "HVP budget of --within per unit (0 = none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("-o,--output", a.output, "Output HDF5 file")->capture_default_str();
  app.add_flag("--resume", a.resume, "Keep the results already in --output and skip finished units");
  app.add_option("--hvp", a.hvp, "HVP method: exact (double backward) or fd (central differences)")
      ->capture_default_str()->check(CLI::IsMember({"exact", "fd"}));
  app.add_option("--max-kept-graphs", a.max_kept_graphs,
                 "Keep gradient graphs of at most N probe batches between HVPs (0 = all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--allow-extra", a.allow_extra, "Ignore checkpoint tensors that are not model parameters");
  app.add_flag("--whatif-fallback", a.whatif_fallback,
               "Optimizer directions at checkpoints without usable saved state take a what-if step "
               "from fresh state (noted in the output) instead of failing");
  app.add_flag("--list-directions", a.list_directions, "List the known directions and exit");
  tools::add_runtime_args(app, a.runtime);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (a.list_directions) {
    for (const auto& [name, help] : known_directions()) std::printf("%-12s %s\n", name.c_str(), help.c_str());
    return 0;
  }
  if (a.runs.empty()) throw InvalidArgument("no checkpoint directory given (see --help)");
  if (a.data.empty()) throw InvalidArgument("no probe data: pass --data FILE.safetensors or FILE.bin");
  const bool token_data = fs::path(a.data).extension() == ".bin";
  if (token_data && (a.block_size == 0 || a.examples == 0)) {
    throw InvalidArgument(fmt::format("--data {}: a uint16 token file needs --block-size T and "
                                      "--examples N (the number of windows)", a.data));
  }
  if (!token_data && a.block_size != 0) {
    throw InvalidArgument(fmt::format("--block-size applies to uint16 token files (.bin), not {}",
                                      a.data));
  }
  const CheckpointLayout layout = parse_checkpoint_layout(a.layout);
  validate_param_order(a.param_order);

  init_runtime(RuntimeOptions{a.runtime.threads});
  // Validate everything cheap before the first HVP.
  // "--directions muon.whatif:match=1,lr=0.01,delta": CLI11 splits at every comma, so pieces
  // that are only key=value belong to the spec before them.
  std::vector<std::string> specs;
  for (const auto& piece : a.directions) {
    if (!specs.empty() && piece.find('=') != std::string::npos &&
        piece.find(':') == std::string::npos && specs.back().find(':') != std::string::npos) {
      specs.back() += "," + piece;
    } else {
      specs.push_back(piece);
    }
  }
  std::vector<std::unique_ptr<Direction>> directions;
  std::set<std::string> seen_directions;
  for (const auto& spec : specs) {
    directions.push_back(make_direction(spec));
    if (!seen_directions.insert(directions.back()->name()).second) {
      throw InvalidArgument(fmt::format("--directions lists '{}' twice", spec));
    }
  }
  const StepSelection selection = StepSelection::parse(a.steps, a.stride);
  std::vector<std::vector<CheckpointInfo>> all, chosen;
  for (const auto& dir : a.runs) {
    all.push_back(list_checkpoints(dir, {}, layout));
    chosen.push_back(selection.select(all.back()));
    if (chosen.back().empty()) {
      throw InvalidArgument(fmt::format("no checkpoint of '{}' in the selection {}", dir,
                                        selection.describe()));
    }
  }
  check_writable(a.output);
  const auto names = run_names(a.runs);

  Checkpoint first = load_checkpoint(chosen[0][0]);
  tools::LoadedModel model = tools::load_model(a.model, a.runtime, first.model_config_json());
  Objective& objective = *model.objective;
  ProbeDataOptions data_options;
  data_options.batch_size = a.batch_size;
  data_options.max_examples = a.examples;
  ProbeSet probe = token_data ? load_token_probe_data(a.data, a.block_size, a.examples,
                                                      a.batch_size, a.runtime.seed)
                             : load_probe_data(a.data, data_options);
  const BlockPartition blocks = make_blocks(a, objective.space());

  EngineOptions engine_options;
  engine_options.hvp_method = parse_hvp_method(a.hvp);
  engine_options.max_kept_graphs = a.max_kept_graphs;
  CurvatureEngine engine(objective, probe, engine_options);

  TaylorOptions taylor_options;
  taylor_options.coupling = parse_coupling_mode(a.coupling);
  taylor_options.coupling_samples = a.coupling_samples;
  taylor_options.seed = a.runtime.seed;
  taylor_options.realized = !a.no_realized;
  taylor_options.step_multipliers = a.multipliers;
  taylor_options.validate();
  WithinOptions within_options;
  within_options.param_regex = a.within_params;
  within_options.modes = a.modes;
  within_options.row_chunks = a.row_chunks;
  within_options.max_hvps = a.within_max_hvps;
  if (model.builtin && model.config.arch == "gpt") within_options.n_head = model.config.gpt.n_head;
  within_options.validate();

  Provenance provenance;
  provenance.tool = "ndsprobe";
  provenance.version = CURV_VERSION;
  provenance.command_line = tools::command_line(argc, argv);
  provenance.model = model.description;
  provenance.dtype = a.runtime.dtype;
  provenance.seed = static_cast<int64_t>(a.runtime.seed);
  provenance.probe_examples = probe.num_examples();
  provenance.probe_batches = static_cast<int64_t>(probe.size());
  provenance.probe_hash = probe.hash();
  provenance.threads = a.runtime.threads == 0 ? hardware_threads() : a.runtime.threads;
  provenance.runtime = runtime_summary();
  provenance.blocks = a.block_groups.empty() ? a.blocks : "groups:" + fmt::format("{}", fmt::join(a.block_groups, ";"));
  provenance.hvp_method = a.hvp;
  provenance.extra["probe_data"] = a.data;
  provenance.extra["param_names"] = fmt::format("{}", fmt::join(objective.space().names(), ","));
  provenance.extra["block_names"] = fmt::format("{}", fmt::join(blocks.names(), ","));
  ProbeReport report(a.output, provenance, a.resume);

  size_t total = 0;
  for (const auto& c : chosen) total += c.size() * directions.size();
  tools::Progress progress(total, a.runtime.quiet);
  size_t done = 0;
  for (size_t r = 0; r < a.runs.size(); ++r) {
    report.set_run_attribute(names[r], "path", fs::absolute(a.runs[r]).string());
    report.set_run_attribute(names[r], "layout", layout_name(all[r].front().layout));
    for (const auto& info : chosen[r]) {
      bool all_done = true;
      for (const auto& d : directions) all_done = all_done && report.done(names[r], info.step, d->name());
      if (all_done) {
        done += directions.size();
        progress.update(done, fmt::format("{} step {} (already in output)", names[r], info.step));
        continue;
      }
      Checkpoint ckpt = load_checkpoint(info);
      resolve_optimizer_state(ckpt, objective.space(), a.param_order);
      DirectionContext context;
      context.engine = &engine;
      context.current = &ckpt;
      context.step = info.step;
      context.seed = a.runtime.seed;
      context.whatif_fallback = a.whatif_fallback;
      for (const auto& b : blocks.blocks()) context.blocks.push_back(b.params);
      context.theta = parameters_from(ckpt, objective.space(), objective.parameters(), a.allow_extra);
      engine.set_parameters(context.theta);
      // The delta goes to the next saved checkpoint, whatever the selection's stride.
      const auto& listing = all[r];
      for (size_t k = 0; k + 1 < listing.size(); ++k) {
        if (listing[k].step == info.step) {
          Checkpoint next = load_checkpoint(listing[k + 1]);
          context.theta_next =
              parameters_from(next, objective.space(), objective.parameters(), a.allow_extra);
          break;
        }
      }
      report.add_checkpoint(names[r], info.step, engine.loss(), norm(engine.gradient()));
      for (const auto& d : directions) {
        const std::string label = fmt::format("{} step {} {}", names[r], info.step, d->name());
        if (!report.done(names[r], info.step, d->name())) {
          const std::string why = d->unavailable(context);
          if (!why.empty()) {
            report.add_status(names[r], info.step, d->name(), "unavailable", why);
          } else {
            context.note.clear();
            context.partition.clear();
            ParamVector u = d->compute(context);
            TaylorResult taylor = taylor_audit(engine, u, blocks, taylor_options);
            if (a.within) {
              WithinReport within = within_block(engine, u, within_options);
              report.add_taylor(names[r], info.step, d->name(), taylor, &within);
            } else {
              report.add_taylor(names[r], info.step, d->name(), taylor);
            }
            const std::string unit = unit_path(names[r], info.step, d->name());
            if (!context.note.empty()) report.writer().attribute(unit, "note", context.note);
            // Which rule each parameter got (aligned with the root attribute param_names).
            if (!context.partition.empty()) {
              report.writer().attribute(unit, "partition", context.partition);
            }
          }
          report.commit();
        }
        progress.update(++done, label);
      }
    }
  }
  report.commit();
  progress.finish();
  print_summary(report.taylor_table());
  std::fprintf(stderr, "ndsprobe: wrote %s (%s)\n", a.output.c_str(), engine.counters().brief().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tools::run_tool("ndsprobe", [&] { return run(argc, argv); });
}
