// Fused second derivatives of the LLaMA family's element-wise operations (see
// curv/models/fused_ops.h): RMSNorm, the gated SiLU of SwiGLU and the rotary product. As in
// fused_ops.cpp, each operation's backward is one autograd operation of our own whose backward
// runs one kernel (the CPU's, or libcurv's CUDA kernels on a GPU) where LibTorch composes about
// ten element-wise passes: RMSNorm's composite graph (pow, mean, add, rsqrt, two products) and
// rotate_half's narrow/neg/cat. Forward values and first derivatives are the composite formulas'
// own ATen operations in their order, bit for bit, so training is unchanged.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "curv/models/fused_ops.h"
#include "models/fused_dispatch.h"

namespace curv {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// LibTorch 1.13's custom functions take no undefined tensors: RMSNorm without a gain (modded's
// inner norms) passes an empty tensor.
bool no_gain(const at::Tensor& gain) { return gain.numel() == 0; }

// ---------------------------------------------------------------------------------------------
// RMSNorm over rows of length N: x̂ = x·ρ, ρ = (mean(x²) + ε)^(−1/2), y = x̂⊙w (w = 1 without a
// gain). With g = dy⊙w, its backward is dx = dx₁ + dx₂ with dx₁ = ρ·g (through x·ρ) and
// dx₂ = −ρ·x̂·mean(g⊙x̂) (through ρ), and dw = Σ_rows dy⊙x̂. The two parts are separate outputs,
// both into x, so that the autograd engine adds them to x's gradient one after the other as it
// does for ATen's graph (whose backward reaches x through the product and through pow): the
// gradient is ATen's bit for bit, also beside a residual. Its backward, for cotangents A₁, A₂
// of dx₁, dx₂ and Bw of dw (each row; means over the row), with gx = mean(g⊙x̂), a₁g =
// mean(A₁⊙g), a₂ = mean(A₂⊙x̂), bdx = mean(Bw⊙dy⊙x̂):
//   ∂/∂dy = w⊙ρ(A₁ − x̂·a₂) + Bw⊙x̂,      ∂/∂w = Σ_rows dy⊙ρ(A₁ − x̂·a₂),
//   ∂/∂x  = −ρ²(a₂·g + gx·A₂) − ρ²·x̂·(a₁g − 3·a₂·gx) + ρ(Bw⊙dy − x̂·bdx).
// Two passes per row: four row sums, then the outputs. ∂/∂w sums rows within fixed chunks and
// then the chunks, in an order that does not depend on the thread count.

template <typename T>
void rms_norm_double_backward_kernel(const T* x, const T* w, const T* dy, const T* rstd,
                                     const T* A1, const T* A2, const T* bw, T* grad_x, T* grad_dy,
                                     at::opmath_type<T>* grad_w_chunks, int64_t chunks,
                                     int64_t rows, int64_t n) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
      const int64_t row_begin = rows * chunk / chunks, row_end = rows * (chunk + 1) / chunks;
      acc_t* gw = grad_w_chunks ? grad_w_chunks + chunk * n : nullptr;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const int64_t o = row * n;
        const acc_t rho = rstd[row];
        acc_t sgx = 0, sa1g = 0, sa2x = 0, sbdx = 0;
        for (int64_t j = 0; j < n; ++j) {
          const acc_t xh = acc_t(x[o + j]) * rho;
          const acc_t g = w ? acc_t(dy[o + j]) * acc_t(w[j]) : acc_t(dy[o + j]);
          sgx += g * xh;
          if (A1) sa1g += acc_t(A1[o + j]) * g;
          if (A2) sa2x += acc_t(A2[o + j]) * xh;
          if (bw) sbdx += acc_t(bw[j]) * acc_t(dy[o + j]) * xh;
        }
        const acc_t inv_n = acc_t(1) / acc_t(n);
        const acc_t gx = sgx * inv_n, a1g = sa1g * inv_n, a2 = sa2x * inv_n, bdx = sbdx * inv_n;
        const acc_t rho2 = rho * rho;
        const acc_t x_coefficient = -rho2 * (a1g - acc_t(3) * a2 * gx);
        for (int64_t j = 0; j < n; ++j) {
          const acc_t xh = acc_t(x[o + j]) * rho;
          const acc_t d = dy[o + j];
          const acc_t wj = w ? acc_t(w[j]) : acc_t(1);
          const acc_t a1 = A1 ? acc_t(A1[o + j]) : acc_t(0);
          const acc_t rpa = rho * (a1 - xh * a2);
          if (grad_dy) grad_dy[o + j] = T(wj * rpa + (bw ? acc_t(bw[j]) * xh : acc_t(0)));
          if (gw) gw[j] += d * rpa;
          if (grad_x) {
            const acc_t a2j = A2 ? acc_t(A2[o + j]) : acc_t(0);
            acc_t v = -rho2 * (a2 * d * wj + gx * a2j) + xh * x_coefficient;
            if (bw) v += rho * (acc_t(bw[j]) * d - xh * bdx);
            grad_x[o + j] = T(v);
          }
        }
      }
    }
  });
}

at::Tensor rms_inverse(const at::Tensor& x, double eps) {
  return at::rsqrt(x.pow(2).mean(-1, true) + eps);
}

class RmsNormGradient : public torch::autograd::Function<RmsNormGradient> {
 public:
  // Returns {dx₁, dx₂, dw}; dw is empty without a gain.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& dy, const at::Tensor& rstd, double eps) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, w, dy});
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["eps"] = eps;
    // The composite graph's own backward steps in its order (products, rsqrt's −½·r³, mean's
    // expand and division, pow's 2x, the reductions to the operands' shapes).
    const at::Tensor g = no_gain(w) ? dy : dy * w;
    const at::Tensor d_rstd = at::sum_to(g * x, rstd.sizes());
    const at::Tensor d_mean_square = d_rstd * -0.5 * rstd.pow(3);
    const at::Tensor dx2 = d_mean_square.expand(x.sizes()) / x.size(-1) * (x * 2.0);
    const at::Tensor dw =
        no_gain(w) ? at::empty({0}, w.options()) : at::sum_to(dy * (x * rstd), w.sizes());
    return {g * rstd, dx2, dw};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor w = no_gain(saved[1]) ? at::Tensor() : saved[1];
    const at::Tensor& dy = saved[2];
    const at::Tensor &A1 = grads[0], &A2 = grads[1];
    const at::Tensor bw = w.defined() ? grads[2] : at::Tensor();
    const int64_t n = x.size(-1);
    const bool want_x = ctx->needs_input_grad(0), want_w = w.defined() && ctx->needs_input_grad(1),
               want_dy = ctx->needs_input_grad(2);
    at::Tensor grad_x, grad_w, grad_dy;
    if (!A1.defined() && !A2.defined() && !bw.defined()) {
      return {grad_x, grad_w, grad_dy, at::Tensor(), at::Tensor()};
    }
    const FusedKernel kernel = fused_kernel_for({x, w, dy, A1, A2, bw});
    if (kernel != FusedKernel::kNone) {
      const at::Tensor xc = x.contiguous(), wc = contiguous_or_undefined(w), dyc = dy.contiguous();
      const at::Tensor a1c = contiguous_or_undefined(A1), a2c = contiguous_or_undefined(A2),
                       bwc = contiguous_or_undefined(bw);
      const at::Tensor rstd = ctx->saved_data["rstd"].toTensor().contiguous();
      const int64_t rows = x.numel() / n;
      if (want_x) grad_x = at::empty_like(xc);
      if (want_dy) grad_dy = at::empty_like(dyc);
      const int64_t row_chunks = weight_row_chunks(kernel, rows);
      at::Tensor chunks;
      if (want_w && (A1.defined() || A2.defined()) && rows > 0)
        chunks = zeroed_weight_chunks(row_chunks, n, x);
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_double_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const scalar_t *xp = xc.data_ptr<scalar_t>(), *wp = data_or_null<scalar_t>(wc),
                       *dyp = dyc.data_ptr<scalar_t>(), *rp = rstd.data_ptr<scalar_t>(),
                       *a1p = data_or_null<scalar_t>(a1c), *a2p = data_or_null<scalar_t>(a2c),
                       *bwp = data_or_null<scalar_t>(bwc);
        scalar_t *gx = mutable_data_or_null<scalar_t>(grad_x),
                 *gdy = mutable_data_or_null<scalar_t>(grad_dy);
        acc_t* gw = chunks.defined() ? chunks.data_ptr<acc_t>() : nullptr;
        if (kernel == FusedKernel::kCpu) {
          rms_norm_double_backward_kernel<scalar_t>(xp, wp, dyp, rp, a1p, a2p, bwp, gx, gdy, gw,
                                                    row_chunks, rows, n);
        } else {
          launch_on_cuda(x.device(), "rms_norm double backward", [&](void* stream) {
            return cuda_kernels::rms_norm_double_backward<scalar_t>(
                xp, wp, dyp, rp, a1p, a2p, bwp, gx, gdy, gw, row_chunks, rows, n, stream);
          });
        }
      });
      if (chunks.defined()) grad_w = chunks.sum(0).to(w.scalar_type()).reshape(w.sizes());
    } else {
      // The same formulas in differentiable ATen operations, with ρ recomputed from x so that
      // its dependence on x is part of any further derivative.
      const at::Tensor rho = rms_inverse(x, ctx->saved_data["eps"].toDouble());
      const at::Tensor xh = x * rho;
      const at::Tensor g = w.defined() ? dy * w : dy;
      const at::Tensor gx = (g * xh).mean(-1, true);
      at::Tensor rpa, a2;
      if (A1.defined()) rpa = A1 * rho;
      if (A2.defined()) {
        a2 = (A2 * xh).mean(-1, true);
        rpa = rpa.defined() ? rpa - xh * (a2 * rho) : -xh * (a2 * rho);
      }
      if (rpa.defined()) {
        if (want_dy) grad_dy = w.defined() ? w * rpa : rpa;
        if (want_w) grad_w = at::sum_to(dy * rpa, w.sizes());
      }
      if (bw.defined() && want_dy) grad_dy = grad_dy.defined() ? grad_dy + bw * xh : bw * xh;
      if (want_x) {
        const at::Tensor rho2 = rho * rho;
        at::Tensor x_coefficient;
        if (A1.defined()) x_coefficient = (A1 * g).mean(-1, true);
        if (A2.defined()) {
          x_coefficient = x_coefficient.defined() ? x_coefficient - 3.0 * a2 * gx : -3.0 * a2 * gx;
          grad_x = -rho2 * (a2 * g + gx * A2);
        }
        if (x_coefficient.defined()) {
          const at::Tensor part = -rho2 * x_coefficient * xh;
          grad_x = grad_x.defined() ? grad_x + part : part;
        }
        if (bw.defined()) {
          const at::Tensor bd = bw * dy;
          const at::Tensor part = rho * (bd - xh * (bd * xh).mean(-1, true));
          grad_x = grad_x.defined() ? grad_x + part : part;
        }
      }
    }
    return {grad_x, grad_w, grad_dy, at::Tensor(), at::Tensor()};
  }
};

class RmsNorm : public torch::autograd::Function<RmsNorm> {
 public:
  // x is passed twice (the same tensor): its two gradient parts go to it as separate edges.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& x_again,
                            const at::Tensor& gain, double eps) {
    (void)x_again;
    // The composite formula's operations in its order: values bit for bit.
    const at::Tensor rstd = rms_inverse(x, eps);
    ctx->save_for_backward({x, gain});
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["eps"] = eps;
    return no_gain(gain) ? x * rstd : gain * (x * rstd);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &gain = saved[1];
    const variable_list d = RmsNormGradient::apply(
        x, gain, grads[0], ctx->saved_data["rstd"].toTensor(), ctx->saved_data["eps"].toDouble());
    return {d[0], d[1], no_gain(gain) ? at::Tensor() : d[2], at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// Gated SiLU (SwiGLU's): y = s(a)⊙b, s(a) = a·σ(a). Backward (ATen's graph of silu(a) * b):
// da = dy⊙b⊙s'(a), db = dy⊙s(a). Its backward, for cotangents A of da
// and C of db:
//   ∂/∂dy = A⊙b⊙s'(a) + C⊙s(a),   ∂/∂b = A⊙dy⊙s'(a),   ∂/∂a = A⊙dy⊙b⊙s''(a) + C⊙dy⊙s'(a),
// s' = σ(1 + a(1 − σ)), s'' = σ(1 − σ)(2 + a(1 − 2σ)). The kernel takes σ from ATen's vectorised
// sigmoid and makes one pass.

template <typename T>
void gated_silu_double_backward_kernel(const T* a, const T* b, const T* dy, const T* sig,
                                       const T* A, const T* C, T* grad_a, T* grad_b, T* grad_dy,
                                       int64_t n) {
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T v = a[i], s = sig[i];
      const T d1 = s * (T(1) + v * (T(1) - s));
      const T av = A ? A[i] : T(0), cv = C ? C[i] : T(0);
      if (grad_dy) grad_dy[i] = av * b[i] * d1 + cv * v * s;
      if (grad_b) grad_b[i] = av * dy[i] * d1;
      if (grad_a) {
        const T d2 = s * (T(1) - s) * (T(2) + v * (T(1) - T(2) * s));
        grad_a[i] = dy[i] * (av * b[i] * d2 + cv * d1);
      }
    }
  });
}

class GatedSiluGradient : public torch::autograd::Function<GatedSiluGradient> {
 public:
  // `graph`: whether the first backward builds a graph (create_graph), where ATen differentiates
  // silu by its composite formula rather than its silu_backward kernel; the same choice here
  // keeps gradients bit for bit equal to ATen's either way.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                               const at::Tensor& dy, const at::Tensor& silu_a, bool graph) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({a, b, dy});
    const at::Tensor d_silu = dy * b;
    at::Tensor da;
    if (graph) {
      const at::Tensor sig = at::sigmoid(a);
      da = d_silu * sig * (1.0 + a * (1.0 - sig));
    } else {
      da = at::silu_backward(d_silu, a);
    }
    return {da, dy * silu_a};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &dy = saved[2];
    const at::Tensor &A = grads[0], &C = grads[1];
    at::Tensor grad_a, grad_b, grad_dy;
    if (!A.defined() && !C.defined()) return {grad_a, grad_b, grad_dy, at::Tensor(), at::Tensor()};
    const bool want_a = ctx->needs_input_grad(0), want_b = ctx->needs_input_grad(1) && A.defined(),
               want_dy = ctx->needs_input_grad(2);
    const FusedKernel kernel = fused_kernel_for({a, b, dy, A, C});
    if (kernel != FusedKernel::kNone) {
      const at::Tensor ac = a.contiguous(), bc = b.contiguous(), dyc = dy.contiguous();
      const at::Tensor Ac = contiguous_or_undefined(A), Cc = contiguous_or_undefined(C);
      if (want_a) grad_a = at::empty_like(ac);
      if (want_b) grad_b = at::empty_like(ac);
      if (want_dy) grad_dy = at::empty_like(ac);
      AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "gated_silu_double_backward", [&] {
        const scalar_t *ap = ac.data_ptr<scalar_t>(), *bp = bc.data_ptr<scalar_t>(),
                       *dyp = dyc.data_ptr<scalar_t>(), *Ap = data_or_null<scalar_t>(Ac),
                       *Cp = data_or_null<scalar_t>(Cc);
        scalar_t *ga = mutable_data_or_null<scalar_t>(grad_a),
                 *gb = mutable_data_or_null<scalar_t>(grad_b),
                 *gdy = mutable_data_or_null<scalar_t>(grad_dy);
        if (kernel == FusedKernel::kCpu) {
          const at::Tensor sig = at::sigmoid(ac);
          gated_silu_double_backward_kernel<scalar_t>(ap, bp, dyp, sig.data_ptr<scalar_t>(), Ap, Cp,
                                                      ga, gb, gdy, ac.numel());
        } else {
          launch_on_cuda(a.device(), "gated silu double backward", [&](void* stream) {
            return cuda_kernels::gated_silu_double_backward<scalar_t>(ap, bp, dyp, Ap, Cp, ga, gb,
                                                                      gdy, ac.numel(), stream);
          });
        }
      });
    } else {
      const at::Tensor s = at::sigmoid(a);
      const at::Tensor d1 = s * (1.0 + a * (1.0 - s));
      if (A.defined()) {
        if (want_dy) grad_dy = A * b * d1;
        if (want_b) grad_b = A * dy * d1;
        if (want_a) grad_a = A * dy * b * (s * (1.0 - s) * (2.0 + a * (1.0 - 2.0 * s)));
      }
      if (C.defined()) {
        if (want_dy) grad_dy = grad_dy.defined() ? grad_dy + C * a * s : C * a * s;
        if (want_a) grad_a = grad_a.defined() ? grad_a + C * dy * d1 : C * dy * d1;
      }
    }
    return {grad_a, grad_b, grad_dy, at::Tensor(), at::Tensor()};
  }
};

class GatedSilu : public torch::autograd::Function<GatedSilu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor silu_a = at::silu(a);
    ctx->save_for_backward({a, b, silu_a});
    return silu_a * b;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const variable_list d = GatedSiluGradient::apply(saved[0], saved[1], grads[0], saved[2],
                                                     at::GradMode::is_enabled());
    return {d[0], d[1]};
  }
};

// ---------------------------------------------------------------------------------------------
// Rotary product: y = x⊙cos + R(x)⊙sin over the last dimension (of even size D, h = D / 2),
// R(x) = (−x₂, x₁) (HF's rotate_half), cos and sin tables [T, D] broadcast over x [..., T, D].
// Linear in x with constant tables, so its backward is its transpose, dx = dy⊙cos + Rᵀ(dy⊙sin),
// Rᵀ(z) = (z₂, −z₁), whose backward is the product again: one kernel (one pass) per direction,
// to every order of derivative.

template <typename T>
void rotary_kernel(const T* x, const T* cos, const T* sin, T* out, const int64_t* sizes,
                   const int64_t* x_strides, const int64_t* out_strides, bool transpose) {
  const int64_t rows = sizes[0] * sizes[1] * sizes[2], T_ = sizes[2], D = sizes[3], h = D / 2;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r % T_, i1 = (r / T_) % sizes[1], i0 = r / (T_ * sizes[1]);
      const T* xr = x + i0 * x_strides[0] + i1 * x_strides[1] + t * x_strides[2];
      T* yr = out + i0 * out_strides[0] + i1 * out_strides[1] + t * out_strides[2];
      const T *c = cos + t * D, *s = sin + t * D;
      if (!transpose) {
        for (int64_t j = 0; j < h; ++j) yr[j] = xr[j] * c[j] + -xr[j + h] * s[j];
        for (int64_t j = h; j < D; ++j) yr[j] = xr[j] * c[j] + xr[j - h] * s[j];
      } else {
        for (int64_t j = 0; j < h; ++j) yr[j] = xr[j] * c[j] + xr[j + h] * s[j + h];
        for (int64_t j = h; j < D; ++j) yr[j] = xr[j] * c[j] + -(xr[j - h] * s[j - h]);
      }
    }
  });
}

at::Tensor rotate_half_of(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor rotary_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            bool transpose) {
  if (!transpose) return x * cos + rotate_half_of(x) * sin;
  // Rᵀ(z) = −R(z).
  return x * cos - rotate_half_of(x * sin);
}

class RotaryProduct : public torch::autograd::Function<RotaryProduct> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, bool transpose) {
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    ctx->saved_data["transpose"] = transpose;
    const int64_t T = x.dim() == 4 ? x.size(2) : 0, D = x.size(-1);
    const FusedKernel kernel = fused_kernel_for({x, cos, sin});
    if (kernel == FusedKernel::kNone || x.dim() != 4 || x.stride(3) != 1 || D % 2 != 0 ||
        cos.sizes() != at::IntArrayRef{T, D} || sin.sizes() != at::IntArrayRef{T, D}) {
      return rotary_composite(x, cos, sin, transpose);
    }
    // The result in x's memory layout (heads read in place from a projection stay so).
    const at::Tensor out = at::empty_like(x);
    const at::Tensor cc = cos.contiguous(), sc = sin.contiguous();
    const int64_t sizes[4] = {x.size(0), x.size(1), T, D};
    const int64_t xs[3] = {x.stride(0), x.stride(1), x.stride(2)};
    const int64_t os[3] = {out.stride(0), out.stride(1), out.stride(2)};
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rotary_product", [&] {
      const scalar_t *xp = x.data_ptr<scalar_t>(), *cp = cc.data_ptr<scalar_t>(),
                     *sp = sc.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      if (kernel == FusedKernel::kCpu) {
        rotary_kernel<scalar_t>(xp, cp, sp, op, sizes, xs, os, transpose);
      } else {
        launch_on_cuda(x.device(), "rotary product", [&](void* stream) {
          return cuda_kernels::rotary_product<scalar_t>(xp, cp, sp, op, sizes, xs, os, transpose,
                                                        stream);
        });
      }
    });
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    return {RotaryProduct::apply(grads[0], ctx->saved_data["cos"].toTensor(),
                                 ctx->saved_data["sin"].toTensor(),
                                 !ctx->saved_data["transpose"].toBool()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& gain, double eps) {
  if (!fused_operations()) {
    const at::Tensor normed = x * rms_inverse(x, eps);
    return gain.defined() ? gain * normed : normed;
  }
  return RmsNorm::apply(x, x, gain.defined() ? gain : at::empty({0}, x.options()), eps);
}

at::Tensor fused_gated_silu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "fused_gated_silu: gate ", gate.sizes(), " and up ",
              up.sizes(), " differ in shape");
  if (!fused_operations()) return at::silu(gate) * up;
  return GatedSilu::apply(gate, up);
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!fused_operations()) return rotary_composite(x, cos, sin, false);
  return RotaryProduct::apply(x, cos.detach(), sin.detach(), false);
}

}  // namespace curv
