// The attention's products of many small matrices (curv/models/fused_ops.h, batched_matmul).
// LibTorch's CPU bmm without MKL (Debian's, on OpenBLAS) multiplies the matrices of a batch one
// after the other, each product spread over all threads; at attention's sizes (T × head_dim, e.g.
// 128 × 32) the threads spend more time meeting than multiplying, and at::matmul first copies
// transposed heads into contiguous batches. Here the matrices are split over the threads, each
// product made by one thread (BLAS runs single-threaded inside a parallel region), each operand
// read in place through its strides. A forward product and both of its derivative products take
// this path, so an HVP's second backward does too.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "curv/models/fused_ops.h"

namespace curv {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The leading dimensions' index of matrix s (row-major order over a.sizes()[0 .. lead)).
std::vector<int64_t> unravel(int64_t s, at::IntArrayRef sizes, int64_t lead) {
  std::vector<int64_t> index(static_cast<size_t>(lead));
  for (int64_t d = lead - 1; d >= 0; --d) {
    index[static_cast<size_t>(d)] = s % sizes[d];
    s /= sizes[d];
  }
  return index;
}

at::Tensor matrix(const at::Tensor& t, const std::vector<int64_t>& index) {
  at::Tensor m = t;
  for (const int64_t i : index) m = m.select(0, i);
  return m;
}

// a [..., n, k] times b [..., k, m] with equal leading sizes, on the CPU.
at::Tensor products_over_threads(const at::Tensor& a, const at::Tensor& b) {
  std::vector<int64_t> sizes = a.sizes().vec();
  sizes.back() = b.size(-1);
  at::Tensor out = at::empty(sizes, a.options());
  const int64_t lead = a.dim() - 2;
  int64_t count = 1;
  for (int64_t d = 0; d < lead; ++d) count *= a.size(d);
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    // Grad mode is per thread, and the workers do not inherit the forward's.
    const c10::NoGradGuard no_grad;
    for (int64_t s = begin; s < end; ++s) {
      const std::vector<int64_t> index = unravel(s, a.sizes(), lead);
      at::Tensor o = matrix(out, index);
      at::mm_out(o, matrix(a, index), matrix(b, index));
    }
  });
  return out;
}

constexpr int64_t kLibTorchSmallProduct = 400;

bool products_over_threads_apply(const at::Tensor& a, const at::Tensor& b) {
  // A LibTorch with MKL (the PyPI wheel's) makes CPU bmm one batched MKL call already.
  if (at::hasMKL()) return false;
  if (!a.device().is_cpu() || !b.device().is_cpu()) return false;
  if (a.scalar_type() != b.scalar_type()) return false;
  if (a.scalar_type() != at::kFloat && a.scalar_type() != at::kDouble) return false;
  if (a.dim() < 3 || a.dim() != b.dim()) return false;
  if (a.sizes().slice(0, a.dim() - 2) != b.sizes().slice(0, b.dim() - 2)) return false;
  // Below 400 multiply-adds per matrix LibTorch's bmm takes its own loop (no BLAS), whose
  // summation order a BLAS product would not reproduce bit for bit.
  const int64_t work = a.size(-2) * a.size(-1) * b.size(-1);
  return a.size(-1) == b.size(-2) && work >= kLibTorchSmallProduct;
}

class BatchedMatmul : public torch::autograd::Function<BatchedMatmul> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return products_over_threads(a, b);
  }

  // d/da = dy bᵀ, d/db = aᵀ dy, themselves batched products, so that higher derivatives take
  // the same path.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const at::Tensor& dy = grads[0];
    at::Tensor grad_a, grad_b;
    if (!dy.defined()) return {grad_a, grad_b};
    if (ctx->needs_input_grad(0)) grad_a = batched_matmul(dy, b.transpose(-2, -1));
    if (ctx->needs_input_grad(1)) grad_b = batched_matmul(a.transpose(-2, -1), dy);
    return {grad_a, grad_b};
  }
};

}  // namespace

at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!fused_operations() || !products_over_threads_apply(a, b)) return at::matmul(a, b);
  return BatchedMatmul::apply(a, b);
}

}  // namespace curv
