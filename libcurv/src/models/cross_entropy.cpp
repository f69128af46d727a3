// The built-in models' cross-entropy as one autograd operation whose backward is itself one
// differentiable operation with a hand-written derivative. ATen's log_softmax + nll_loss keeps
// the log-probabilities for backward, and its double backward (the HVP through the first
// backward's graph) composes the softmax Jacobian out of several separate element-wise passes
// over the [tokens, vocabulary] tensor, each kept or allocated anew. Here the first backward
// keeps only the logits it already needs, and a Hessian-vector product makes one fused pass.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>

#include "curv/core/param_space.h"
#include "curv/models/models.h"
#include "models/architecture.h"
#include "models/fused_dispatch.h"

namespace curv {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<bool> fused_enabled{true};

// G = g (softmax(z) − onehot(t)) / N: the gradient of g · mean_n CE(z_n, t_n) with respect to the
// logits z [N, C]. Its backward is the Hessian of the log-sum-exp applied to the incoming V:
// g / N · (p ⊙ V − p ⊙ rowsum(p ⊙ V)), built from differentiable operations so that higher
// derivatives stay exact when a graph is asked for.
class CrossEntropyGradient : public torch::autograd::Function<CrossEntropyGradient> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& grad_loss, const at::Tensor& targets) {
    ctx->save_for_backward({logits, grad_loss, targets});
    const int64_t n = logits.size(0);
    at::Tensor g = at::softmax(logits, -1);
    g.scatter_add_(1, targets.unsqueeze(1), at::full({n, 1}, -1.0, g.options()));
    return g.mul_(grad_loss / static_cast<double>(n));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& grad_loss = saved[1];
    const at::Tensor& targets = saved[2];
    const at::Tensor& v = grads[0];
    const double n = static_cast<double>(logits.size(0));
    if (v.defined() && fused_kernel_for({logits, grad_loss, v}) == FusedKernel::kCuda) {
      return cuda_backward(ctx, logits, grad_loss, targets, v);
    }
    const at::Tensor p = at::softmax(logits, -1);
    const at::Tensor pv = p * v;
    at::Tensor d_logits;
    if (ctx->needs_input_grad(0)) {
      d_logits = (pv - p * pv.sum(-1, true)) * (grad_loss / n);
    }
    at::Tensor d_grad_loss;
    if (ctx->needs_input_grad(1)) {
      // ⟨V, softmax(z) − onehot(t)⟩ / N
      d_grad_loss =
          ((pv.sum() - v.gather(1, targets.unsqueeze(1)).sum()) / n).reshape(grad_loss.sizes());
    }
    return {d_logits, d_grad_loss, at::Tensor()};
  }

 private:
  // The same two results from one CUDA kernel: three sweeps over each row of the logits, the
  // probabilities never stored; the per-row terms of ∂/∂g summed afterwards in a fixed order.
  static variable_list cuda_backward(AutogradContext* ctx, const at::Tensor& logits,
                                     const at::Tensor& grad_loss, const at::Tensor& targets,
                                     const at::Tensor& v) {
    const at::Tensor z = logits.contiguous(), vc = v.contiguous(), t = targets.contiguous();
    const at::Tensor g = grad_loss.reshape({1}).contiguous();
    const int64_t rows = z.size(0), classes = z.size(1);
    at::Tensor d_logits, row_terms;
    if (ctx->needs_input_grad(0)) d_logits = at::empty_like(z);
    if (ctx->needs_input_grad(1)) row_terms = at::empty({rows}, z.options());
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "cross_entropy_double_backward", [&] {
      launch_on_cuda(z.device(), "cross-entropy double backward", [&](void* stream) {
        return cuda_kernels::cross_entropy_double_backward<scalar_t>(
            z.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), t.data_ptr<int64_t>(),
            g.data_ptr<scalar_t>(), d_logits.defined() ? d_logits.data_ptr<scalar_t>() : nullptr,
            row_terms.defined() ? row_terms.data_ptr<scalar_t>() : nullptr, rows, classes, stream);
      });
    });
    at::Tensor d_grad_loss;
    if (row_terms.defined()) {
      d_grad_loss = (row_terms.sum() / static_cast<double>(rows)).reshape(grad_loss.sizes());
    }
    return {d_logits, d_grad_loss, at::Tensor()};
  }
};

// mean_n (logsumexp(z_n) − z_n[t_n]) over rows of z [N, C].
class CrossEntropy : public torch::autograd::Function<CrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets) {
    ctx->save_for_backward({logits, targets});
    const at::Tensor picked = logits.gather(1, targets.unsqueeze(1)).squeeze(1);
    return (at::logsumexp(logits, -1) - picked).mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {CrossEntropyGradient::apply(saved[0], grads[0], saved[1]), at::Tensor()};
  }
};

}  // namespace

void set_fused_cross_entropy(bool enabled) { fused_enabled = enabled; }
bool fused_cross_entropy() { return fused_enabled; }

at::Tensor mean_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t classes = logits.size(-1);
  // A 16-bit model's loss in float32, as its trainers compute it: its own rounding of the
  // log-sum-exp would dominate every loss difference.
  const at::Tensor z =
      (is_16_bit(logits.scalar_type()) ? logits.to(at::kFloat) : logits).reshape({-1, classes});
  const at::Tensor t = targets.reshape({-1});
  // Targets outside [0, C) (nll_loss's ignore_index, or an error) take ATen's path, which
  // handles and reports them.
  const bool plain_targets = t.scalar_type() == at::kLong && t.numel() == z.size(0) &&
                             t.numel() > 0 &&
                             at::logical_and(t >= 0, t < classes).all().item<bool>();
  if (fused_enabled && plain_targets && at::isFloatingType(z.scalar_type())) {
    return CrossEntropy::apply(z, t);
  }
  return at::nll_loss(at::log_softmax(z, -1), t);
}

}  // namespace curv
