// libcurv's side of bench/peers.sh: one measurement per process on a checkpoint and probe set
// (the same files the Python peers read), through the calls ndsprobe makes: load_model on the
// checkpoint's model config, parameters_from, CurvatureEngine, HessianOperator and the spectrum
// solvers. Writes a JSON object (--out) with the HVP count, the seconds and the numbers.
//
//   peer_bench --op setup|hvp|eig|trace|density --run RUN --data probe.safetensors [--batch-size 8]
//              [--dtype float64] [--threads 2] [--device cpu] [--seed 0] --out result.json
//     setup:   loads the model, the probe set and the engine, and stops: the memory baseline
//     hvp:     --vector v.safetensors --hvp-out hv.safetensors (a first and a second product)
//     eig:     --eig-top 3 --eig-tol 1e-6 --eig-bound gap|residual --eig-max-hvps 300
//     trace:   --trace-method hutchinson|hutchpp --trace-hvps 99
//     density: --slq-runs 5 --slq-steps 40
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "curv/analysis/spectrum.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "curv/io/checkpoint.h"
#include "curv/io/probe_data.h"
#include "curv/io/safetensors.h"
#include "curv/models/model_loader.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string json_list(const std::vector<double>& xs) {
  std::string s = "[";
  for (size_t i = 0; i < xs.size(); ++i) s += fmt::format("{}{:.17g}", i ? ", " : "", xs[i]);
  return s + "]";
}

using Flags = std::map<std::string, std::string>;

// What one operation measured: its HVPs, its seconds and its numbers as JSON members.
struct Measurement {
  int64_t hvps = 0;
  double seconds = 0.0;
  std::string body;
};

// The model, probe set and engine on the checkpoint, with `sync` waiting for the device.
struct Setup {
  curv::LoadedModel model;
  std::unique_ptr<curv::CurvatureEngine> engine;
  std::unique_ptr<curv::HessianOperator> h;
  bool cuda = false;
  void sync() {
    if (cuda) engine->gradient()[0].cpu();  // waits for the device's queue
  }
};

Measurement measure_hvp(Flags& a, Setup& s) {
  const auto& space = s.model.objective->space();
  curv::SafetensorsReader reader(a["--vector"]);
  curv::ParamVector v;
  const auto& params = s.model.objective->parameters();
  for (size_t i = 0; i < space.size(); ++i) {
    v.push_back(reader.tensor(space[i].name).to(params[i].device(), params[i].scalar_type()));
  }
  double t = now();
  curv::ParamVector hv = s.engine->hvp(v);  // builds each batch's gradient graph first
  s.sync();
  const double first = now() - t;
  t = now();
  hv = s.engine->hvp(v);  // reuses the kept graphs, as every later HVP of a solver does
  s.sync();
  const double second = now() - t;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < space.size(); ++i) {
    named.emplace_back(space[i].name, hv[i].detach().to(at::kCPU).contiguous());
  }
  curv::write_safetensors(a["--hvp-out"], named);
  return {2, first,
          fmt::format("\"seconds_first\": {:.6f}, \"seconds_second\": {:.6f}", first, second)};
}

Measurement measure_eig(Flags& a, Setup& s, uint64_t seed) {
  curv::EigenOptions o;
  o.top = std::atoll(a["--eig-top"].c_str());
  o.bottom = 0;
  o.tol = std::atof(a["--eig-tol"].c_str());
  o.bound = curv::parse_error_bound(a["--eig-bound"]);
  o.max_hvps = std::atoll(a["--eig-max-hvps"].c_str());
  o.seed = seed;
  o.keep_vectors = false;
  const double t = now();
  const curv::EigenResult r = curv::extreme_eigenpairs(*s.h, o);
  s.sync();
  Measurement m{r.hvps + r.residual_hvps, now() - t, ""};
  std::vector<double> values, residuals, bounds;
  for (const auto& p : r.largest) {
    values.push_back(p.value);
    residuals.push_back(p.residual);
    bounds.push_back(p.error_bound);
  }
  m.body = fmt::format(
      "\"eigenvalues\": {}, \"residuals\": {}, \"error_bounds\": {}, \"solver_hvps\": {}, "
      "\"residual_hvps\": {}, \"converged\": {}, \"method\": \"lanczos, {} bound, tol {}, "
      "measured residuals\", \"message\": \"{}\"",
      json_list(values), json_list(residuals), json_list(bounds), r.hvps, r.residual_hvps,
      r.converged() ? "true" : "false", a["--eig-bound"], a["--eig-tol"], r.message);
  return m;
}

Measurement measure_trace(Flags& a, Setup& s, uint64_t seed) {
  curv::TraceOptions o;
  o.method = curv::parse_trace_method(a["--trace-method"]);
  o.matvecs = std::atoll(a["--trace-hvps"].c_str());
  o.seed = seed;
  const double t = now();
  const curv::TraceResult r = curv::estimate_trace(*s.h, o);
  s.sync();
  return {r.matvecs, now() - t,
          fmt::format("\"estimate\": {:.17g}, \"standard_error\": {:.17g}, \"samples\": {}, "
                      "\"method\": \"estimate_trace({})\"",
                      r.estimate, r.standard_error, r.samples, a["--trace-method"])};
}

Measurement measure_density(Flags& a, Setup& s, uint64_t seed) {
  curv::DensityOptions o;
  o.runs = std::atoll(a["--slq-runs"].c_str());
  o.steps = std::atoll(a["--slq-steps"].c_str());
  o.seed = seed;
  const double t = now();
  const curv::DensityResult r = curv::spectral_density(*s.h, o);
  s.sync();
  Measurement m{r.hvps, now() - t, ""};
  double nodes_max = -1e300;
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    if (r.weights[i] > 0) nodes_max = std::max(nodes_max, r.nodes[i]);
  }
  m.body = fmt::format(
      "\"trace_from_density\": {:.17g}, \"trace_standard_error\": {:.17g}, "
      "\"nodes_max\": {:.17g}, \"sigma\": {:.17g}, \"method\": \"spectral_density(runs {}, "
      "steps {})\"",
      r.trace, r.trace_standard_error, nodes_max, r.sigma, o.runs, o.steps);
  return m;
}

// The flags with their defaults; false (after naming the problem) when malformed.
bool parse_flags(int argc, char** argv, Flags& a) {
  a = {{"--batch-size", "8"},     {"--dtype", "float64"},
       {"--threads", "2"},        {"--device", "cpu"},
       {"--seed", "0"},           {"--eig-top", "3"},
       {"--eig-tol", "1e-6"},     {"--eig-bound", "gap"},
       {"--eig-max-hvps", "300"}, {"--trace-method", "hutchinson"},
       {"--trace-hvps", "99"},    {"--slq-runs", "5"},
       {"--slq-steps", "40"}};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "peer_bench: expected --flag value pairs, got '%s'\n", argv[i]);
      return false;
    }
    a[argv[i]] = argv[i + 1];
  }
  for (const char* required : {"--op", "--run", "--data", "--out"}) {
    if (!a.count(required)) {
      std::fprintf(stderr, "peer_bench: %s is required\n", required);
      return false;
    }
  }
  const std::string op = a["--op"];
  if (op != "setup" && op != "hvp" && op != "eig" && op != "trace" && op != "density") {
    std::fprintf(stderr, "peer_bench: unknown --op %s (setup, hvp, eig, trace, density)\n",
                 op.c_str());
    return false;
  }
  return true;
}

void set_up(Flags& a, Setup& s) {
  const auto infos = curv::list_checkpoints(a["--run"]);
  const curv::Checkpoint ckpt =
      curv::load_checkpoint(infos.front(), curv::CheckpointParts::kModelOnly);
  curv::ModelSource source;
  source.init.dtype = curv::parse_dtype(a["--dtype"]);
  source.init.device = a["--device"];
  s.model = curv::load_model(source, ckpt.model_config_json(), ckpt.meta_file);
  curv::Objective& objective = *s.model.objective;
  curv::ProbeDataOptions data_options;
  data_options.batch_size = std::atoll(a["--batch-size"].c_str());
  curv::ProbeSet probe = curv::load_probe_data(a["--data"], data_options);
  s.engine = std::make_unique<curv::CurvatureEngine>(objective, probe);
  s.engine->set_parameters(curv::parameters_from(ckpt, objective.space(), objective.parameters()));
  s.h = std::make_unique<curv::HessianOperator>(*s.engine);
  s.cuda = a["--device"].rfind("cuda", 0) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  curv::reexec_for_blas_kernels(argv);
  Flags a;
  if (!parse_flags(argc, argv, a)) return 2;
  try {
    const double t_start = now();
    curv::init_runtime(curv::RuntimeOptions{std::atoi(a["--threads"].c_str())});
    const std::string op = a["--op"];
    const uint64_t seed = std::strtoull(a["--seed"].c_str(), nullptr, 10);
    Setup s;
    set_up(a, s);
    const double setup_seconds = now() - t_start;
    Measurement m{0, 0.0, "\"note\": \"model, probe set and engine built; no pass\""};
    if (op == "hvp") m = measure_hvp(a, s);
    if (op == "eig") m = measure_eig(a, s, seed);
    if (op == "trace") m = measure_trace(a, s, seed);
    if (op == "density") m = measure_density(a, s, seed);
    const std::string text = fmt::format(
        "{{\"side\": \"libcurv\", \"op\": \"{}\", \"parameters\": {}, \"dtype\": \"{}\", "
        "\"device\": \"{}\", \"hvps\": {}, \"seconds\": {:.6f}, \"setup_seconds\": {:.6f}, "
        "\"total_seconds\": {:.6f}, \"runtime\": \"{}\", \"engine\": \"{}\", {}}}\n",
        op, s.model.objective->space().numel(), a["--dtype"], a["--device"], m.hvps, m.seconds,
        setup_seconds, now() - t_start, curv::runtime_summary(), s.engine->counters().brief(),
        m.body);
    std::FILE* f = std::fopen(a["--out"].c_str(), "w");
    if (!f) throw curv::InvalidArgument("peer_bench: cannot write --out " + a["--out"]);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  } catch (const curv::Error& e) {
    std::fprintf(stderr, "peer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
