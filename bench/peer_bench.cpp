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

}  // namespace

int main(int argc, char** argv) {
  curv::reexec_for_blas_kernels(argv);
  std::map<std::string, std::string> a = {
      {"--batch-size", "8"},     {"--dtype", "float64"},
      {"--threads", "2"},        {"--device", "cpu"},
      {"--seed", "0"},           {"--eig-top", "3"},
      {"--eig-tol", "1e-6"},     {"--eig-bound", "gap"},
      {"--eig-max-hvps", "300"}, {"--trace-method", "hutchinson"},
      {"--trace-hvps", "99"},    {"--slq-runs", "5"},
      {"--slq-steps", "40"}};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "peer_bench: expected --flag value pairs, got '%s'\n", argv[i]);
      return 2;
    }
    a[argv[i]] = argv[i + 1];
  }
  for (const char* required : {"--op", "--run", "--data", "--out"}) {
    if (!a.count(required)) {
      std::fprintf(stderr, "peer_bench: %s is required\n", required);
      return 2;
    }
  }
  try {
    const double t_start = now();
    curv::init_runtime(curv::RuntimeOptions{std::atoi(a["--threads"].c_str())});
    const std::string op = a["--op"];
    const uint64_t seed = std::strtoull(a["--seed"].c_str(), nullptr, 10);

    const auto infos = curv::list_checkpoints(a["--run"]);
    const curv::Checkpoint ckpt =
        curv::load_checkpoint(infos.front(), curv::CheckpointParts::kModelOnly);
    curv::ModelSource source;
    source.init.dtype = curv::parse_dtype(a["--dtype"]);
    source.init.device = a["--device"];
    curv::LoadedModel model = curv::load_model(source, ckpt.model_config_json(), ckpt.meta_file);
    curv::Objective& objective = *model.objective;
    curv::ProbeDataOptions data_options;
    data_options.batch_size = std::atoll(a["--batch-size"].c_str());
    curv::ProbeSet probe = curv::load_probe_data(a["--data"], data_options);
    curv::CurvatureEngine engine(objective, probe);
    engine.set_parameters(curv::parameters_from(ckpt, objective.space(), objective.parameters()));
    curv::HessianOperator h(engine);
    const auto& space = objective.space();
    const bool cuda = a["--device"].rfind("cuda", 0) == 0;
    auto sync = [&] {
      if (cuda) engine.gradient()[0].cpu();  // waits for the device's queue
    };

    std::string body;
    int64_t hvps = 0;
    double seconds = 0.0;
    const double setup_seconds = now() - t_start;
    if (op == "setup") {
      body = "\"note\": \"model, probe set and engine built; no pass\"";
    } else if (op == "hvp") {
      curv::SafetensorsReader reader(a["--vector"]);
      curv::ParamVector v;
      const auto& params = objective.parameters();
      for (size_t i = 0; i < space.size(); ++i) {
        v.push_back(reader.tensor(space[i].name).to(params[i].device(), params[i].scalar_type()));
      }
      double t = now();
      curv::ParamVector hv = engine.hvp(v);  // builds each batch's gradient graph first
      sync();
      const double first = now() - t;
      t = now();
      hv = engine.hvp(v);  // reuses the kept graphs, as every later HVP of a solver does
      sync();
      const double second = now() - t;
      std::vector<std::pair<std::string, at::Tensor>> named;
      for (size_t i = 0; i < space.size(); ++i) {
        named.emplace_back(space[i].name, hv[i].detach().to(at::kCPU).contiguous());
      }
      curv::write_safetensors(a["--hvp-out"], named);
      hvps = 2;
      seconds = first;
      body = fmt::format("\"seconds_first\": {:.6f}, \"seconds_second\": {:.6f}", first, second);
    } else if (op == "eig") {
      curv::EigenOptions o;
      o.top = std::atoll(a["--eig-top"].c_str());
      o.bottom = 0;
      o.tol = std::atof(a["--eig-tol"].c_str());
      o.bound = curv::parse_error_bound(a["--eig-bound"]);
      o.max_hvps = std::atoll(a["--eig-max-hvps"].c_str());
      o.seed = seed;
      o.keep_vectors = false;
      const double t = now();
      const curv::EigenResult r = curv::extreme_eigenpairs(h, o);
      sync();
      seconds = now() - t;
      hvps = r.hvps + r.residual_hvps;
      std::vector<double> values, residuals, bounds;
      for (const auto& p : r.largest) {
        values.push_back(p.value);
        residuals.push_back(p.residual);
        bounds.push_back(p.error_bound);
      }
      body = fmt::format(
          "\"eigenvalues\": {}, \"residuals\": {}, \"error_bounds\": {}, \"solver_hvps\": {}, "
          "\"residual_hvps\": {}, \"converged\": {}, \"method\": \"lanczos, {} bound, tol {}, "
          "measured residuals\", \"message\": \"{}\"",
          json_list(values), json_list(residuals), json_list(bounds), r.hvps, r.residual_hvps,
          r.converged() ? "true" : "false", a["--eig-bound"], a["--eig-tol"], r.message);
    } else if (op == "trace") {
      curv::TraceOptions o;
      o.method = curv::parse_trace_method(a["--trace-method"]);
      o.matvecs = std::atoll(a["--trace-hvps"].c_str());
      o.seed = seed;
      const double t = now();
      const curv::TraceResult r = curv::estimate_trace(h, o);
      sync();
      seconds = now() - t;
      hvps = r.matvecs;
      body = fmt::format(
          "\"estimate\": {:.17g}, \"standard_error\": {:.17g}, \"samples\": {}, "
          "\"method\": \"estimate_trace({})\"",
          r.estimate, r.standard_error, r.samples, a["--trace-method"]);
    } else if (op == "density") {
      curv::DensityOptions o;
      o.runs = std::atoll(a["--slq-runs"].c_str());
      o.steps = std::atoll(a["--slq-steps"].c_str());
      o.seed = seed;
      const double t = now();
      const curv::DensityResult r = curv::spectral_density(h, o);
      sync();
      seconds = now() - t;
      hvps = r.hvps;
      double nodes_max = -1e300;
      for (size_t i = 0; i < r.nodes.size(); ++i) {
        if (r.weights[i] > 0) nodes_max = std::max(nodes_max, r.nodes[i]);
      }
      body = fmt::format(
          "\"trace_from_density\": {:.17g}, \"trace_standard_error\": {:.17g}, "
          "\"nodes_max\": {:.17g}, \"sigma\": {:.17g}, \"method\": \"spectral_density(runs {}, "
          "steps {})\"",
          r.trace, r.trace_standard_error, nodes_max, r.sigma, o.runs, o.steps);
    } else {
      std::fprintf(stderr, "peer_bench: unknown --op %s (hvp, eig, trace, density)\n", op.c_str());
      return 2;
    }
    const std::string text = fmt::format(
        "{{\"side\": \"libcurv\", \"op\": \"{}\", \"parameters\": {}, \"dtype\": \"{}\", "
        "\"device\": \"{}\", \"hvps\": {}, \"seconds\": {:.6f}, \"setup_seconds\": {:.6f}, "
        "\"total_seconds\": {:.6f}, \"runtime\": \"{}\", \"engine\": \"{}\", {}}}\n",
        op, space.numel(), a["--dtype"], a["--device"], hvps, seconds, setup_seconds,
        now() - t_start, curv::runtime_summary(), engine.counters().brief(), body);
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
