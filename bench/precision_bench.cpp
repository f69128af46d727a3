// The error low-precision arithmetic brings to an audit: g·u, uᵀHu, NDS and λ_max of the built-in
// GPT and LLaMA at two sizes, in float32, bfloat16 and float16 (and TF32 on a GPU), each against
// float64 arithmetic on the same weights (the weights rounded to the dtype first, as a checkpoint
// in that dtype holds them), with exact and finite-difference HVPs. The models are trained
// for a few AdamW steps on Zipf-PCFG data so that u, the next AdamW update, is a real one. Prints
// Markdown tables on stdout (docs/performance.md).
//
// A bfloat16 model is also measured with bfloat16 vectors (--vector-dtype bfloat16).
//
//   precision_bench [--threads 2] [--device cpu] [--steps 30] [--sizes small,reference]
//                   [--fd-scan]   (also the finite-difference bias by step, in 16 bits)
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "curv/analysis/spectrum.h"
#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"
#include "curv/core/precision.h"
#include "curv/core/runtime.h"
#include "curv/io/zipf_pcfg.h"
#include "curv/models/models.h"

namespace {

using namespace curv;

ModelConfig config_of(const std::string& arch, const std::string& size) {
  const bool small = size == "small";
  const int layers = small ? 2 : 4, width = small ? 64 : 128;
  if (arch == "gpt") {
    return ModelConfig::from_json(fmt::format(
        R"({{"arch": "gpt", "n_layer": {}, "n_head": 4, "n_embd": {}, "vocab_size": 512,
            "block_size": 64, "tied": true}})",
        layers, width));
  }
  return ModelConfig::from_json(fmt::format(
      R"({{"arch": "llama", "vocab_size": 512, "hidden_size": {}, "intermediate_size": {},
          "num_hidden_layers": {}, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 64, "tie_word_embeddings": true}})",
      width, 4 * width, layers));
}

// "GPT 2×64": the architecture, layers and width.
std::string label_of(const ModelConfig& config) {
  const std::string arch = config.arch() == "gpt" ? "GPT" : "LLaMA";
  const int64_t params = static_cast<int64_t>(config.parameter_count());
  return fmt::format("{} {:.2f}M", arch, static_cast<double>(params) / 1e6);
}

ProbeSet zipf_batches(const ZipfPcfg& grammar, int64_t sequences, uint64_t seed) {
  auto [x, y] = grammar.sample_windows(sequences, 64, 1.0, seed);
  return ProbeSet({Batch{x, y}});
}

// θ after `steps` AdamW steps (lr 1e-3, β 0.9/0.999, weight decay 0.01) from a seeded init, in
// float64, and the next step's update u.
struct Trained {
  ParamVector theta, update;
};

Trained train(Objective& model, const ZipfPcfg& grammar, int steps, const c10::Device& device) {
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  ParamVector theta = snapshot_parameters(model), m = zeros_like(theta), v = zeros_like(theta);
  ParamVector update;
  for (int t = 1; t <= steps + 1; ++t) {
    CurvatureEngine engine(model, zipf_batches(grammar, 16, 100 + t).to(at::kDouble, device));
    const ParamVector& g = engine.gradient();
    update.clear();
    for (size_t i = 0; i < theta.size(); ++i) {
      m[i].mul_(b1).add_(g[i], 1 - b1);
      v[i].mul_(b2).addcmul_(g[i], g[i], 1 - b2);
      const at::Tensor step =
          m[i] / (1 - std::pow(b1, t)) / ((v[i] / (1 - std::pow(b2, t))).sqrt() + eps);
      update.push_back(-lr * (step + wd * theta[i]));
    }
    if (t <= steps) {
      for (size_t i = 0; i < theta.size(); ++i) theta[i].add_(update[i]);
      load_parameters(model, theta);
    }
  }
  return {theta, update};
}

struct Measured {
  double loss = 0, realized = 0, gu = 0, uhu = 0, nds = 0, lmax = 0, fd_uhu = 0;
  double seconds = 0;
};

double lambda_max(CurvatureEngine& engine) {
  HessianOperator h(engine);
  EigenOptions o;
  o.top = 1;
  o.tol = 1e-5;
  o.max_hvps = 80;
  o.seed = 7;
  o.check_residuals = false;
  o.keep_vectors = false;
  return extreme_eigenpairs(h, o).largest.at(0).value;
}

// The audit of u at θ with the model in `dtype` (matmul precision `precision` for float32);
// `vectors`: the engine's vector dtype (Undefined: its default), u rounded to it first.
Measured measure(const ModelConfig& config, const ParamVector& theta, const ParamVector& u_in,
                 const ProbeSet& probe, at::ScalarType dtype, MatmulPrecision precision,
                 const c10::Device& device, bool eigen,
                 at::ScalarType vectors = at::ScalarType::Undefined) {
  ScopedMatmulPrecision scoped(precision);
  auto model = make_model(config, ModelInit{0, dtype, device.str()});
  load_parameters(*model, converted(theta, dtype));
  const ParamVector u = vectors == at::ScalarType::Undefined ? u_in : converted(u_in, vectors);
  const auto start = std::chrono::steady_clock::now();
  Measured r;
  EngineOptions exact;
  exact.vector_dtype = vectors;
  CurvatureEngine engine(*model, probe, exact);
  const ParamVector hu = engine.hvp(u);
  r.gu = dot(engine.gradient(), u);
  r.loss = engine.loss();
  r.realized = engine.loss_at(u) - r.loss;
  r.uhu = dot(u, hu);
  r.nds = r.uhu / dot(u, u);
  if (eigen) r.lmax = lambda_max(engine);
  EngineOptions fd = exact;
  fd.hvp_method = HvpMethod::kFiniteDifference;
  CurvatureEngine differences(*model, probe, fd);
  r.fd_uhu = dot(u, differences.hvp(u));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

double rel(double value, double reference) {
  return std::abs(value - reference) / std::abs(reference);
}

// The finite-difference uᵀHu of a 16-bit model against the exact float64 one, for steps of c
// spacings of θ per coordinate (fd_step_for takes 0.5).
void fd_scan(const ModelConfig& config, const ParamVector& theta, const ParamVector& u,
             const ProbeSet& probe, at::ScalarType dtype, double exact, const c10::Device& device) {
  auto model = make_model(config, ModelInit{0, dtype, device.str()});
  load_parameters(*model, converted(theta, dtype));
  const ParamVector low = snapshot_parameters(*model);
  int64_t n = 0;
  for (const auto& t : low) n += t.numel();
  const double rms = norm(low) / std::sqrt(static_cast<double>(n));
  const double eps = dtype == at::kBFloat16 ? 0.0078125 : 0.0009765625;
  for (const double c : {0.125, 0.25, 0.5, 1.0, 2.0}) {
    EngineOptions fd;
    fd.hvp_method = HvpMethod::kFiniteDifference;
    fd.fd_step = c * eps * rms * std::sqrt(static_cast<double>(n));
    CurvatureEngine engine(*model, probe, fd);
    fmt::print("| {} | {} | {:g} | {:.1e} |\n", label_of(config), dtype_name(dtype), c,
               rel(dot(u, engine.hvp(u)), exact));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, steps = 30;
  std::string device_name = "cpu";
  std::vector<std::string> sizes = {"small", "reference"};
  bool scan = false;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--threads") && more) threads = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--steps") && more) steps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--device") && more) device_name = argv[++i];
    if (!std::strcmp(argv[i], "--sizes") && more) {
      const std::string list = argv[++i];
      sizes = list == "small"       ? std::vector<std::string>{"small"}
              : list == "reference" ? std::vector<std::string>{"reference"}
                                    : sizes;
    }
    if (!std::strcmp(argv[i], "--fd-scan")) scan = true;
  }
  init_runtime(RuntimeOptions{threads});
  const c10::Device device(device_name);
  ZipfPcfgOptions grammar_options;
  grammar_options.vocab_size = 512;
  grammar_options.emissions_per_symbol = 511;
  const ZipfPcfg grammar(grammar_options);
  fmt::print("{}; {} AdamW steps; probe: 32 × 64 Zipf-PCFG tokens\n\n", runtime_summary(), steps);
  fmt::print(
      "| model | dtype | L | ΔL realized | g·u | uᵀHu | NDS | λ_max | uᵀHu, fd | ΔL (float64) | "
      "NDS (float64) | λ_max (float64) | s "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct Scan {
    ModelConfig config;
    ParamVector theta, u;
    double exact;
    at::ScalarType dtype;
  };
  std::vector<Scan> scans;
  const ProbeSet probe = zipf_batches(grammar, 32, 1).to(at::kDouble, device);
  for (const std::string arch : {"gpt", "llama"}) {
    for (const auto& size : sizes) {
      const ModelConfig config = config_of(arch, size);
      auto model = make_model(config, ModelInit{1, at::kDouble, device.str()});
      const Trained t = train(*model, grammar, steps, device);
      std::vector<std::pair<std::string, at::ScalarType>> rows = {{"float32", at::kFloat},
                                                                  {"bfloat16", at::kBFloat16}};
      if (!device.is_cpu() || cpu_matrix_products(at::kHalf))
        rows.push_back({"float16", at::kHalf});
      for (const auto& [name, dtype] : rows) {
        // The reference: float64 arithmetic on the weights this dtype holds.
        const ParamVector weights = converted(converted(t.theta, dtype), at::kDouble);
        const Measured want = measure(config, weights, t.update, probe, at::kDouble,
                                      MatmulPrecision::kHighest, device, true);
        auto row = [&](const std::string& label, at::ScalarType d, MatmulPrecision p,
                       at::ScalarType vectors = at::ScalarType::Undefined) {
          const Measured got =
              measure(config, weights, t.update, probe, d, p, device, true, vectors);
          fmt::print(
              "| {} | {} | {:.1e} | {:.1e} | {:.1e} | {:.1e} | {:.1e} | {:.1e} | {:.1e} | "
              "{:.3g} | {:.4g} | {:.4g} | {:.1f} |\n",
              label_of(config), label, rel(got.loss, want.loss), rel(got.realized, want.realized),
              rel(got.gu, want.gu), rel(got.uhu, want.uhu), rel(got.nds, want.nds),
              rel(got.lmax, want.lmax), rel(got.fd_uhu, want.uhu), want.realized, want.nds,
              want.lmax, got.seconds);
          std::fflush(stdout);
        };
        row(name, dtype, MatmulPrecision::kHighest);
        // The same model with bfloat16 directions, gradients, products and solver vectors: what
        // a plan that has no room for float32 vectors gives up.
        if (dtype == at::kBFloat16) {
          row("bfloat16, bfloat16 vectors", dtype, MatmulPrecision::kHighest, at::kBFloat16);
        }
        if (dtype == at::kFloat && device.is_cuda()) row("TF32", dtype, MatmulPrecision::kHigh);
        if (scan && is_16_bit(dtype)) scans.push_back({config, weights, t.update, want.uhu, dtype});
      }
    }
  }
  if (scan) {
    fmt::print("\n| model | dtype | step (spacings of θ) | uᵀHu, fd: error |\n|---|---|---|---|\n");
    for (const auto& s : scans) fd_scan(s.config, s.theta, s.u, probe, s.dtype, s.exact, device);
  }
  return 0;
}
