// CUDA kernels of the fused second derivatives (fused_ops.cpp, fused_llama_ops.cpp,
// cross_entropy.cpp): the same formulas as the CPU kernels there, one block per row. Compiled by
// nvcc only when LibTorch has CUDA and a CUDA compiler is found (CURV_WITH_CUDA_KERNELS); this
// header names no CUDA or ATen type, so nvcc compiles it without LibTorch's headers. Every launcher
// takes raw device pointers of one dtype (float or double), contiguous, and `stream` (a
// cudaStream_t, LibTorch's current stream), and returns nullptr or the CUDA runtime's message for a
// failed launch. Without the kernels, each launcher returns a message saying so (fused_dispatch.h
// never picks them then).
#pragma once

#include <cstdint>

namespace curv::cuda_kernels {

#ifdef CURV_WITH_CUDA_KERNELS
inline constexpr bool kBuilt = true;
#else
inline constexpr bool kBuilt = false;
inline constexpr const char* kNotBuilt = "libcurv was built without its CUDA kernels";
#endif

#ifdef CURV_WITH_CUDA_KERNELS
// Whether the kernels can run on the current CUDA device.
bool runs_on_current_device();

// Causal softmax's double backward: rows of length n, row r attending to columns 0..r % n.
// grad_p or grad_dp may be null (not wanted).
template <typename T>
const char* softmax_double_backward(const T* p, const T* dp, const T* w, T* grad_p, T* grad_dp,
                                    int64_t rows, int64_t n, T scale, void* stream);

// out = w ⊙ dy ⊙ g''(x) for GELU, exact or tanh.
template <typename T>
const char* gelu_second_derivative_product(const T* x, const T* dy, const T* w, T* out, int64_t n,
                                           bool tanh, void* stream);

// LayerNorm's double backward (fused_ops.cpp has the formulas). A, bw, bb, grad_x, grad_dy and
// grad_w_chunks may be null. Rows are split into `chunks` contiguous ranges; chunk c adds its
// rows' share of ∂/∂w into grad_w_chunks[c * n ...] (zeroed by the caller), so the sum over
// chunks is independent of scheduling.
template <typename T>
const char* layer_norm_double_backward(const T* x, const T* w, const T* dy, const T* mean,
                                       const T* rstd, const T* A, const T* bw, const T* bb,
                                       T* grad_x, T* grad_dy, T* grad_w_chunks, int64_t chunks,
                                       int64_t rows, int64_t n, void* stream);

// Mean cross-entropy's double backward for logits z [rows, classes], cotangent v of its gradient,
// and the loss's incoming gradient g (one device scalar):
//   d_logits = g / rows · (p ⊙ v − p · Σ_j p_j v_j),   row_terms[r] = Σ_j p_j v_j − v[t_r],
// p = softmax(z) per row. d_logits or row_terms may be null.
template <typename T>
const char* cross_entropy_double_backward(const T* logits, const T* v, const int64_t* targets,
                                          const T* grad_loss, T* d_logits, T* row_terms,
                                          int64_t rows, int64_t classes, void* stream);

// RMSNorm's double backward (fused_llama_ops.cpp has the formulas): A1 and A2 are the cotangents
// of the backward's two parts; w (no gain), A1, A2, bw, grad_x, grad_dy and grad_w_chunks may be
// null; grad_w_chunks as for LayerNorm.
template <typename T>
const char* rms_norm_double_backward(const T* x, const T* w, const T* dy, const T* rstd,
                                     const T* A1, const T* A2, const T* bw, T* grad_x, T* grad_dy,
                                     T* grad_w_chunks, int64_t chunks, int64_t rows, int64_t n,
                                     void* stream);

// The gated SiLU's double backward (fused_llama_ops.cpp): cotangents A of da and C of db, either
// null; any output may be null.
template <typename T>
const char* gated_silu_double_backward(const T* a, const T* b, const T* dy, const T* A, const T* C,
                                       T* grad_a, T* grad_b, T* grad_dy, int64_t n, void* stream);

// The rotary product (or its transpose) of x [sizes[0], sizes[1], sizes[2], sizes[3]] with
// tables [sizes[2], sizes[3]], x and out strided as given over the first three dimensions and
// contiguous in the last.
template <typename T>
const char* rotary_product(const T* x, const T* cos, const T* sin, T* out, const int64_t* sizes,
                           const int64_t* x_strides, const int64_t* out_strides, bool transpose,
                           void* stream);

#else
inline bool runs_on_current_device() { return false; }
template <typename T>
const char* rms_norm_double_backward(const T*, const T*, const T*, const T*, const T*, const T*,
                                     const T*, T*, T*, T*, int64_t, int64_t, int64_t, void*) {
  return kNotBuilt;
}
template <typename T>
const char* gated_silu_double_backward(const T*, const T*, const T*, const T*, const T*, T*, T*, T*,
                                       int64_t, void*) {
  return kNotBuilt;
}
template <typename T>
const char* rotary_product(const T*, const T*, const T*, T*, const int64_t*, const int64_t*,
                           const int64_t*, bool, void*) {
  return kNotBuilt;
}
template <typename T>
const char* softmax_double_backward(const T*, const T*, const T*, T*, T*, int64_t, int64_t, T,
                                    void*) {
  return kNotBuilt;
}
template <typename T>
const char* gelu_second_derivative_product(const T*, const T*, const T*, T*, int64_t, bool, void*) {
  return kNotBuilt;
}
template <typename T>
const char* layer_norm_double_backward(const T*, const T*, const T*, const T*, const T*, const T*,
                                       const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t,
                                       void*) {
  return kNotBuilt;
}
template <typename T>
const char* cross_entropy_double_backward(const T*, const T*, const int64_t*, const T*, T*, T*,
                                          int64_t, int64_t, void*) {
  return kNotBuilt;
}
#endif

}  // namespace curv::cuda_kernels
