// The engine and ndsprobe on a CUDA device against the CPU, the device memory budget from the
// CUDA allocator's statistics, and a real CUDA out-of-memory error. Hidden from the default run
// (tag [.cuda]): a machine with a GPU and a CUDA LibTorch runs them with `curv_tests "[.cuda]"`
// (bench/gpu_check.sh).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "curv/analysis/spectrum.h"
#include "curv/core/engine.h"
#include "curv/core/error.h"
#include "curv/core/linear_operator.h"
#include "curv/core/precision.h"
#include "curv/core/runtime.h"
#include "curv/io/checkpoint.h"
#include "curv/io/h5_file.h"
#include "curv/io/safetensors.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

const char* kDevice = "cuda:0";

void require_cuda() {
  if (!at::hasCUDA()) FAIL("no CUDA device: these tests run on a GPU machine");
}

ParamVector on(const ParamVector& x, const c10::Device& device) {
  ParamVector out;
  for (const auto& t : x) out.push_back(t.to(device));
  return out;
}

double error_against_cpu(const ParamVector& got, const ParamVector& want) {
  const ParamVector g = on(got, c10::Device(c10::kCPU));
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff += (g[i].to(at::kDouble) - want[i].to(at::kDouble)).pow(2).sum().item<double>();
    ref += want[i].to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(diff / ref);
}

ModelConfig small_llama() {
  LlamaConfig c;
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  c.qk_norm = true;
  return ModelConfig("llama", c);
}

}  // namespace

TEST_CASE("the engine on CUDA equals the CPU in float64", "[.cuda]") {
  require_cuda();
  for (const ModelConfig& config : {tiny_gpt_config(), small_llama()}) {
    INFO(config.describe());
    auto cpu = make_model(config, ModelInit{4, at::kDouble, "cpu"});
    auto gpu = make_model(config, ModelInit{4, at::kDouble, kDevice});
    const int64_t vocab = config.arch() == "gpt" ? 5 : 23;
    const ProbeSet probe = gpt_probe(2, 12, 4, vocab, 4);
    const ParamVector v = random_direction(*cpu, 5);
    CurvatureEngine on_cpu(*cpu, probe);
    CurvatureEngine on_gpu(*gpu, probe);
    CHECK(on_gpu.device().is_cuda());
    CHECK(std::abs(on_gpu.loss() - on_cpu.loss()) <= 1e-13 * std::abs(on_cpu.loss()));
    CHECK(error_against_cpu(on_gpu.gradient(), on_cpu.gradient()) <= 1e-12);
    CHECK(error_against_cpu(on_gpu.hvp(on(v, on_gpu.device())), on_cpu.hvp(v)) <= 1e-12);
  }
}

TEST_CASE("eigenpairs, traces and densities on CUDA vectors equal the CPU's in float64",
          "[.cuda]") {
  require_cuda();
  const ModelConfig config = tiny_gpt_config();
  auto cpu = make_model(config, ModelInit{4, at::kDouble, "cpu"});
  auto gpu = make_model(config, ModelInit{4, at::kDouble, kDevice});
  const ProbeSet probe = gpt_probe(2, 12, 4, 5, 4);
  CurvatureEngine on_cpu(*cpu, probe);
  CurvatureEngine on_gpu(*gpu, probe);
  HessianOperator h_cpu(on_cpu), h_gpu(on_gpu);
  REQUIRE(h_gpu.device().is_cuda());
  EigenOptions eig;
  eig.top = 2;
  eig.bottom = 1;
  eig.tol = 1e-8;
  const EigenResult want = extreme_eigenpairs(h_cpu, eig);
  for (KrylovBasis basis : {KrylovBasis::kDevice, KrylovBasis::kHost}) {
    INFO("basis " << to_string(basis));
    eig.basis = basis;
    const EigenResult got = extreme_eigenpairs(h_gpu, eig);
    REQUIRE(got.largest.size() == 2);
    CHECK(got.hvps == want.hvps);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(std::abs(got.largest[i].value - want.largest[i].value) <=
            1e-10 * std::abs(want.largest[0].value));
      CHECK(got.largest[i].vector.device().is_cuda());
    }
    CHECK(std::abs(got.smallest[0].value - want.smallest[0].value) <=
          1e-10 * std::abs(want.largest[0].value));
  }
  TraceOptions trace;
  trace.matvecs = 12;
  for (TraceMethod method : {TraceMethod::kHutchinson, TraceMethod::kHutchPlusPlus}) {
    trace.method = method;
    const TraceResult a = estimate_trace(h_cpu, trace);
    // Hutch++'s sketch and basis on the device, then spilled to pinned host memory.
    for (KrylovBasis basis : {KrylovBasis::kDevice, KrylovBasis::kHost}) {
      INFO("trace " << to_string(method) << ", basis " << to_string(basis));
      trace.basis = basis;
      const TraceResult b = estimate_trace(h_gpu, trace);
      CHECK(std::abs(a.estimate - b.estimate) <= 1e-10 * std::abs(a.estimate));
      CHECK(b.standard_error == Approx(a.standard_error).epsilon(1e-6));
    }
  }
  DensityOptions density;
  density.runs = 2;
  density.steps = 8;
  const DensityResult a = spectral_density(h_cpu, density);
  for (KrylovBasis basis : {KrylovBasis::kDevice, KrylovBasis::kHost}) {
    INFO("density, basis " << to_string(basis));
    density.basis = basis;
    const DensityResult b = spectral_density(h_gpu, density);
    CHECK(std::abs(a.trace - b.trace) <= 1e-10 * std::abs(a.trace));
  }
}

TEST_CASE("TF32 matrix products on CUDA: a measured, small error against full float32", "[.cuda]") {
  require_cuda();
  auto gpu = make_model(tiny_gpt_config(), ModelInit{4, at::kFloat, kDevice});
  CurvatureEngine engine(*gpu, gpt_probe(2, 12, 4, 5, 4));
  const PrecisionError e = matmul_precision_error(engine, MatmulPrecision::kHigh);
  INFO("loss " << e.loss << " gradient " << e.gradient << " hvp " << e.hvp << " curvature "
               << e.curvature);
  CHECK(e.loss < 1e-2);
  CHECK(e.gradient < 5e-2);
  CHECK(e.hvp < 5e-2);
  CHECK(matmul_precision() == MatmulPrecision::kHighest);
}

TEST_CASE("the memory budget on CUDA reads the allocator's statistics", "[.cuda]") {
  require_cuda();
  auto model = make_model(tiny_gpt_config(), ModelInit{6, at::kDouble, kDevice});
  const ProbeSet probe = gpt_probe(3, 6, 4);
  const c10::Device device(kDevice);
  const ParamVector v = on(random_direction(*model, 41), device);
  CurvatureEngine unbounded(*model, probe);
  reset_peak_memory(device);
  const ParamVector expected = unbounded.hvp(v);
  const DeviceMemory m = device_memory(device);
  CHECK(m.in_use > 0);
  CHECK(m.peak >= m.in_use);
  CHECK(m.reserved >= m.in_use);
  CHECK(unbounded.kept_graphs() == probe.size());

  EngineOptions tight;
  tight.max_memory = 1;  // below anything on the device: no graph is kept
  CurvatureEngine engine(*model, probe, tight);
  CHECK(error_against_cpu(engine.hvp(v), on(expected, c10::Device(c10::kCPU))) <= 1e-12);
  CHECK(engine.kept_graphs() == 0);
  CHECK(engine.counters().graphs_over_budget == 1);
}

TEST_CASE("host copies on CUDA: the same numbers, one parameter copy less at the peak", "[.cuda]") {
  require_cuda();
  // Wide enough that the parameters (3.2M float32, 13 MB) dwarf a tiny probe's activations.
  const ModelConfig config = ModelConfig::from_json(
      R"({"arch": "gpt", "vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 4,
          "n_embd": 512, "bias": true, "tied": false})");
  auto model = make_model(config, ModelInit{7, at::kFloat, kDevice});
  const ProbeSet probe = gpt_probe(8, 4, 2, 64, 8);
  const c10::Device device(kDevice);
  const ParamVector u = on(scaled(random_direction(*model, 9), 1e-3), device);
  int64_t bytes = 0;
  for (const auto& t : model->parameters()) bytes += t.numel() * 4;
  struct Seen {
    double loss = 0;
    ParamVector fd;
    int64_t loss_peak = 0;
  };
  auto measure = [&](bool host_copies) {
    EngineOptions options;
    options.host_copies = host_copies;
    options.reuse_graph = false;
    CurvatureEngine engine(*model, probe, options);
    engine.loss();
    Seen seen;
    reset_peak_memory(device);
    const int64_t before = device_memory(device).in_use;
    seen.loss = engine.loss_at(u);
    seen.loss_peak = device_memory(device).peak - before;
    seen.fd = engine.hvp_finite_difference(u);
    return seen;
  };
  const Seen device_copy = measure(false), host_copy = measure(true);
  CHECK(host_copy.loss == device_copy.loss);
  CHECK(error_against_cpu(host_copy.fd, on(device_copy.fd, c10::Device(c10::kCPU))) == 0.0);
  INFO("peak over in-use during L(θ + u): " << device_copy.loss_peak
                                            << " B with the copy on the "
                                               "device, "
                                            << host_copy.loss_peak << " B on the host; parameters "
                                            << bytes << " B");
  CHECK(device_copy.loss_peak - host_copy.loss_peak >= bytes * 9 / 10);
}

TEST_CASE("layer-wise recomputation on CUDA: the CPU's numbers, a fraction of the peak",
          "[.cuda]") {
  require_cuda();
  const c10::Device device(kDevice);
  auto cpu = make_model(small_llama(), ModelInit{4, at::kDouble, "cpu"});
  auto gpu = make_model(small_llama(), ModelInit{4, at::kDouble, kDevice});
  const ProbeSet probe = gpt_probe(2, 12, 4, 23, 8);
  const ParamVector v = random_direction(*cpu, 5);
  EngineOptions layered;
  layered.recompute_layers = true;
  CurvatureEngine on_cpu(*cpu, probe), on_gpu(*gpu, probe, layered);
  CHECK(error_against_cpu(on_gpu.gradient(), on_cpu.gradient()) <= 1e-12);
  CHECK(error_against_cpu(on_gpu.hvp(on(v, device)), on_cpu.hvp(v)) <= 1e-12);
  // Eight layers whose activations dwarf the parameters: one HVP's peak over what is in use.
  const ModelConfig deep = ModelConfig::from_json(
      R"({"arch": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 256,
          "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
          "max_position_embeddings": 128})");
  auto model = make_model(deep, ModelInit{7, at::kFloat, kDevice});
  const ProbeSet batch = gpt_probe(3, 16, 16, 64, 128);
  const ParamVector u = on(random_direction(*model, 9), device);
  auto peak = [&](bool by_layer) {
    EngineOptions options;
    options.reuse_graph = false;
    options.recompute_layers = by_layer;
    CurvatureEngine engine(*model, batch, options);
    engine.loss();
    reset_peak_memory(device);
    const int64_t before = device_memory(device).in_use;
    engine.hvp(u);
    return device_memory(device).peak - before;
  };
  const int64_t whole = peak(false), by_layer = peak(true);
  INFO("HVP peak over in-use: " << whole << " B whole, " << by_layer << " B layer by layer");
  CHECK(by_layer * 3 <= whole);
}

TEST_CASE("a layer-wise product added into the solver's vector holds no product of its own",
          "[.cuda]") {
  require_cuda();
  const c10::Device device(kDevice);
  // Parameters that dwarf the activations: a wide vocabulary, a short context.
  const ModelConfig wide = ModelConfig::from_json(
      R"({"arch": "llama", "vocab_size": 16384, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "max_position_embeddings": 8})");
  auto model = make_model(wide, ModelInit{3, at::kFloat, kDevice});
  EngineOptions options;
  options.recompute_layers = true;
  CurvatureEngine engine(*model, gpt_probe(2, 4, 4, 16384, 8), options);
  HessianOperator h(engine, {}, at::kFloat);
  const at::Tensor x = at::randn({h.rows()}, vector_options(h));
  const int64_t vector = h.rows() * 4;
  auto peak_over = [&](const std::function<void()>& call) {
    reset_peak_memory(device);
    const int64_t before = device_memory(device).in_use;
    call();
    return device_memory(device).peak - before;
  };
  ParamVector v(engine.space().size());
  int64_t offset = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = x.narrow(0, offset, engine.space()[i].numel).view(engine.space()[i].shape);
    offset += engine.space()[i].numel;
  }
  at::Tensor y = at::zeros_like(x);
  ParamVector returned;
  const int64_t added = peak_over([&] { h.apply_add(x, y); });
  const int64_t whole = peak_over([&] { returned = engine.hvp(v); });
  INFO("peak over in-use: " << added << " B added into y, " << whole << " B returned; a vector is "
                            << vector << " B");
  CHECK(added + vector <= whole);
  // The same product.
  double diff = 0, norm = 0;
  offset = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const at::Tensor part = y.narrow(0, offset, engine.space()[i].numel).view_as(returned[i]);
    diff += (part - returned[i]).to(at::kDouble).square().sum().item<double>();
    norm += returned[i].to(at::kDouble).square().sum().item<double>();
    offset += engine.space()[i].numel;
  }
  CHECK(std::sqrt(diff) <= 1e-5 * std::sqrt(norm));
}

namespace {

// A loss that asks the device for 32 TiB on its second call.
class Greedy : public Objective {
 public:
  explicit Greedy(Objective& model) : model_(model) {}
  const ParamSpace& space() const override { return model_.space(); }
  ParamVector parameters() override { return model_.parameters(); }
  std::string describe() const override { return model_.describe(); }
  at::Tensor loss(const Batch& batch) override {
    if (calls_++ > 0) {
      const auto huge =
          at::empty({int64_t{1} << 43}, at::TensorOptions(at::kFloat).device(kDevice));
      return model_.loss(batch) + huge.sum();
    }
    return model_.loss(batch);
  }

 private:
  Objective& model_;
  int calls_ = 0;
};

}  // namespace

TEST_CASE("a CUDA out-of-memory error is one OutOfMemory naming the device and memory", "[.cuda]") {
  require_cuda();
  auto model = make_model(tiny_gpt_config(), ModelInit{6, at::kDouble, kDevice});
  Greedy greedy(*model);
  CurvatureEngine engine(greedy, gpt_probe(3, 4, 4));
  CHECK(std::isfinite(engine.loss()));
  try {
    engine.loss_at(on(random_direction(*model, 3), c10::Device(kDevice)));
    FAIL("no error");
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("ran out of cuda:0 memory in the loss at θ + u"));
    CHECK_THAT(what, Catch::Contains("reserved"));
    CHECK_THAT(what, Catch::Contains("EngineOptions.micro_batch"));
  }
}

TEST_CASE("ndsprobe --device cuda equals --device cpu in float64", "[.cuda]") {
  require_cuda();
  TempDir dir;
  const auto config = tiny_gpt_config();
  auto model = make_model(config, ModelInit{1, at::kDouble});
  const ProbeSet probe = gpt_probe(7, 12, 4);
  const std::string data = dir.file("probe.safetensors");
  write_safetensors(data, {{"inputs", probe[0].inputs}, {"targets", probe[0].targets}});
  const std::string run = dir.file("run");
  for (int step = 0; step <= 20; step += 10) {
    save_checkpoint(run, step, model->space(), snapshot_parameters(*model), {},
                    R"({"model": )" + config.to_json() + "}");
    CurvatureEngine engine(*model, probe);
    ParamVector next = engine.parameters();
    axpy(-0.5, engine.gradient(), next);
    load_parameters(*model, next);
  }
  auto audit = [&](const std::string& device) {
    const std::string out = dir.file(device + ".h5");
    run_tool("ndsprobe", fmt::format("{} --data {} --dtype float64 --directions delta,gradient "
                                     "--device {} -o {}",
                                     run, data, device, out));
    return out;
  };
  const std::string cpu = audit("cpu"), gpu = audit("cuda");
  const Table a = H5Reader(cpu).table("/taylor"), b = H5Reader(gpu).table("/taylor");
  REQUIRE(a.num_rows() == b.num_rows());
  for (const std::string column : {"loss", "first_order", "curvature", "nds", "realized"}) {
    for (size_t i = 0; i < a.num_rows(); ++i) {
      INFO(column << " row " << i);
      const double x = a.doubles(column)[i], y = b.doubles(column)[i];
      if (std::isnan(x)) {
        CHECK(std::isnan(y));
      } else {
        CHECK(std::abs(x - y) <= 1e-10 * std::abs(x) + 1e-300);
      }
    }
  }
  CHECK(H5Reader(gpu).attribute_int("/runs/run/step_0/delta", "peak_memory") > 0);
}
