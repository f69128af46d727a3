// The CUDA kernels of the fused second derivatives (libcurv/src/models/fused_kernels_cuda.cu)
// against the composite ATen formulas on the same device (set_fused_kernels(false)) and against
// the CPU kernels, operation by operation and through a whole model's HVP (which adds the
// cross-entropy). Hidden from the default run (tag [.cuda]): a GPU machine runs them with
// `curv_tests "[.cuda]"`.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "curv/core/engine.h"
#include "curv/models/fused_ops.h"
#include "curv/models/models.h"
#include "fixtures.h"
#include "test_support.h"

using namespace curv;
using namespace curv_test;

namespace {

using Inputs = std::vector<at::Tensor>;
using Op = std::function<at::Tensor(const Inputs&)>;

at::Tensor random(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype,
                  double scale = 1.0, double shift = 0.0) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed),
                   at::TensorOptions().dtype(dtype)) *
             scale +
         shift;
}

// H v of s(x) = Σ c ⊙ op(x) over every input, on `device`, through a kept create_graph gradient
// and a second backward without a graph (the path the kernels take), flattened onto the CPU.
at::Tensor hvp_on(const Op& op, const Inputs& values, const std::string& device) {
  Inputs x, v;
  for (size_t i = 0; i < values.size(); ++i) {
    x.push_back(values[i].to(device).requires_grad_(true));
    v.push_back(random(values[i].sizes().vec(), 50 + i, values[i].scalar_type()).to(device));
  }
  const at::Tensor out = op(x);
  const at::Tensor c = random(out.sizes().vec(), 7, out.scalar_type()).to(device);
  const auto g = torch::autograd::grad({(out * c).sum()}, x, {}, true, true);
  Inputs g_varying, v_varying;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].requires_grad()) {
      g_varying.push_back(g[i]);
      v_varying.push_back(v[i]);
    }
  }
  const auto hv = torch::autograd::grad(g_varying, x, v_varying, false, false, true);
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < hv.size(); ++i) {
    parts.push_back(hv[i].defined() ? hv[i].reshape(-1).cpu()
                                    : at::zeros({values[i].numel()}, values[i].options()));
  }
  return at::cat(parts);
}

double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

// The composite formulas for one scope, the kernels again after it, exceptions included.
struct CompositeFormulas {
  CompositeFormulas() { set_fused_kernels(false); }
  ~CompositeFormulas() { set_fused_kernels(true); }
  CompositeFormulas(const CompositeFormulas&) = delete;
  CompositeFormulas& operator=(const CompositeFormulas&) = delete;
};

// These tests compare the kernels with the formulas: without the kernels they would compare the
// formulas with themselves.
void require_kernels() {
  if (!at::hasCUDA()) FAIL("no CUDA device: these tests run on a GPU machine");
  if (!fused_kernels_run_on(c10::Device("cuda:0"))) {
    FAIL(
        "libcurv's CUDA kernels do not run on cuda:0 (built without nvcc or "
        "CURV_CUDA_KERNELS, or without this GPU's architecture in CURV_CUDA_ARCHITECTURES)");
  }
}

}  // namespace

TEST_CASE("the fused CUDA kernels equal the composite formulas and the CPU kernels", "[.cuda]") {
  require_kernels();
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-12 : 2e-5;
    // Shapes that take every path of the kernels: rows longer than a block's threads (several
    // sweeps per row), more rows than the LayerNorm kernel's 2048 blocks (several rows each),
    // causal rows of 1 to 300 entries.
    const at::Tensor scores = random({2, 3, 300, 300}, 1, dtype, 3.0);
    const at::Tensor wide = random({4, 1030}, 2, dtype, 1.5, 0.3);
    const at::Tensor tall = random({2100, 48}, 3, dtype, 1.5, 0.3);
    const at::Tensor w_wide = random({1030}, 4, dtype, 1.0, 1.0), b_wide = random({1030}, 5, dtype);
    const at::Tensor w_tall = random({48}, 6, dtype, 1.0, 1.0), b_tall = random({48}, 7, dtype);
    const std::vector<std::pair<std::string, std::pair<Op, Inputs>>> ops = {
        {"causal_softmax",
         {[](const Inputs& in) { return causal_softmax(in[0], 0.35); }, {scores}}},
        {"gelu", {[](const Inputs& in) { return fused_gelu(in[0], false); }, {tall}}},
        {"gelu tanh", {[](const Inputs& in) { return fused_gelu(in[0], true); }, {wide}}},
        {"layer_norm wide",
         {[](const Inputs& in) { return fused_layer_norm(in[0], in[1], in[2], 1e-5); },
          {wide, w_wide, b_wide}}},
        {"layer_norm tall without a bias",
         {[](const Inputs& in) { return fused_layer_norm(in[0], in[1], at::Tensor(), 1e-5); },
          {tall, w_tall}}},
        {"layer_norm of the input alone",
         {[&](const Inputs& in) {
            return fused_layer_norm(in[0], w_tall.to(in[0].device()), b_tall.to(in[0].device()),
                                    1e-5);
          },
          {tall}}},
        {"rms_norm wide",
         {[](const Inputs& in) { return fused_rms_norm(in[0], in[1], 1e-6); }, {wide, w_wide}}},
        {"rms_norm tall without a gain",
         {[](const Inputs& in) { return fused_rms_norm(in[0], at::Tensor(), 1e-6); }, {tall}}},
        {"gated_silu",
         {[](const Inputs& in) { return fused_gated_silu(in[0], in[1]); }, {tall, tall * 0.5}}},
        {"rotary on strided heads",
         {[&](const Inputs& in) {
            const at::Tensor table = random({1030, 2}, 9, dtype).to(in[0].device());
            return fused_rotary(in[0].view({2, 1030, 1, 2}).transpose(1, 2), table, table.flip(1))
                .pow(3);
          },
          {wide.reshape({2, 2060})}}},
    };
    for (const auto& [name, op] : ops) {
      INFO(name << " in " << c10::toString(dtype));
      const at::Tensor kernel = hvp_on(op.first, op.second, "cuda:0");
      at::Tensor composite;
      {
        const CompositeFormulas formulas;
        composite = hvp_on(op.first, op.second, "cuda:0");
      }
      const at::Tensor cpu = hvp_on(op.first, op.second, "cpu");
      CHECK(kernel.abs().max().item<double>() > 0.0);
      CHECK(relative_difference(kernel, composite) < tolerance);
      CHECK(relative_difference(kernel, cpu) < tolerance);
    }
    // The softmax kernel's own outputs, ∂/∂P and ∂/∂dP of its backward dS = s·P⊙(dP − r), are
    // exact zeros above the diagonal (the composite formula's ∂/∂P is not: P = 0 there makes
    // those entries count for nothing upstream).
    const at::Tensor s = scores.to("cuda:0").requires_grad_(true);
    const at::Tensor p = causal_softmax(s, 0.35);
    const at::Tensor dp = random(p.sizes().vec(), 8, dtype).to("cuda:0").requires_grad_(true);
    const at::Tensor ds = torch::autograd::grad({p}, {s}, {dp}, true, true)[0];
    const auto second = torch::autograd::grad({ds}, {p, dp}, {at::ones_like(ds)});
    for (const at::Tensor& d : second) {
      CHECK(d.tril().abs().max().item<double>() > 0.0);
      CHECK(d.triu(1).abs().max().item<double>() == 0.0);
    }
  }
}

namespace {

// A model's HVP on cuda:0 (probe tokens below `vocab`, sequences of 16) with the kernels against
// the composite formulas, in float64 and float32.
void check_model_hvp(const ModelConfig& config, int64_t vocab) {
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    INFO(config.describe() << " in " << c10::toString(dtype));
    auto model = make_model(config, ModelInit{4, dtype, "cuda:0"});
    const ProbeSet probe = gpt_probe(2, 8, 4, vocab, 16);
    ParamVector v = random_direction(*model, 5);
    const ParamVector params = model->parameters();
    for (size_t i = 0; i < v.size(); ++i) v[i] = v[i].to(params[i].options());
    CurvatureEngine engine(*model, probe);
    const ParamVector with_kernels = engine.hvp(v);
    ParamVector composite;
    {
      const CompositeFormulas formulas;
      CurvatureEngine composite_engine(*model, probe);
      composite = composite_engine.hvp(v);
    }
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < v.size(); ++i) {
      diff += (with_kernels[i] - composite[i]).to(at::kDouble).pow(2).sum().item<double>();
      ref += composite[i].to(at::kDouble).pow(2).sum().item<double>();
    }
    CHECK(ref > 0.0);
    CHECK(std::sqrt(diff / ref) < (dtype == at::kDouble ? 1e-12 : 1e-5));
  }
}

}  // namespace

TEST_CASE("a LLaMA's HVP on CUDA is the same with the fused kernels as without", "[.cuda]") {
  require_kernels();
  // RMSNorm, SwiGLU, the rotary product, the softmax and the cross-entropy at once, with Qwen3's
  // per-head q/k norms.
  LlamaConfig c;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  c.qk_norm = true;
  check_model_hvp(ModelConfig("llama", c), c.vocab_size);
}

TEST_CASE("a model's HVP on CUDA is the same with the fused kernels as without", "[.cuda]") {
  require_kernels();
  // Every fused operation at once, the cross-entropy's kernel included: the built-in GPT with
  // biases and a tied head (exact and tanh GELU), a vocabulary wider than a block's threads.
  for (const bool tanh : {false, true}) {
    GptConfig c;
    c.vocab_size = 300;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.activation = tanh ? "gelu_tanh" : "gelu";
    check_model_hvp(ModelConfig("gpt", c), c.vocab_size);
  }
}
