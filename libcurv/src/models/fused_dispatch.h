// Which kernel runs a fused second derivative (fused_ops.cpp, cross_entropy.cpp): the CPU's, the
// CUDA kernels' (fused_kernels_cuda.h), or none (the differentiable ATen formulas).
#pragma once

#include <ATen/Functions.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <initializer_list>

#ifdef CURV_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "models/fused_kernels_cuda.h"

namespace curv {

enum class FusedKernel { kNone, kCpu, kCuda };

// The kernel for these tensors (undefined ones ignored): float32/float64 of one dtype on one
// device, the CPU or a CUDA device where fused_kernels_run_on (fused_ops.h) holds, with
// set_fused_kernels on and no graph of the result wanted (a second backward without create_graph,
// so third derivatives stay exact through the ATen formulas).
FusedKernel fused_kernel_for(std::initializer_list<at::Tensor> tensors);

// Whether libcurv's CUDA kernels can run on CUDA device `index` (built with them, for an
// architecture of that GPU, with a driver that runs them).
inline bool cuda_kernels_run_on_device(int index) {
#ifdef CURV_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  return cuda_kernels::runs_on_current_device();
#else
  (void)index;
  return false;
#endif
}

// The kernels' arguments: a tensor's data or null when it is undefined (an output not wanted, a
// cotangent absent), and a contiguous tensor or the undefined one.
template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mutable_data_or_null(at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
inline at::Tensor contiguous_or_undefined(const at::Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

// A norm's weight derivative sums over rows: the rows are split into this many chunks (fewer
// with fewer rows), each summed alone and then the chunks in order, so that the result does not
// depend on the thread count or the GPU's scheduling.
inline constexpr int64_t kWeightChunks = 32;
inline constexpr int64_t kCudaRowChunks = 2048;

// The number of row chunks for `rows` rows on `kernel` (the CUDA kernel spreads rows over more
// blocks than the CPU has threads).
inline int64_t weight_row_chunks(FusedKernel kernel, int64_t rows) {
  return std::min(rows, kernel == FusedKernel::kCuda ? kCudaRowChunks : kWeightChunks);
}
// The chunks' zeroed sums of a weight derivative over rows of n entries of x, in x's
// accumulation type: [chunks, n].
inline at::Tensor zeroed_weight_chunks(int64_t chunks, int64_t n, const at::Tensor& x) {
  return at::zeros({chunks, n}, x.options().dtype(at::toOpMathType(x.scalar_type())));
}

// Runs launch(stream) with `device` current and `stream` LibTorch's current stream there (a
// cudaStream_t as void*); a launch that fails is an error naming `what` and CUDA's message.
template <typename Launch>
void launch_on_cuda(const at::Device& device, const char* what, Launch&& launch) {
#ifdef CURV_WITH_CUDA_KERNELS
  const c10::cuda::CUDAGuard guard(device);
  const char* error = launch(static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
#else
  (void)device;
  const char* error = launch(nullptr);
#endif
  TORCH_CHECK(error == nullptr, what, ": ", error);
}

}  // namespace curv
