#include "curv/models/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

using namespace curv;

namespace {

using Inputs = std::vector<at::Tensor>;
using Op = std::function<at::Tensor(const Inputs&)>;

// Derivatives of s(x) = Σ c ⊙ op(x) over every input: the value, the gradient, H v without and
// with a graph, and the third-derivative contraction ∇(H v · w).
struct Derivatives {
  at::Tensor value, gradient, hvp, hvp_with_graph, third;
};

at::Tensor flat(const Inputs& ts, const Inputs& like) {
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < ts.size(); ++i) {
    parts.push_back(ts[i].defined() ? ts[i].reshape(-1)
                                    : at::zeros({like[i].numel()}, like[i].options()));
  }
  return at::cat(parts);
}

Derivatives derivatives(const Op& op, const Inputs& values, uint64_t seed) {
  Inputs x;
  for (const auto& v : values) x.push_back(v.detach().clone().requires_grad_(true));
  auto gen = [&](uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); };
  const at::Tensor out = op(x);
  const at::Tensor c = at::randn(out.sizes(), gen(seed), out.options());
  Inputs v, w;
  for (size_t i = 0; i < x.size(); ++i) {
    v.push_back(at::randn(x[i].sizes(), gen(seed + 1 + i), x[i].options()));
    w.push_back(at::randn(x[i].sizes(), gen(seed + 101 + i), x[i].options()));
  }
  const at::Tensor s = (out * c).sum();
  const auto g = torch::autograd::grad({s}, x, {}, true, true);
  // Gradients that do not depend on the inputs (a bias's) drop out of the second backward.
  Inputs g_varying, v_varying;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].requires_grad()) {
      g_varying.push_back(g[i]);
      v_varying.push_back(v[i]);
    }
  }
  const auto hv_plain = torch::autograd::grad(g_varying, x, v_varying, true, false, true);
  const auto hv = torch::autograd::grad(g_varying, x, v_varying, true, true, true);
  const at::Tensor hvw = flat(hv, x).dot(flat(w, x));
  const auto t = torch::autograd::grad({hvw}, x, {}, true, false, true);
  return {out.detach(), flat(g, x).detach(), flat(hv_plain, x), flat(hv, x).detach(), flat(t, x)};
}

double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

// The fused operation (kernels, then composite formulas) against ATen's. Third derivatives are
// checked against `elementary`, the operation written in elementary differentiable operations,
// when given (ATen's own third derivative of layer_norm is not exact), else against ATen's.
void check_against_aten(const Op& op, const Inputs& values, double tolerance,
                        const Op& elementary = nullptr) {
  const Derivatives kernels = derivatives(op, values, 3);
  set_fused_kernels(false);
  const Derivatives composite = derivatives(op, values, 3);
  set_fused_kernels(true);
  set_fused_operations(false);
  const Derivatives aten = derivatives(op, values, 3);
  set_fused_operations(true);
  CHECK(at::equal(kernels.value, aten.value));
  CHECK(at::equal(kernels.gradient, aten.gradient));
  CHECK(relative_difference(kernels.hvp, aten.hvp) < tolerance);
  CHECK(relative_difference(composite.hvp, aten.hvp) < tolerance);
  CHECK(relative_difference(kernels.hvp_with_graph, aten.hvp) < tolerance);
  const Derivatives reference = elementary ? derivatives(elementary, values, 3) : aten;
  CHECK(relative_difference(reference.hvp, aten.hvp) < tolerance);
  CHECK(relative_difference(kernels.third, reference.third) < 10 * tolerance);
  CHECK(relative_difference(composite.third, reference.third) < 10 * tolerance);
  CHECK(aten.hvp.abs().max().item<double>() > 0.0);
  CHECK(reference.third.abs().max().item<double>() > 0.0);
}

// (x − mean(x)) / sqrt(var(x) + eps) ⊙ w + b in elementary operations: exact to every order.
at::Tensor elementary_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                 double eps) {
  const at::Tensor centred = x - x.mean(-1, true);
  const at::Tensor y = centred / at::sqrt(centred.pow(2).mean(-1, true) + eps) * w;
  return b.defined() ? y + b : y;
}

at::Tensor random(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype = at::kDouble,
                  double scale = 1.0) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed),
                   at::TensorOptions().dtype(dtype)) *
         scale;
}

}  // namespace

TEST_CASE("causal_softmax equals ATen's masked softmax in value and three derivatives",
          "[fused_ops]") {
  // Rows of 1 to 9 unmasked entries, a scale as attention uses.
  check_against_aten([](const Inputs& x) { return causal_softmax(x[0], 0.35); },
                     {random({2, 3, 9, 9}, 1, at::kDouble, 2.0)}, 1e-13);
  // The masked entries are exact zeros in the value and in every derivative.
  const at::Tensor s = random({1, 1, 5, 5}, 2).requires_grad_(true);
  const at::Tensor p = causal_softmax(s, 1.0);
  CHECK(p.triu(1).abs().max().item<double>() == 0.0);
  const auto g = torch::autograd::grad({(p * random({1, 1, 5, 5}, 3)).sum()}, {s}, {}, true, true);
  const auto hv = torch::autograd::grad(g, {s}, {random({1, 1, 5, 5}, 4)});
  CHECK(hv[0].triu(1).abs().max().item<double>() == 0.0);
  CHECK_THROWS(causal_softmax(random({2, 3, 4}, 5), 1.0));
}

TEST_CASE("fused_layer_norm equals ATen's layer_norm in value and three derivatives",
          "[fused_ops]") {
  const at::Tensor x = random({3, 4, 7}, 1, at::kDouble, 1.5) + 0.3;
  const at::Tensor w = random({7}, 2) + 1.0, b = random({7}, 3);
  SECTION("with a bias") {
    check_against_aten(
        [](const Inputs& in) { return fused_layer_norm(in[0], in[1], in[2], 1e-5); }, {x, w, b},
        1e-13, [](const Inputs& in) { return elementary_layer_norm(in[0], in[1], in[2], 1e-5); });
  }
  SECTION("without a bias") {
    check_against_aten(
        [](const Inputs& in) { return fused_layer_norm(in[0], in[1], at::Tensor(), 1e-5); }, {x, w},
        1e-13,
        [](const Inputs& in) { return elementary_layer_norm(in[0], in[1], at::Tensor(), 1e-5); });
  }
  SECTION("the input alone differentiable, as after an embedding") {
    check_against_aten([&](const Inputs& in) { return fused_layer_norm(in[0], w, b, 1e-5); }, {x},
                       1e-13,
                       [&](const Inputs& in) { return elementary_layer_norm(in[0], w, b, 1e-5); });
  }
  SECTION("ATen's third derivative of layer_norm holds its mean and variance fixed") {
    // Why the elementary form is the reference above: ATen's differs from it.
    const Op aten = [](const Inputs& in) { return at::layer_norm(in[0], {7}, in[1], in[2], 1e-5); };
    const Derivatives from_aten = derivatives(aten, {x, w, b}, 3);
    const Derivatives exact = derivatives(
        [](const Inputs& in) { return elementary_layer_norm(in[0], in[1], in[2], 1e-5); },
        {x, w, b}, 3);
    CHECK(relative_difference(from_aten.hvp, exact.hvp) < 1e-13);
    CHECK(relative_difference(from_aten.third, exact.third) > 1e-3);
  }
}

TEST_CASE("fused_gelu equals ATen's gelu in value and three derivatives", "[fused_ops]") {
  const at::Tensor x = random({5, 11}, 1, at::kDouble, 2.0);
  check_against_aten([](const Inputs& in) { return fused_gelu(in[0], false); }, {x}, 1e-13);
  check_against_aten([](const Inputs& in) { return fused_gelu(in[0], true); }, {x}, 1e-13);
}

TEST_CASE("fused_rms_norm equals the composite RMSNorm in value and three derivatives",
          "[fused_ops]") {
  const at::Tensor x = random({3, 4, 7}, 1, at::kDouble, 1.5) + 0.3;
  const at::Tensor w = random({7}, 2) + 1.0;
  SECTION("with a gain") {
    check_against_aten([](const Inputs& in) { return fused_rms_norm(in[0], in[1], 1e-6); }, {x, w},
                       1e-13);
  }
  SECTION("without a gain, as modded's q/k norms") {
    check_against_aten([](const Inputs& in) { return fused_rms_norm(in[0], at::Tensor(), 1e-6); },
                       {x}, 1e-13);
  }
  SECTION("Gemma's 1 + w gain, over heads of a projection") {
    check_against_aten(
        [](const Inputs& in) {
          return fused_rms_norm(in[0].view({3, 2, 2, 7}), in[1] + 1.0, 1e-6);
        },
        {random({3, 4, 7}, 4).reshape({3, 2, 14}), w}, 1e-13);
  }
  SECTION("the input alone differentiable") {
    check_against_aten([&](const Inputs& in) { return fused_rms_norm(in[0], w, 1e-6); }, {x},
                       1e-13);
  }
}

TEST_CASE("fused_gated_silu equals silu(gate) * up in value and three derivatives", "[fused_ops]") {
  const at::Tensor gate = random({5, 11}, 1, at::kDouble, 2.5), up = random({5, 11}, 2);
  check_against_aten([](const Inputs& in) { return fused_gated_silu(in[0], in[1]); }, {gate, up},
                     1e-13);
  check_against_aten([&](const Inputs& in) { return fused_gated_silu(in[0], up); }, {gate}, 1e-13);
  CHECK_THROWS(fused_gated_silu(gate, up.narrow(1, 0, 5)));
}

TEST_CASE("fused_rotary equals x cos + rotate_half(x) sin in value and three derivatives",
          "[fused_ops]") {
  // Heads read from a [B, T, H, D] projection as [B, H, T, D] (not contiguous), cubed so that the
  // second and third derivatives pass through the product's backward and its backward's backward.
  const at::Tensor x = random({2, 5, 3, 8}, 1, at::kDouble, 1.5);
  const at::Tensor angles = at::outer(at::arange(5, at::kDouble), random({4}, 2));
  const at::Tensor table_cos = at::cat({angles, angles}, -1).cos();
  const at::Tensor table_sin = at::cat({angles, angles}, -1).sin();
  // Tables whose halves differ, so that the transpose's partner indices are checked.
  const at::Tensor any_cos = random({5, 8}, 3), any_sin = random({5, 8}, 4);
  for (const auto& [cos, sin] : {std::pair{table_cos, table_sin}, std::pair{any_cos, any_sin}}) {
    check_against_aten(
        [&](const Inputs& in) { return fused_rotary(in[0].transpose(1, 2), cos, sin).pow(3); }, {x},
        1e-13);
    const at::Tensor heads = x.transpose(1, 2);
    CHECK(at::equal(
        fused_rotary(heads, cos, sin),
        heads * cos + at::cat({-heads.narrow(-1, 4, 4), heads.narrow(-1, 0, 4)}, -1) * sin));
  }
  // Other shapes take the composite formula.
  const at::Tensor flat = random({5, 8}, 5);
  check_against_aten([&](const Inputs& in) { return fused_rotary(in[0], any_cos, any_sin).pow(3); },
                     {flat}, 1e-13);
}

TEST_CASE("the fused kernels agree with ATen in float32 and do not depend on the thread count",
          "[fused_ops]") {
  const at::Tensor x = random({8, 16, 32}, 1, at::kFloat);
  const at::Tensor w = random({32}, 2, at::kFloat) + 1.0, b = random({32}, 3, at::kFloat);
  const at::Tensor scores = random({4, 2, 16, 16}, 4, at::kFloat, 3.0);
  const at::Tensor table = random({16, 16}, 5, at::kFloat);
  const std::vector<std::pair<std::string, std::pair<Op, Inputs>>> ops = {
      {"layer_norm",
       {[](const Inputs& in) { return fused_layer_norm(in[0], in[1], in[2], 1e-5); }, {x, w, b}}},
      {"gelu", {[](const Inputs& in) { return fused_gelu(in[0], false); }, {x}}},
      {"gelu tanh", {[](const Inputs& in) { return fused_gelu(in[0], true); }, {x}}},
      {"causal_softmax", {[](const Inputs& in) { return causal_softmax(in[0], 0.25); }, {scores}}},
      {"rms_norm", {[](const Inputs& in) { return fused_rms_norm(in[0], in[1], 1e-6); }, {x, w}}},
      {"gated_silu",
       {[](const Inputs& in) { return fused_gated_silu(in[0], in[1]); }, {x, x * 0.5}}},
      {"rotary",
       {[&](const Inputs& in) {
          return fused_rotary(in[0].view({8, 16, 2, 16}).transpose(1, 2), table, table.flip(0))
              .pow(3);
        },
        {x}}},
  };
  const int threads = at::get_num_threads();
  for (const auto& [name, op] : ops) {
    INFO(name);
    const Derivatives fused = derivatives(op.first, op.second, 9);
    set_fused_operations(false);
    const Derivatives aten = derivatives(op.first, op.second, 9);
    set_fused_operations(true);
    CHECK(relative_difference(fused.gradient, aten.gradient) < 1e-6);
    CHECK(relative_difference(fused.hvp, aten.hvp) < 1e-5);
    at::set_num_threads(1);
    const Derivatives one_thread = derivatives(op.first, op.second, 9);
    at::set_num_threads(2);
    const Derivatives two_threads = derivatives(op.first, op.second, 9);
    at::set_num_threads(threads);
    // The fused second derivatives (ATen's own first backward of layer_norm sums its weight
    // gradient in an order that depends on the threads).
    CHECK(at::equal(one_thread.hvp, two_threads.hvp));
  }
}

TEST_CASE("batched_matmul equals at::matmul: value and gradient bit for bit, then to rounding",
          "[fused_ops]") {
  // Attention's products on strided heads of one projection's output (q, k, v read in place),
  // 16 × 8 heads: above LibTorch's own loop for small products, so both take BLAS.
  const Op attention = [](const Inputs& in) {
    const at::Tensor& x = in[0];
    auto head = [&](int64_t i) {
      return x.narrow(2, 32 * i, 32).view({4, 16, 4, 8}).transpose(1, 2);
    };
    const at::Tensor s = batched_matmul(head(0), head(1).transpose(-2, -1));
    return batched_matmul(at::softmax(s, -1), head(2));
  };
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    INFO(c10::toString(dtype));
    const Inputs x = {random({4, 16, 96}, 1, dtype)};
    // The products are libcurv's, except with a LibTorch whose bmm is MKL's batched product.
    const at::Tensor y = attention({x[0].clone().requires_grad_(true)});
    CHECK((y.grad_fn()->name().find("BatchedMatmul") != std::string::npos) == !at::hasMKL());
    const Derivatives ours = derivatives(attention, x, 3);
    set_fused_operations(false);
    const Derivatives aten = derivatives(attention, x, 3);
    set_fused_operations(true);
    CHECK(at::equal(ours.value, aten.value));
    CHECK(at::equal(ours.gradient, aten.gradient));
    const double tolerance = dtype == at::kDouble ? 1e-13 : 1e-5;
    CHECK(relative_difference(ours.hvp, aten.hvp) < tolerance);
    CHECK(relative_difference(ours.hvp_with_graph, aten.hvp) < tolerance);
    CHECK(relative_difference(ours.third, aten.third) < 10 * tolerance);
    CHECK(aten.third.abs().max().item<double>() > 0.0);
  }
  // One thread, and small or mismatched operands (which take at::matmul).
  const at::Tensor a = random({3, 5, 4, 6}, 2, at::kDouble),
                   b = random({3, 5, 6, 7}, 3, at::kDouble);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  CHECK(at::equal(batched_matmul(a, b), at::matmul(a, b)));
  at::set_num_threads(threads);
  const at::Tensor small = random({2, 3, 2}, 4, at::kDouble);
  CHECK(at::equal(batched_matmul(small, small.transpose(-2, -1)),
                  at::matmul(small, small.transpose(-2, -1))));
  CHECK(at::equal(batched_matmul(a, b.narrow(0, 0, 1)), at::matmul(a, b.narrow(0, 0, 1))));
}
