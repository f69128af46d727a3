// Fused second derivatives for the built-in transformers' element-wise operations (see
// curv/models/fused_ops.h). In a Hessian-vector product through a kept gradient graph, LibTorch
// 1.13 differentiates the first backward's softmax, LayerNorm and GELU kernels with composed
// formulas: about ten separate element-wise passes each, every one allocating its result. Here
// each operation's backward is one autograd operation of our own whose backward makes one or two
// passes per row. The forward values and first derivatives are ATen's bit for bit (its own
// kernels, in ATen's order); second and higher derivatives take the formulas below.
#include "curv/models/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "models/fused_dispatch.h"

namespace curv {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<bool> operations_enabled{true};
std::atomic<bool> kernels_enabled{true};

}  // namespace

// The hand-written kernels take float32/float64 tensors of one dtype on one device, the CPU or
// (when libcurv is built with them) a CUDA device, and only when no graph of the result is wanted
// (a second backward without create_graph); otherwise the differentiable ATen formulas run, so
// third derivatives stay exact.
FusedKernel fused_kernel_for(std::initializer_list<at::Tensor> tensors) {
  if (!kernels_enabled || at::GradMode::is_enabled()) return FusedKernel::kNone;
  c10::optional<at::ScalarType> dtype;
  c10::optional<at::Device> device;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) return FusedKernel::kNone;
    if (dtype && *dtype != t.scalar_type()) return FusedKernel::kNone;
    if (device && *device != t.device()) return FusedKernel::kNone;
    dtype = t.scalar_type();
    device = t.device();
  }
  if (!device || device->is_cpu()) return FusedKernel::kCpu;
  if (device->is_cuda() && fused_kernels_run_on(*device)) return FusedKernel::kCuda;
  return FusedKernel::kNone;
}

bool fused_kernels_run_on(const at::Device& device) {
  if (device.is_cpu()) return true;
  if (!device.is_cuda() || !cuda_kernels::kBuilt) return false;
  // Asked once per device: 0 not yet, 1 no, 2 yes.
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices];
  const int index = device.has_index() ? device.index() : 0;
  if (index < 0 || index >= kDevices) return false;
  if (known[index] == 0) known[index] = cuda_kernels_run_on_device(index) ? 2 : 1;
  return known[index] == 2;
}

namespace {

// Rows per task for at::parallel_for: about 32k elements per task.
int64_t row_grain(int64_t row_length) { return std::max<int64_t>(1, 32768 / row_length); }

// ---------------------------------------------------------------------------------------------
// Causal softmax: P = softmax(s·S + M) over rows of S [..., n, n], M the additive causal mask.
// Backward: dS = s·P⊙(dP − r), r = Σ_j P_j dP_j per row. Its backward, for the cotangent W of
// dS, with a = Σ_j P_j W_j:  ∂/∂dP = s·P⊙(W − a),  ∂/∂P = s·(W⊙(dP − r) − a·dP).
// Entries above the diagonal have P = 0 and carry no derivative; the kernels write 0 there.

at::Tensor causal_mask(int64_t n, const at::TensorOptions& options) {
  return at::full({n, n}, -std::numeric_limits<double>::infinity(), options).triu(1);
}

template <typename T>
void softmax_double_backward_kernel(const T* p, const T* dp, const T* w, T* grad_p, T* grad_dp,
                                    int64_t rows, int64_t n, T scale) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t width = row % n + 1;
      const int64_t o = row * n;
      const T *pr = p + o, *dpr = dp + o, *wr = w + o;
      acc_t r = 0, a = 0;
      for (int64_t j = 0; j < width; ++j) {
        r += acc_t(pr[j]) * acc_t(dpr[j]);
        a += acc_t(pr[j]) * acc_t(wr[j]);
      }
      const T rt = T(r), at_ = T(a);
      if (grad_dp) {
        T* out = grad_dp + o;
        for (int64_t j = 0; j < width; ++j) out[j] = scale * pr[j] * (wr[j] - at_);
        std::fill(out + width, out + n, T(0));
      }
      if (grad_p) {
        T* out = grad_p + o;
        for (int64_t j = 0; j < width; ++j) out[j] = scale * (wr[j] * (dpr[j] - rt) - at_ * dpr[j]);
        std::fill(out + width, out + n, T(0));
      }
    }
  });
}

class CausalSoftmaxGradient : public torch::autograd::Function<CausalSoftmaxGradient> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& p, const at::Tensor& dp,
                            double scale) {
    ctx->save_for_backward({p, dp});
    ctx->saved_data["scale"] = scale;
    // ATen's softmax backward and then the scale, as ATen's own graph of softmax(s·S + M)
    // computes them: gradients bit for bit equal to ATen's, so training is unchanged.
    return at::_softmax_backward_data(dp, p, -1, p.scalar_type()).mul_(scale);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &p = saved[0], &dp = saved[1];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor& w = grads[0];
    at::Tensor grad_p, grad_dp;
    if (!w.defined()) return {grad_p, grad_dp, at::Tensor()};
    const FusedKernel kernel = fused_kernel_for({p, dp, w});
    if (kernel != FusedKernel::kNone) {
      const at::Tensor pc = p.contiguous(), dpc = dp.contiguous(), wc = w.contiguous();
      if (ctx->needs_input_grad(0)) grad_p = at::empty_like(pc);
      if (ctx->needs_input_grad(1)) grad_dp = at::empty_like(pc);
      const int64_t n = p.size(-1), rows = p.numel() / std::max<int64_t>(n, 1);
      AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "causal_softmax_double_backward", [&] {
        const scalar_t *pp = pc.data_ptr<scalar_t>(), *dpp = dpc.data_ptr<scalar_t>(),
                       *wp = wc.data_ptr<scalar_t>();
        scalar_t *gp = mutable_data_or_null<scalar_t>(grad_p),
                 *gdp = mutable_data_or_null<scalar_t>(grad_dp);
        if (kernel == FusedKernel::kCpu) {
          softmax_double_backward_kernel<scalar_t>(pp, dpp, wp, gp, gdp, rows, n, scalar_t(scale));
        } else {
          launch_on_cuda(p.device(), "causal_softmax double backward", [&](void* stream) {
            return cuda_kernels::softmax_double_backward<scalar_t>(pp, dpp, wp, gp, gdp, rows, n,
                                                                   scalar_t(scale), stream);
          });
        }
      });
    } else {
      const at::Tensor a = (p * w).sum(-1, true);
      if (ctx->needs_input_grad(0)) {
        grad_p = (w * (dp - (p * dp).sum(-1, true)) - a * dp) * scale;
      }
      if (ctx->needs_input_grad(1)) grad_dp = p * (w - a) * scale;
    }
    return {grad_p, grad_dp, at::Tensor()};
  }
};

class CausalSoftmax : public torch::autograd::Function<CausalSoftmax> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, double scale) {
    const int64_t n = scores.size(-1);
    at::Tensor p = at::softmax(scores * scale + causal_mask(n, scores.options()), -1);
    ctx->save_for_backward({p});
    ctx->saved_data["scale"] = scale;
    return p;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    const double scale = ctx->saved_data["scale"].toDouble();
    return {CausalSoftmaxGradient::apply(p, grads[0], scale), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// GELU: y = g(x). Backward: dx = dy⊙g'(x) (ATen's gelu_backward). Its backward, for the
// cotangent W of dx: ∂/∂dy = W⊙g'(x) (gelu_backward again), ∂/∂x = W⊙dy⊙g''(x), with
//   exact:  g'' = φ(x)(2 − x²), φ the standard normal density;
//   tanh:   g = x(1 + t)/2, t = tanh(u), u = k(x + c x³), k = √(2/π), c = 0.044715:
//           g'' = (1 − t²)(u' + x(u'' − 2t u'²)/2), u' = k(1 + 3c x²), u'' = 6k c x.

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/√(2π)
constexpr double kTanhCubic = 0.044715;

// The transcendental part of g'' for each x: exp(−x²/2) (exact) or tanh(u) (tanh); computed as
// its argument here and by ATen's vectorised exp_/tanh_ in place.
template <typename T>
void gelu_transcendental_argument(const T* x, T* out, int64_t n, bool tanh) {
  at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
    if (tanh) {
      for (int64_t i = begin; i < end; ++i) {
        const T v = x[i];
        out[i] = T(kSqrt2OverPi) * (v + T(kTanhCubic) * v * v * v);
      }
    } else {
      for (int64_t i = begin; i < end; ++i) out[i] = T(-0.5) * x[i] * x[i];
    }
  });
}

template <typename T>
void gelu_second_derivative_product(const T* x, const T* dy, const T* w, const T* trans, T* out,
                                    int64_t n, bool tanh) {
  at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
    if (tanh) {
      const T k = T(kSqrt2OverPi), c = T(kTanhCubic);
      for (int64_t i = begin; i < end; ++i) {
        const T v = x[i], t = trans[i];
        const T du = k * (T(1) + T(3) * c * v * v);
        const T ddu = T(6) * k * c * v;
        const T g2 = (T(1) - t * t) * (du + T(0.5) * v * (ddu - T(2) * t * du * du));
        out[i] = w[i] * dy[i] * g2;
      }
    } else {
      for (int64_t i = begin; i < end; ++i) {
        const T v = x[i];
        out[i] = w[i] * dy[i] * (T(kInvSqrt2Pi) * trans[i] * (T(2) - v * v));
      }
    }
  });
}

at::Tensor gelu_second_derivative_composite(const at::Tensor& x, bool tanh) {
  if (!tanh) return at::exp(x * x * -0.5) * kInvSqrt2Pi * (2.0 - x * x);
  const at::Tensor t = at::tanh((x + x * x * x * kTanhCubic) * kSqrt2OverPi);
  const at::Tensor du = (1.0 + x * x * (3.0 * kTanhCubic)) * kSqrt2OverPi;
  const at::Tensor ddu = x * (6.0 * kSqrt2OverPi * kTanhCubic);
  return (1.0 - t * t) * (du + x * 0.5 * (ddu - t * du * du * 2.0));
}

const char* gelu_approximation(bool tanh) { return tanh ? "tanh" : "none"; }

class GeluGradient : public torch::autograd::Function<GeluGradient> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& dy,
                            bool tanh) {
    ctx->save_for_backward({x, dy});
    ctx->saved_data["tanh"] = tanh;
    return at::gelu_backward(dy, x, gelu_approximation(tanh));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &dy = saved[1];
    const bool tanh = ctx->saved_data["tanh"].toBool();
    const at::Tensor& w = grads[0];
    at::Tensor grad_x, grad_dy;
    if (!w.defined()) return {grad_x, grad_dy, at::Tensor()};
    if (ctx->needs_input_grad(1)) grad_dy = at::gelu_backward(w, x, gelu_approximation(tanh));
    if (ctx->needs_input_grad(0)) {
      const FusedKernel kernel = fused_kernel_for({x, dy, w});
      if (kernel == FusedKernel::kCuda) {
        const at::Tensor xc = x.contiguous(), dyc = dy.contiguous(), wc = w.contiguous();
        grad_x = at::empty_like(xc);
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gelu_double_backward", [&] {
          launch_on_cuda(x.device(), "gelu double backward", [&](void* stream) {
            return cuda_kernels::gelu_second_derivative_product<scalar_t>(
                xc.data_ptr<scalar_t>(), dyc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
                grad_x.data_ptr<scalar_t>(), xc.numel(), tanh, stream);
          });
        });
      } else if (kernel == FusedKernel::kCpu) {
        const at::Tensor xc = x.contiguous(), dyc = dy.contiguous(), wc = w.contiguous();
        at::Tensor trans = at::empty_like(xc);
        grad_x = at::empty_like(xc);
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gelu_double_backward", [&] {
          gelu_transcendental_argument<scalar_t>(xc.data_ptr<scalar_t>(),
                                                 trans.data_ptr<scalar_t>(), xc.numel(), tanh);
          if (tanh) {
            trans.tanh_();
          } else {
            trans.exp_();
          }
          gelu_second_derivative_product<scalar_t>(
              xc.data_ptr<scalar_t>(), dyc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
              trans.data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), xc.numel(), tanh);
        });
      } else {
        grad_x = w * dy * gelu_second_derivative_composite(x, tanh);
      }
    }
    return {grad_x, grad_dy, at::Tensor()};
  }
};

class Gelu : public torch::autograd::Function<Gelu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, bool tanh) {
    ctx->save_for_backward({x});
    ctx->saved_data["tanh"] = tanh;
    return at::gelu(x, gelu_approximation(tanh));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {GeluGradient::apply(x, grads[0], ctx->saved_data["tanh"].toBool()), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// LayerNorm over rows of length N: x̂ = (x − μ)·ρ, ρ = (var + ε)^(−1/2), y = x̂⊙w + b.
// Backward (ATen's kernel): with g = dy⊙w, dx = ρ·P(g), P(q) = q − mean(q) − x̂·mean(q⊙x̂);
// dw = Σ_rows dy⊙x̂, db = Σ_rows dy. P is symmetric and ∂x̂/∂x = ρ·P, ∂ρ/∂x = −ρ² x̂ / N.
// Its backward, for cotangents A of dx, Bw of dw and Bb of db (each row):
//   ∂/∂dy = w⊙ρ·P(A) + Bw⊙x̂ + Bb,       ∂/∂w = Σ_rows dy⊙ρ·P(A),
//   ∂/∂x  = ρ·P(Q) − ρ·x̂·mean(A⊙dx),     Q = −ρ(g·mean(A⊙x̂) + A·mean(g⊙x̂)) + Bw⊙dy.
// The kernel makes two passes per row: the row sums first (P(Q)'s means follow from them), then
// the outputs. ∂/∂w sums rows within fixed chunks and then the chunks, in an order that does not
// depend on the thread count.

template <typename T>
void layer_norm_double_backward_kernel(const T* x, const T* w, const T* dy, const T* mean,
                                       const T* rstd, const T* A, const T* bw, const T* bb,
                                       T* grad_x, T* grad_dy, at::opmath_type<T>* grad_w_chunks,
                                       int64_t chunks, int64_t rows, int64_t n) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      const int64_t row_begin = rows * chunk / chunks, row_end = rows * (chunk + 1) / chunks;
      acc_t* gw = grad_w_chunks ? grad_w_chunks + chunk * n : nullptr;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const int64_t o = row * n;
        const acc_t mu = mean[row], rho = rstd[row];
        acc_t sg = 0, sgx = 0, sa = 0, sax = 0, sag = 0, sbd = 0, sbdx = 0;
        for (int64_t j = 0; j < n; ++j) {
          const acc_t xh = (acc_t(x[o + j]) - mu) * rho;
          const acc_t g = acc_t(dy[o + j]) * acc_t(w[j]);
          sg += g;
          sgx += g * xh;
          if (A) {
            const acc_t a = A[o + j];
            sa += a;
            sax += a * xh;
            sag += a * g;
          }
          if (bw) {
            const acc_t bd = acc_t(bw[j]) * acc_t(dy[o + j]);
            sbd += bd;
            sbdx += bd * xh;
          }
        }
        const acc_t inv_n = acc_t(1) / acc_t(n);
        const acc_t g_mean = sg * inv_n, gx_mean = sgx * inv_n;
        const acc_t a_mean = sa * inv_n, ax_mean = sax * inv_n;
        const acc_t adx_mean = rho * (sag * inv_n - a_mean * g_mean - ax_mean * gx_mean);
        const acc_t q_mean = (-rho * (sg * ax_mean + sa * gx_mean) + sbd) * inv_n;
        const acc_t qx_mean = (-rho * (sgx * ax_mean + sax * gx_mean) + sbdx) * inv_n;
        for (int64_t j = 0; j < n; ++j) {
          const acc_t xh = (acc_t(x[o + j]) - mu) * rho;
          const acc_t d = dy[o + j];
          const acc_t a = A ? acc_t(A[o + j]) : acc_t(0);
          const acc_t rpa = rho * (a - a_mean - xh * ax_mean);
          if (grad_dy) {
            acc_t v = acc_t(w[j]) * rpa;
            if (bw) v += acc_t(bw[j]) * xh;
            if (bb) v += acc_t(bb[j]);
            grad_dy[o + j] = T(v);
          }
          if (gw) gw[j] += d * rpa;
          if (grad_x) {
            acc_t q = -rho * (d * acc_t(w[j]) * ax_mean + a * gx_mean);
            if (bw) q += acc_t(bw[j]) * d;
            grad_x[o + j] = T(rho * (q - q_mean - xh * qx_mean) - rho * xh * adx_mean);
          }
        }
      }
    }
  });
}

// LibTorch 1.13's custom functions take no undefined tensors: a model without biases passes an
// empty tensor.
bool no_bias(const at::Tensor& bias) { return bias.numel() == 0; }

class LayerNormGradient : public torch::autograd::Function<LayerNormGradient> {
 public:
  // Returns {dx, dw} or, with a bias, {dx, dw, db}.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& dy, const at::Tensor& bias, const at::Tensor& mean,
                               const at::Tensor& rstd, double eps) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, w, dy});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["eps"] = eps;
    const bool has_bias = !no_bias(bias);
    auto [dx, dw, db] = at::native_layer_norm_backward(
        dy, x, {w.numel()}, mean, rstd, w, has_bias ? bias : at::Tensor(), {true, true, has_bias});
    if (has_bias) return {dx, dw, db};
    return {dx, dw};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &dy = saved[2];
    const at::Tensor& A = grads[0];
    const at::Tensor& bw = grads[1];
    const at::Tensor bb = grads.size() > 2 ? grads[2] : at::Tensor();
    const int64_t n = w.numel();
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1),
               want_dy = ctx->needs_input_grad(2);
    at::Tensor grad_x, grad_w, grad_dy;
    const FusedKernel kernel = fused_kernel_for({x, w, dy, A, bw, bb});
    if (kernel != FusedKernel::kNone) {
      const at::Tensor xc = x.contiguous(), wc = w.contiguous(), dyc = dy.contiguous();
      const at::Tensor ac = contiguous_or_undefined(A), bwc = contiguous_or_undefined(bw),
                       bbc = contiguous_or_undefined(bb);
      const at::Tensor mean = ctx->saved_data["mean"].toTensor().contiguous();
      const at::Tensor rstd = ctx->saved_data["rstd"].toTensor().contiguous();
      const int64_t rows = x.numel() / n;
      if (want_x) grad_x = at::empty_like(xc);
      if (want_dy) grad_dy = at::empty_like(dyc);
      const int64_t row_chunks = weight_row_chunks(kernel, rows);
      at::Tensor chunks;
      if (want_w && A.defined() && rows > 0) chunks = zeroed_weight_chunks(row_chunks, n, x);
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_double_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const scalar_t *xp = xc.data_ptr<scalar_t>(), *wp = wc.data_ptr<scalar_t>(),
                       *dyp = dyc.data_ptr<scalar_t>(), *mp = mean.data_ptr<scalar_t>(),
                       *rp = rstd.data_ptr<scalar_t>(), *ap = data_or_null<scalar_t>(ac),
                       *bwp = data_or_null<scalar_t>(bwc), *bbp = data_or_null<scalar_t>(bbc);
        scalar_t *gx = mutable_data_or_null<scalar_t>(grad_x),
                 *gdy = mutable_data_or_null<scalar_t>(grad_dy);
        acc_t* gw = chunks.defined() ? chunks.data_ptr<acc_t>() : nullptr;
        if (kernel == FusedKernel::kCpu) {
          layer_norm_double_backward_kernel<scalar_t>(xp, wp, dyp, mp, rp, ap, bwp, bbp, gx, gdy,
                                                      gw, row_chunks, rows, n);
        } else {
          launch_on_cuda(x.device(), "layer_norm double backward", [&](void* stream) {
            return cuda_kernels::layer_norm_double_backward<scalar_t>(
                xp, wp, dyp, mp, rp, ap, bwp, bbp, gx, gdy, gw, row_chunks, rows, n, stream);
          });
        }
      });
      if (chunks.defined()) grad_w = chunks.sum(0).to(w.scalar_type()).reshape(w.sizes());
    } else {
      // The same formulas in differentiable ATen operations, with μ and ρ recomputed from x so
      // that their dependence on x is part of any further derivative.
      const double eps = ctx->saved_data["eps"].toDouble();
      const at::Tensor xc = x - x.mean(-1, true);
      const at::Tensor rho = at::rsqrt(xc.pow(2).mean(-1, true) + eps);
      const at::Tensor xh = xc * rho;
      const at::Tensor g = dy * w;
      const at::Tensor gx_mean = (g * xh).mean(-1, true);
      at::Tensor q;
      if (A.defined()) {
        const at::Tensor ax_mean = (A * xh).mean(-1, true);
        const at::Tensor rpa = (A - A.mean(-1, true) - xh * ax_mean) * rho;
        if (want_dy) grad_dy = w * rpa;
        if (want_w) grad_w = (dy * rpa).reshape({-1, n}).sum(0).reshape(w.sizes());
        q = -rho * (g * ax_mean + A * gx_mean);
      }
      if (bw.defined()) {
        if (want_dy) grad_dy = grad_dy.defined() ? grad_dy + bw * xh : bw * xh;
        q = q.defined() ? q + bw * dy : bw * dy;
      }
      if (bb.defined() && want_dy) grad_dy = grad_dy.defined() ? grad_dy + bb : bb.expand_as(dy);
      if (want_x && q.defined()) {
        grad_x = rho * (q - q.mean(-1, true) - xh * (q * xh).mean(-1, true));
        if (A.defined()) {
          const at::Tensor dx = rho * (g - g.mean(-1, true) - xh * gx_mean);
          grad_x = grad_x - rho * xh * (A * dx).mean(-1, true);
        }
      }
    }
    return {grad_x, grad_w, grad_dy, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class LayerNorm : public torch::autograd::Function<LayerNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& bias, double eps) {
    auto [y, mean, rstd] =
        at::native_layer_norm(x, {w.numel()}, w, no_bias(bias) ? at::Tensor() : bias, eps);
    ctx->save_for_backward({x, w, bias});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &bias = saved[2];
    const variable_list d = LayerNormGradient::apply(
        x, w, grads[0], bias, ctx->saved_data["mean"].toTensor(),
        ctx->saved_data["rstd"].toTensor(), ctx->saved_data["eps"].toDouble());
    return {d[0], d[1], no_bias(bias) ? at::Tensor() : d[2], at::Tensor()};
  }
};

}  // namespace

void set_fused_operations(bool enabled) { operations_enabled = enabled; }
bool fused_operations() { return operations_enabled; }
void set_fused_kernels(bool enabled) { kernels_enabled = enabled; }
bool fused_kernels() { return kernels_enabled; }

at::Tensor causal_softmax(const at::Tensor& scores, double scale) {
  const int64_t n = scores.size(-1);
  TORCH_CHECK(scores.dim() >= 2 && scores.size(-2) == n,
              "causal_softmax: scores must be [..., T, T], got ", scores.sizes());
  if (!operations_enabled)
    return at::softmax(scores * scale + causal_mask(n, scores.options()), -1);
  return CausalSoftmax::apply(scores, scale);
}

at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            double eps) {
  if (!operations_enabled || !weight.defined()) {
    return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
  }
  return LayerNorm::apply(x, weight, bias.defined() ? bias : at::empty({0}, weight.options()), eps);
}

at::Tensor fused_gelu(const at::Tensor& x, bool tanh) {
  if (!operations_enabled) return at::gelu(x, gelu_approximation(tanh));
  return Gelu::apply(x, tanh);
}

}  // namespace curv
