// Cost of loss, gradient and Hessian-vector products on the reference GPT, relative to a
// gradient, and the peak memory each needs. Each measurement runs in its own process (this
// binary re-invoked with --op), so allocator reuse from an earlier measurement cannot hide memory.
//
//   hvp_bench [--threads 2] [--repeats 5]            all ops, float32 and float64, a Markdown table
//   hvp_bench --device cuda [--shape gpt2]           the same on a GPU: times after the device
//       finished, memory as the allocator's peak of tensor bytes above what the model holds
//   hvp_bench --op hvp_reused --dtype float32        one measurement, one JSON line
//   (ops: loss, gradient, hvp_first, hvp_reused, lanczos_step: one step of the Lanczos solver
//   with its vectors on the model's device, per step of 10 after the graph is kept; hvp_fd)
//   hvp_bench --compare-cross-entropy 1 [--shape gpt2] [--repeats 2]
//       gradient and HVPs with ATen's cross-entropy and with libcurv's fused one, float32;
//       --shape gpt2 is GPT-2 small's shape (124M parameters) on 4 sequences of 256 tokens;
//       --shape llama and llama_gpt2 are LLaMAs (shape_of below)
//   hvp_bench --compare-fused-ops 1 [--shape gpt2] [--repeats 5] [--dtype float32] [--device D]
//       gradient and HVPs with ATen's softmax, LayerNorm, GELU, RMSNorm, SwiGLU and rotary
//       product, with libcurv's fused ones
//       (curv/models/fused_ops.h) taking composite second derivatives, and with their kernels
//       (the CPU's; on a GPU the CUDA kernels, the cross-entropy's included), float32 and
//       float64, each as a multiple of its own gradient; --fused-ops aten|composite|fused picks
//       one for --op
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "curv/analysis/spectrum.h"
#include "curv/core/engine.h"
#include "curv/core/linear_operator.h"
#include "curv/core/runtime.h"
#include "curv/models/fused_ops.h"
#include "curv/models/models.h"
#include "reference_model.h"

namespace {

using curv_bench::reference_config;

long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr int kLanczosSteps = 10;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The bench's model shapes: the reference GPT (32 sequences of 64 tokens); GPT-2 small's shape
// (124M parameters, 4 sequences of 256 tokens); "llama", the reference GPT's size as a LLaMA
// (RMSNorm, rotary, SwiGLU; 32 x 64 tokens); "llama_gpt2", a LLaMA of GPT-2 small's size (hidden
// 768, 12 layers of 12 heads, SwiGLU 2048, vocabulary 50257) on 16 sequences of 1024 tokens.
// Sequences are the model's context long.
struct Shape {
  curv::ModelConfig config;
  int64_t sequences;
};

Shape shape_of(const std::string& shape) {
  if (shape == "gpt2") {
    return {curv::ModelConfig::from_json(
                R"({"arch": "gpt", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304,
                    "block_size": 256, "tied": true})"),
            4};
  }
  if (shape == "llama") {
    return {curv::ModelConfig::from_json(
                R"({"arch": "llama", "vocab_size": 512, "hidden_size": 128,
                    "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "max_position_embeddings": 64})"),
            32};
  }
  if (shape == "llama_gpt2") {
    return {curv::ModelConfig::from_json(
                R"({"arch": "llama", "vocab_size": 50257, "hidden_size": 768,
                    "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                    "max_position_embeddings": 1024})"),
            16};
  }
  return {reference_config(), 32};
}

curv::ModelConfig shape_config(const std::string& shape) { return shape_of(shape).config; }

// The model of `shape` in `dtype_name`, its probe batch and a random direction v: the same for
// every measurement.
struct Setup {
  std::unique_ptr<curv::Objective> model;
  curv::ProbeSet probe;
  curv::ParamVector v;
};

Setup make_setup(const std::string& dtype_name, const std::string& shape_name,
                 const std::string& device = "cpu") {
  const auto dtype = dtype_name == "float64" ? at::kDouble : at::kFloat;
  const Shape shape = shape_of(shape_name);
  Setup s;
  s.model = curv::make_model(shape.config, curv::ModelInit{0, dtype, device});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  s.probe = curv_bench::reference_probe(shape.config, gen, shape.sequences)
                .to(dtype, c10::Device(device));  // where the model is, as the engine puts it
  // Drawn on the CPU from one generator: the same v on every device.
  for (const auto& p : s.model->parameters()) {
    s.v.push_back(at::randn(p.sizes(), gen, p.options().device(at::kCPU)).to(p.device()));
  }
  return s;
}

// Waits for the device's queued work (a no-op on the CPU), so that a time covers it.
void finish(const c10::Device& device) {
  if (!device.is_cpu()) at::zeros({1}, at::TensorOptions().device(device)).item<float>();
}

int measure(const std::string& op, const std::string& dtype_name, int repeats, bool memory_mode,
            const std::string& shape, const std::string& device_name) {
  Setup setup = make_setup(dtype_name, shape, device_name);
  const c10::Device device(device_name);
  auto& model = setup.model;
  const curv::ProbeSet& probe = setup.probe;
  const curv::ParamVector& v = setup.v;

  // Warm-up outside the measurement: thread pool and first touch of the weights.
  {
    c10::NoGradGuard no_grad;
    model->loss(probe[0]);
  }
  std::vector<double> times;
  finish(device);
  const long baseline = status_kib("VmRSS:");
  reset_peak_rss();
  // On a GPU the allocator's statistics: the peak of tensor bytes above what is held now.
  const int64_t device_baseline = device.is_cpu() ? 0 : curv::device_memory(device).in_use;
  curv::reset_peak_memory(device);
  // An engine whose graphs were built by one HVP outside the timings, for the ops that reuse them.
  std::unique_ptr<curv::CurvatureEngine> kept;
  auto kept_engine = [&]() -> curv::CurvatureEngine& {
    if (!kept) {
      kept = std::make_unique<curv::CurvatureEngine>(*model, probe);
      kept->hvp(v);
    }
    return *kept;
  };
  for (int r = 0; r < repeats; ++r) {
    curv::EngineOptions options;
    if (op == "loss") {
      c10::NoGradGuard no_grad;
      auto start = std::chrono::steady_clock::now();
      model->loss(probe[0]).item<double>();
      finish(device);
      times.push_back(seconds_since(start));
    } else if (op == "gradient") {
      options.reuse_graph = false;
      curv::CurvatureEngine engine(*model, probe, options);
      auto start = std::chrono::steady_clock::now();
      engine.gradient();
      finish(device);
      times.push_back(seconds_since(start));
    } else if (op == "hvp_first") {
      curv::CurvatureEngine engine(*model, probe, options);
      auto start = std::chrono::steady_clock::now();
      engine.hvp(v);
      finish(device);
      times.push_back(seconds_since(start));
    } else if (op == "hvp_reused") {
      curv::CurvatureEngine& engine = kept_engine();
      auto start = std::chrono::steady_clock::now();
      engine.hvp(v);
      finish(device);
      times.push_back(seconds_since(start));
    } else if (op == "lanczos_step") {
      // One Lanczos step: an HVP through HessianOperator plus the recurrence and the full
      // reorthogonalisation on the device, per step of a 10-step run that cannot converge.
      curv::HessianOperator h(kept_engine());
      curv::EigenOptions lanczos;
      lanczos.max_hvps = kLanczosSteps;
      lanczos.tol = 1e-15;
      lanczos.check_residuals = false;
      lanczos.keep_vectors = false;
      auto start = std::chrono::steady_clock::now();
      curv::extreme_eigenpairs(h, lanczos);
      finish(device);
      times.push_back(seconds_since(start) / kLanczosSteps);
    } else if (op == "hvp_fd") {
      options.reuse_graph = false;
      curv::CurvatureEngine engine(*model, probe, options);
      auto start = std::chrono::steady_clock::now();
      engine.hvp_finite_difference(v);
      finish(device);
      times.push_back(seconds_since(start));
    } else {
      std::fprintf(stderr, "unknown --op %s\n", op.c_str());
      return 2;
    }
  }
  const double peak_extra_mib =
      device.is_cpu() ? (status_kib("VmHWM:") - baseline) / 1024.0
                      : (curv::device_memory(device).peak - device_baseline) / 1048576.0;
  std::printf(
      "{\"op\": \"%s\", \"dtype\": \"%s\", \"seconds\": %.6f, \"peak_extra_mib\": %.1f, "
      "\"params\": %lld}\n",
      op.c_str(), dtype_name.c_str(), median(times), peak_extra_mib,
      static_cast<long long>(model->space().numel()));
  return 0;
}

// The fused operations' variants compared: ATen's softmax, LayerNorm and GELU; the fused
// operations with their second derivatives as composite ATen formulas; the fused operations with
// their kernels (the CPU's, or the CUDA kernels on a GPU, which cover the cross-entropy too).
const char* const kFusedKinds[] = {"aten", "composite", "fused"};

void select_fused_kind(const std::string& kind) {
  curv::set_fused_operations(kind != "aten");
  curv::set_fused_kernels(kind == "fused");
}

// Times of a gradient, a first HVP and a graph-reused HVP for each of kFusedKinds, measured in one
// process and interleaved (aten, composite, fused, aten, ...), so that the load of a shared
// machine falls on all alike. Returns {kind} x {gradient, hvp_first, hvp_reused} medians in
// seconds, each after the device finished.
std::vector<std::vector<double>> interleaved_fused_times(const std::string& dtype_name, int repeats,
                                                         const std::string& shape,
                                                         const std::string& device_name) {
  Setup setup = make_setup(dtype_name, shape, device_name);
  const c10::Device device(device_name);
  auto& model = setup.model;
  const curv::ProbeSet& probe = setup.probe;
  const curv::ParamVector& v = setup.v;
  constexpr int kinds = 3;
  std::vector<std::unique_ptr<curv::CurvatureEngine>> kept(kinds);
  std::vector<std::vector<std::vector<double>>> times(kinds, std::vector<std::vector<double>>(3));
  for (int r = -1; r < repeats; ++r) {  // r = -1: warm-up, not recorded
    for (int k = 0; k < kinds; ++k) {
      select_fused_kind(kFusedKinds[k]);
      auto record = [&](int op, auto&& f) {
        finish(device);
        auto start = std::chrono::steady_clock::now();
        f();
        finish(device);
        if (r >= 0) times[k][op].push_back(seconds_since(start));
      };
      {
        curv::EngineOptions options;
        options.reuse_graph = false;
        curv::CurvatureEngine engine(*model, probe, options);
        record(0, [&] { engine.gradient(); });
      }
      {
        curv::CurvatureEngine engine(*model, probe);
        record(1, [&] { engine.hvp(v); });
      }
      if (!kept[k]) {
        kept[k] = std::make_unique<curv::CurvatureEngine>(*model, probe);
        kept[k]->hvp(v);
      }
      record(2, [&] { kept[k]->hvp(v); });
    }
  }
  select_fused_kind("fused");
  std::vector<std::vector<double>> medians(kinds, std::vector<double>(3));
  for (int k = 0; k < kinds; ++k) {
    for (int o = 0; o < 3; ++o) medians[k][o] = median(times[k][o]);
  }
  return medians;
}

// The command line: --op runs one measurement in this process; otherwise a table of them, each
// in a child process.
struct Args {
  std::string op, dtype = "float32", shape = "reference", cross_entropy = "fused",
                  fused_ops = "fused", device = "cpu";
  int threads = 2, repeats = 5;
  bool memory_mode = false, compare_cross_entropy = false, compare_fused_ops = false,
       dtype_given = false;
};

// False (after naming it on stderr) for an unknown flag.
bool parse_args(int argc, char** argv, Args& a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--op")
      a.op = value;
    else if (flag == "--dtype")
      a.dtype = value, a.dtype_given = true;
    else if (flag == "--threads")
      a.threads = std::stoi(value);
    else if (flag == "--repeats")
      a.repeats = std::stoi(value);
    else if (flag == "--memory")
      a.memory_mode = value == "1";
    else if (flag == "--shape")
      a.shape = value;
    else if (flag == "--device")
      a.device = value;
    else if (flag == "--cross-entropy")
      a.cross_entropy = value;
    else if (flag == "--compare-cross-entropy")
      a.compare_cross_entropy = value == "1";
    else if (flag == "--fused-ops")
      a.fused_ops = value;
    else if (flag == "--compare-fused-ops")
      a.compare_fused_ops = value == "1";
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return false;
    }
  }
  return true;
}

// One measurement in a child process (this program with --op): the value after `key` in its
// JSON line.
double child(const char* program, const Args& a, const std::string& flags, const char* key) {
  const std::string command =
      fmt::format("'{}' --threads {} --repeats {} --shape {} --device {} {}", program, a.threads,
                  a.repeats, a.shape, a.device, flags);
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[512] = {0};
  const bool ok = pipe && fgets(buffer, sizeof buffer, pipe);
  if (pipe) pclose(pipe);
  const char* at = ok ? std::strstr(buffer, key) : nullptr;
  if (!at) {
    std::fprintf(stderr, "measurement failed: %s\n", command.c_str());
    std::exit(1);
  }
  return std::atof(at + std::strlen(key));
}

void fused_ops_table(const char* program, const Args& a) {
  std::printf("%s; %s; shape %s: %s, medians of %d\n\n", curv::runtime_summary().c_str(),
              a.device.c_str(), a.shape.c_str(), shape_config(a.shape).describe().c_str(),
              a.repeats);
  std::printf(
      "| dtype | fused operations | op | median time (ms) | x its gradient | x ATen's "
      "gradient | peak extra memory (MiB) |\n|---|---|---|---|---|---|---|\n");
  const char* ops[] = {"gradient", "hvp_first", "hvp_reused"};
  for (const std::string d : {"float32", "float64"}) {
    if (a.dtype_given && d != a.dtype) continue;
    const auto t = interleaved_fused_times(d, a.repeats, a.shape, a.device);
    for (int f = 0; f < 3; ++f) {
      for (int o = 0; o < 3; ++o) {
        const std::string flags =
            fmt::format("--op {} --dtype {} --fused-ops {} --memory 1", ops[o], d, kFusedKinds[f]);
        const double mib = child(program, a, flags, "\"peak_extra_mib\": ");
        std::printf("| %s | %s | %s | %.1f | %.2f | %.2f | %.0f |\n", d.c_str(), kFusedKinds[f],
                    ops[o], t[f][o] * 1e3, t[f][o] / t[f][0], t[f][o] / t[0][0], mib);
        std::fflush(stdout);
      }
    }
  }
}

void cross_entropy_table(const char* program, const Args& a) {
  std::printf("%s; shape %s: %s, float32, medians of %d\n\n", curv::runtime_summary().c_str(),
              a.shape.c_str(), shape_config(a.shape).describe().c_str(), a.repeats);
  std::printf(
      "| cross-entropy | op | median time (s) | x ATen's gradient | peak extra memory (MiB) "
      "|\n|---|---|---|---|---|\n");
  double aten_gradient = 0.0;
  for (const char* ce : {"aten", "fused"}) {
    for (const char* o : {"gradient", "hvp_first", "hvp_reused"}) {
      const std::string flags = fmt::format("--op {} --dtype float32 --cross-entropy {}", o, ce);
      const double seconds = child(program, a, flags + " --memory 0", "\"seconds\": ");
      const double mib = child(program, a, flags + " --memory 1", "\"peak_extra_mib\": ");
      if (aten_gradient == 0.0) aten_gradient = seconds;
      std::printf("| %s | %s | %.3f | %.2f | %.0f |\n", ce, o, seconds, seconds / aten_gradient,
                  mib);
      std::fflush(stdout);
    }
  }
}

void operations_table(const char* program, const Args& a) {
  const Shape shape = shape_of(a.shape);
  std::printf("%s; %s; shape %s: %s, batch %lld x %lld tokens\n", curv::runtime_summary().c_str(),
              a.device.c_str(), a.shape.c_str(), shape.config.describe().c_str(),
              static_cast<long long>(shape.sequences),
              static_cast<long long>(shape.config.data().context));
  if (a.device == "cpu") {
    std::printf("matmul 1024^2: %.1f GFLOP/s float32, %.1f GFLOP/s float64\n",
                curv::matmul_gflops(1024, "float32"), curv::matmul_gflops(1024, "float64"));
  }
  std::printf("\n");
  std::printf(
      "| dtype | op | median time (ms) | x gradient | peak extra memory (MiB) | x gradient |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const std::string d : {"float32", "float64"}) {
    if (a.dtype_given && d != a.dtype) continue;
    std::map<std::string, std::pair<double, double>> results;
    for (const char* o :
         {"loss", "gradient", "hvp_first", "hvp_reused", "lanczos_step", "hvp_fd"}) {
      auto run = [&](int memory, const char* key) {
        return child(program, a, fmt::format("--op {} --dtype {} --memory {}", o, d, memory), key);
      };
      results[o] = {run(0, "\"seconds\": "), run(1, "\"peak_extra_mib\": ")};
    }
    const auto grad = results["gradient"];
    for (const char* o :
         {"loss", "gradient", "hvp_first", "hvp_reused", "lanczos_step", "hvp_fd"}) {
      const auto r = results[o];
      std::printf("| %s | %s | %.1f | %.2f | %.1f | %.2f |\n", d.c_str(), o, r.first * 1e3,
                  r.first / grad.first, r.second, grad.second > 0 ? r.second / grad.second : 0.0);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  curv::reexec_for_blas_kernels(argv);  // the kernels the tools run
  Args a;
  if (!parse_args(argc, argv, a)) return 2;
  if (a.memory_mode) {
    // Every block above 128 KiB becomes its own mapping, returned to the system when freed, so
    // the resident set tracks live tensors and its peak (VmHWM) is what an operation holds. The
    // page faults this costs make such runs useless for timing: times come from separate runs.
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  }
  curv::RuntimeOptions runtime{a.threads};
  runtime.tune_allocator = !a.memory_mode;  // the memory runs keep the thresholds set above
  curv::init_runtime(runtime);
  curv::set_fused_cross_entropy(a.cross_entropy == "fused");
  if (a.fused_ops != "aten" && a.fused_ops != "composite" && a.fused_ops != "fused") {
    std::fprintf(stderr, "--fused-ops must be aten, composite or fused, not %s\n",
                 a.fused_ops.c_str());
    return 2;
  }
  select_fused_kind(a.fused_ops);
  if (!a.op.empty()) return measure(a.op, a.dtype, a.repeats, a.memory_mode, a.shape, a.device);
  if (a.compare_fused_ops) {
    fused_ops_table(argv[0], a);
  } else if (a.compare_cross_entropy) {
    cross_entropy_table(argv[0], a);
  } else {
    operations_table(argv[0], a);
  }
  return 0;
}
