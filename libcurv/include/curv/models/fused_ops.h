// Autograd operations of the built-in transformers (and for any LibTorch model) whose backward is
// itself one differentiable operation with a hand-written derivative, so that a Hessian-vector
// product through a kept gradient graph makes one pass per operation instead of LibTorch 1.13's
// composed double backwards (several separate element-wise kernels each). Each takes, in order:
//   - the fused kernel (float32/float64, second backward without create_graph): the CPU's, or on
//     a CUDA device libcurv's CUDA kernels when it was built with them (a CUDA LibTorch and nvcc;
//     the CUDA kernels also take the built-in models' cross-entropy);
//   - the same formulas written in differentiable ATen operations (other devices and dtypes, and
//     a second backward with create_graph, so third derivatives stay exact).
// With set_fused_operations(false) they return ATen's own operations. Values and first
// derivatives are ATen's to rounding; tests/fused_ops_test.cpp checks second and third
// derivatives against ATen's in float64.
#pragma once

#include <ATen/core/Tensor.h>

namespace curv {

// softmax(scale · scores + causal mask) over the last dimension of scores [..., T, T]: row i
// attends to columns 0..i. The same as at::softmax(scores * scale + mask, -1) with the additive
// mask of -inf above the diagonal.
at::Tensor causal_softmax(const at::Tensor& scores, double scale);

// at::layer_norm over the last dimension (of size weight.numel()) with gains `weight` and an
// optional (undefined) bias.
at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            double eps);

// at::gelu(x, tanh ? "tanh" : "none").
at::Tensor fused_gelu(const at::Tensor& x, bool tanh);

// RMSNorm over the last dimension: x / sqrt(mean(x²) + eps), times `gain` when it is defined
// (HF's LlamaRMSNorm in the model's dtype; modded's inner norms have no gain).
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& gain, double eps);

// SwiGLU's gate: at::silu(gate) * up, for gate and up of one shape.
at::Tensor fused_gated_silu(const at::Tensor& gate, const at::Tensor& up);

// The rotary product x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁) over the halves of
// the last dimension, for x [B, H, T, D] (any strides but the last) and constant tables cos,
// sin [T, D]; other shapes take the composite formula.
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// at::matmul(a, b) for a [..., n, k] and b [..., k, m] with the same leading sizes (attention's
// q kᵀ and p v). On the CPU with a LibTorch without MKL (Debian's, on OpenBLAS), in
// float32/float64, the matrices are split over the threads and each product made by one thread,
// read in place through its strides (LibTorch's bmm there makes them one after the other, each
// over all threads, after copying transposed operands), and its derivative products take the
// same path; values and gradients equal at::matmul's bit for bit. Elsewhere at::matmul.
at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b);

// Process-wide switches. set_fused_operations(false) makes the operations above (and so the
// built-in models) use ATen's operations, for comparison; set_fused_kernels(false) keeps the
// fused operations (and the cross-entropy) but makes them take their differentiable-ATen
// formulas everywhere (the path of other devices), for tests and benchmarks of the kernels.
void set_fused_operations(bool enabled);
bool fused_operations();
void set_fused_kernels(bool enabled);
bool fused_kernels();
// Whether the fused kernels run on `device`: the CPU always; a CUDA device when libcurv was built
// with its CUDA kernels (a CUDA LibTorch and nvcc, CURV_CUDA_ARCHITECTURES covering that GPU's)
// and the driver runs them. Elsewhere the fused operations take their ATen formulas.
bool fused_kernels_run_on(const at::Device& device);

}  // namespace curv
