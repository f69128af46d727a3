// CUDA kernels of the fused second derivatives: the CPU kernels' formulas (fused_ops.cpp,
// fused_llama_ops.cpp, cross_entropy.cpp), one thread block per row (per range of rows for
// LayerNorm and RMSNorm, whose weight derivatives sum over rows) or one thread per element. Row
// sums are reduced within the block in a fixed order, so a result does not depend on scheduling.
// The accumulators have the data's type, as ATen's opmath type does for float and double.
#include <cuda_runtime.h>

#include <cmath>

#include "models/fused_kernels_cuda.h"

namespace curv::cuda_kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxWarps = 32;  // blocks of at most 1024 threads
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kTanhCubic = 0.044715;

__device__ inline float device_exp(float x) { return expf(x); }
__device__ inline double device_exp(double x) { return exp(x); }
__device__ inline float device_tanh(float x) { return tanhf(x); }
__device__ inline double device_tanh(double x) { return tanh(x); }

struct Sum {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct Max {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a > b ? a : b;
  }
};

// Reduces each of v's K values over the block (blockDim.x a multiple of 32); every thread gets
// the results. The warps' partial results are combined in warp order by every thread, the same
// order each time. `shared` holds K * kMaxWarps values and is free again on return.
template <int K, typename A, typename Op>
__device__ void block_reduce(A (&v)[K], A* shared, Op op, A identity) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  for (int k = 0; k < K; ++k) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], offset));
    }
  }
  if (lane == 0) {
    for (int k = 0; k < K; ++k) shared[k * kMaxWarps + warp] = v[k];
  }
  __syncthreads();
  for (int k = 0; k < K; ++k) {
    A total = identity;
    for (int i = 0; i < warps; ++i) total = op(total, shared[k * kMaxWarps + i]);
    v[k] = total;
  }
  __syncthreads();
}

// Threads per row-block: enough to cover short rows in one sweep, 256 for long ones.
int row_threads(int64_t n) { return n <= 64 ? 64 : n <= 256 ? 128 : 256; }

// A grid's x dimension holds at most 2^31 − 1 blocks.
constexpr int64_t kMaxBlocks = 2147483647;
constexpr const char* kTooManyRows = "more rows than one CUDA grid holds (2^31 - 1)";

const char* launch_error() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

// ---------------------------------------------------------------------------------------------
// Causal softmax: dS = s·P⊙(dP − r), r = Σ_j P_j dP_j. For the cotangent W of dS, a = Σ_j P_j W_j:
// ∂/∂dP = s·P⊙(W − a), ∂/∂P = s·(W⊙(dP − r) − a·dP); zero above the diagonal.
template <typename T>
__global__ void softmax_double_backward_kernel(const T* p, const T* dp, const T* w, T* grad_p,
                                               T* grad_dp, int64_t n, T scale) {
  __shared__ T shared[2 * kMaxWarps];
  const int64_t row = blockIdx.x;
  const int64_t width = row % n + 1, o = row * n;
  T sums[2] = {T(0), T(0)};
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const T pj = p[o + j];
    sums[0] += pj * dp[o + j];
    sums[1] += pj * w[o + j];
  }
  block_reduce(sums, shared, Sum(), T(0));
  const T r = sums[0], a = sums[1];
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const bool attended = j < width;
    if (grad_dp) grad_dp[o + j] = attended ? scale * p[o + j] * (w[o + j] - a) : T(0);
    if (grad_p) {
      grad_p[o + j] = attended ? scale * (w[o + j] * (dp[o + j] - r) - a * dp[o + j]) : T(0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GELU's second derivative times w ⊙ dy (fused_ops.cpp has the formulas).
template <typename T>
__global__ void gelu_second_derivative_kernel(const T* x, const T* dy, const T* w, T* out,
                                              int64_t n, bool tanh_form) {
  const T k = T(kSqrt2OverPi), c = T(kTanhCubic);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T v = x[i];
    T g2;
    if (tanh_form) {
      const T t = device_tanh(k * (v + c * v * v * v));
      const T du = k * (T(1) + T(3) * c * v * v);
      const T ddu = T(6) * k * c * v;
      g2 = (T(1) - t * t) * (du + T(0.5) * v * (ddu - T(2) * t * du * du));
    } else {
      g2 = T(kInvSqrt2Pi) * device_exp(T(-0.5) * v * v) * (T(2) - v * v);
    }
    out[i] = w[i] * dy[i] * g2;
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm's double backward, two sweeps per row: the seven row sums, then the outputs.
template <typename T>
__global__ void layer_norm_double_backward_kernel(const T* x, const T* w, const T* dy,
                                                  const T* mean, const T* rstd, const T* A,
                                                  const T* bw, const T* bb, T* grad_x, T* grad_dy,
                                                  T* grad_w_chunks, int64_t chunks, int64_t rows,
                                                  int64_t n) {
  __shared__ T shared[7 * kMaxWarps];
  const int64_t chunk = blockIdx.x;
  const int64_t row_begin = rows * chunk / chunks, row_end = rows * (chunk + 1) / chunks;
  T* gw = grad_w_chunks ? grad_w_chunks + chunk * n : nullptr;
  const T inv_n = T(1) / T(n);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t o = row * n;
    const T mu = mean[row], rho = rstd[row];
    // sg, sgx, sa, sax, sag, sbd, sbdx
    T s[7] = {T(0), T(0), T(0), T(0), T(0), T(0), T(0)};
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T xh = (x[o + j] - mu) * rho;
      const T g = dy[o + j] * w[j];
      s[0] += g;
      s[1] += g * xh;
      if (A) {
        const T a = A[o + j];
        s[2] += a;
        s[3] += a * xh;
        s[4] += a * g;
      }
      if (bw) {
        const T bd = bw[j] * dy[o + j];
        s[5] += bd;
        s[6] += bd * xh;
      }
    }
    block_reduce(s, shared, Sum(), T(0));
    const T g_mean = s[0] * inv_n, gx_mean = s[1] * inv_n;
    const T a_mean = s[2] * inv_n, ax_mean = s[3] * inv_n;
    const T adx_mean = rho * (s[4] * inv_n - a_mean * g_mean - ax_mean * gx_mean);
    const T q_mean = (-rho * (s[0] * ax_mean + s[2] * gx_mean) + s[5]) * inv_n;
    const T qx_mean = (-rho * (s[1] * ax_mean + s[3] * gx_mean) + s[6]) * inv_n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T xh = (x[o + j] - mu) * rho;
      const T d = dy[o + j];
      const T a = A ? A[o + j] : T(0);
      const T rpa = rho * (a - a_mean - xh * ax_mean);
      if (grad_dy) {
        T v = w[j] * rpa;
        if (bw) v += bw[j] * xh;
        if (bb) v += bb[j];
        grad_dy[o + j] = v;
      }
      // Each thread owns its columns of the chunk's row: no other thread writes them.
      if (gw) gw[j] += d * rpa;
      if (grad_x) {
        T q = -rho * (d * w[j] * ax_mean + a * gx_mean);
        if (bw) q += bw[j] * d;
        grad_x[o + j] = rho * (q - q_mean - xh * qx_mean) - rho * xh * adx_mean;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Mean cross-entropy's double backward: the row's maximum, then Σ e^(z−m) and Σ e^(z−m) v, then
// the outputs.
template <typename T>
__global__ void cross_entropy_double_backward_kernel(const T* logits, const T* v,
                                                     const int64_t* targets, const T* grad_loss,
                                                     T* d_logits, T* row_terms, int64_t rows,
                                                     int64_t classes) {
  __shared__ T shared[2 * kMaxWarps];
  const int64_t row = blockIdx.x, o = row * classes;
  T m[1] = {T(-INFINITY)};
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) m[0] = Max()(m[0], logits[o + j]);
  block_reduce(m, shared, Max(), T(-INFINITY));
  T sums[2] = {T(0), T(0)};
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    const T e = device_exp(logits[o + j] - m[0]);
    sums[0] += e;
    sums[1] += e * v[o + j];
  }
  block_reduce(sums, shared, Sum(), T(0));
  const T inv = T(1) / sums[0], pv = sums[1] * inv;
  if (row_terms && threadIdx.x == 0) row_terms[row] = pv - v[o + targets[row]];
  if (!d_logits) return;
  const T scale = grad_loss[0] / T(rows);
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    const T p = device_exp(logits[o + j] - m[0]) * inv;
    d_logits[o + j] = p * (v[o + j] - pv) * scale;
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm's double backward, two sweeps per row: the four row sums, then the outputs.
template <typename T>
__global__ void rms_norm_double_backward_kernel(const T* x, const T* w, const T* dy, const T* rstd,
                                                const T* A1, const T* A2, const T* bw, T* grad_x,
                                                T* grad_dy, T* grad_w_chunks, int64_t chunks,
                                                int64_t rows, int64_t n) {
  __shared__ T shared[4 * kMaxWarps];
  const int64_t chunk = blockIdx.x;
  const int64_t row_begin = rows * chunk / chunks, row_end = rows * (chunk + 1) / chunks;
  T* gw = grad_w_chunks ? grad_w_chunks + chunk * n : nullptr;
  const T inv_n = T(1) / T(n);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t o = row * n;
    const T rho = rstd[row];
    // Σ g x̂, Σ A₁ g, Σ A₂ x̂, Σ Bw dy x̂
    T s[4] = {T(0), T(0), T(0), T(0)};
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T xh = x[o + j] * rho;
      const T g = w ? dy[o + j] * w[j] : dy[o + j];
      s[0] += g * xh;
      if (A1) s[1] += A1[o + j] * g;
      if (A2) s[2] += A2[o + j] * xh;
      if (bw) s[3] += bw[j] * dy[o + j] * xh;
    }
    block_reduce(s, shared, Sum(), T(0));
    const T gx = s[0] * inv_n, a1g = s[1] * inv_n, a2 = s[2] * inv_n, bdx = s[3] * inv_n;
    const T rho2 = rho * rho;
    const T x_coefficient = -rho2 * (a1g - T(3) * a2 * gx);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T xh = x[o + j] * rho;
      const T d = dy[o + j];
      const T wj = w ? w[j] : T(1);
      const T a1 = A1 ? A1[o + j] : T(0);
      const T rpa = rho * (a1 - xh * a2);
      if (grad_dy) grad_dy[o + j] = wj * rpa + (bw ? bw[j] * xh : T(0));
      // Each thread owns its columns of the chunk's row: no other thread writes them.
      if (gw) gw[j] += d * rpa;
      if (grad_x) {
        const T a2j = A2 ? A2[o + j] : T(0);
        T v = -rho2 * (a2 * d * wj + gx * a2j) + xh * x_coefficient;
        if (bw) v += rho * (bw[j] * d - xh * bdx);
        grad_x[o + j] = v;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The gated SiLU's double backward, element by element (fused_llama_ops.cpp has the formulas).
template <typename T>
__global__ void gated_silu_double_backward_kernel(const T* a, const T* b, const T* dy, const T* A,
                                                  const T* C, T* grad_a, T* grad_b, T* grad_dy,
                                                  int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T v = a[i];
    const T s = T(1) / (T(1) + device_exp(-v));
    const T d1 = s * (T(1) + v * (T(1) - s));
    const T av = A ? A[i] : T(0), cv = C ? C[i] : T(0);
    if (grad_dy) grad_dy[i] = av * b[i] * d1 + cv * v * s;
    if (grad_b) grad_b[i] = av * dy[i] * d1;
    if (grad_a) {
      const T d2 = s * (T(1) - s) * (T(2) + v * (T(1) - T(2) * s));
      grad_a[i] = dy[i] * (av * b[i] * d2 + cv * d1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The rotary product or its transpose, one thread per output element.
struct RotaryShape {
  int64_t sizes[4];
  int64_t x_strides[3];
  int64_t out_strides[3];
};

template <typename T>
__global__ void rotary_product_kernel(const T* x, const T* cos, const T* sin, T* out,
                                      RotaryShape shape, bool transpose) {
  const int64_t D = shape.sizes[3], h = D / 2, T_ = shape.sizes[2];
  const int64_t n = shape.sizes[0] * shape.sizes[1] * T_ * D;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t j = i % D, r = i / D;
    const int64_t t = r % T_, i1 = (r / T_) % shape.sizes[1], i0 = r / (T_ * shape.sizes[1]);
    const T* xr = x + i0 * shape.x_strides[0] + i1 * shape.x_strides[1] + t * shape.x_strides[2];
    const T *c = cos + t * D, *s = sin + t * D;
    T y;
    if (!transpose) {
      y = j < h ? xr[j] * c[j] + -xr[j + h] * s[j] : xr[j] * c[j] + xr[j - h] * s[j];
    } else {
      y = j < h ? xr[j] * c[j] + xr[j + h] * s[j + h] : xr[j] * c[j] + -(xr[j - h] * s[j - h]);
    }
    out[i0 * shape.out_strides[0] + i1 * shape.out_strides[1] + t * shape.out_strides[2] + j] = y;
  }
}

// Blocks of 256 threads for an element-wise kernel over n elements (grid-stride beyond 65536).
unsigned elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 65536 ? blocks : 65536);
}

}  // namespace

bool runs_on_current_device() {
  // Fails when the binary holds no code this GPU can run (an architecture outside
  // CURV_CUDA_ARCHITECTURES) or the driver is older than the runtime; the error is cleared so
  // that it does not surface at LibTorch's next check.
  cudaFuncAttributes attributes;
  if (cudaFuncGetAttributes(&attributes, softmax_double_backward_kernel<float>) == cudaSuccess) {
    return true;
  }
  cudaGetLastError();
  return false;
}

template <typename T>
const char* softmax_double_backward(const T* p, const T* dp, const T* w, T* grad_p, T* grad_dp,
                                    int64_t rows, int64_t n, T scale, void* stream) {
  if (rows == 0 || n == 0) return nullptr;
  if (rows > kMaxBlocks) return kTooManyRows;
  softmax_double_backward_kernel<T>
      <<<unsigned(rows), row_threads(n), 0, static_cast<cudaStream_t>(stream)>>>(p, dp, w, grad_p,
                                                                                 grad_dp, n, scale);
  return launch_error();
}

template <typename T>
const char* gelu_second_derivative_product(const T* x, const T* dy, const T* w, T* out, int64_t n,
                                           bool tanh, void* stream) {
  if (n == 0) return nullptr;
  gelu_second_derivative_kernel<T>
      <<<elementwise_blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, dy, w, out, n,
                                                                             tanh);
  return launch_error();
}

template <typename T>
const char* layer_norm_double_backward(const T* x, const T* w, const T* dy, const T* mean,
                                       const T* rstd, const T* A, const T* bw, const T* bb,
                                       T* grad_x, T* grad_dy, T* grad_w_chunks, int64_t chunks,
                                       int64_t rows, int64_t n, void* stream) {
  if (rows == 0 || n == 0 || chunks == 0) return nullptr;
  layer_norm_double_backward_kernel<T>
      <<<unsigned(chunks), row_threads(n), 0, static_cast<cudaStream_t>(stream)>>>(
          x, w, dy, mean, rstd, A, bw, bb, grad_x, grad_dy, grad_w_chunks, chunks, rows, n);
  return launch_error();
}

template <typename T>
const char* cross_entropy_double_backward(const T* logits, const T* v, const int64_t* targets,
                                          const T* grad_loss, T* d_logits, T* row_terms,
                                          int64_t rows, int64_t classes, void* stream) {
  if (rows == 0 || classes == 0) return nullptr;
  if (rows > kMaxBlocks) return kTooManyRows;
  cross_entropy_double_backward_kernel<T>
      <<<unsigned(rows), row_threads(classes), 0, static_cast<cudaStream_t>(stream)>>>(
          logits, v, targets, grad_loss, d_logits, row_terms, rows, classes);
  return launch_error();
}

template <typename T>
const char* rms_norm_double_backward(const T* x, const T* w, const T* dy, const T* rstd,
                                     const T* A1, const T* A2, const T* bw, T* grad_x, T* grad_dy,
                                     T* grad_w_chunks, int64_t chunks, int64_t rows, int64_t n,
                                     void* stream) {
  if (rows == 0 || n == 0 || chunks == 0) return nullptr;
  rms_norm_double_backward_kernel<T>
      <<<unsigned(chunks), row_threads(n), 0, static_cast<cudaStream_t>(stream)>>>(
          x, w, dy, rstd, A1, A2, bw, grad_x, grad_dy, grad_w_chunks, chunks, rows, n);
  return launch_error();
}

template <typename T>
const char* gated_silu_double_backward(const T* a, const T* b, const T* dy, const T* A, const T* C,
                                       T* grad_a, T* grad_b, T* grad_dy, int64_t n, void* stream) {
  if (n == 0) return nullptr;
  gated_silu_double_backward_kernel<T>
      <<<elementwise_blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(a, b, dy, A, C, grad_a,
                                                                             grad_b, grad_dy, n);
  return launch_error();
}

template <typename T>
const char* rotary_product(const T* x, const T* cos, const T* sin, T* out, const int64_t* sizes,
                           const int64_t* x_strides, const int64_t* out_strides, bool transpose,
                           void* stream) {
  RotaryShape shape;
  for (int i = 0; i < 4; ++i) shape.sizes[i] = sizes[i];
  for (int i = 0; i < 3; ++i) {
    shape.x_strides[i] = x_strides[i];
    shape.out_strides[i] = out_strides[i];
  }
  const int64_t n = sizes[0] * sizes[1] * sizes[2] * sizes[3];
  if (n == 0) return nullptr;
  rotary_product_kernel<T><<<elementwise_blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x, cos, sin, out, shape, transpose);
  return launch_error();
}

#define CURV_INSTANTIATE(T)                                                                      \
  template const char* softmax_double_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, \
                                                  int64_t, T, void*);                            \
  template const char* gelu_second_derivative_product<T>(const T*, const T*, const T*, T*,       \
                                                         int64_t, bool, void*);                  \
  template const char* layer_norm_double_backward<T>(const T*, const T*, const T*, const T*,     \
                                                     const T*, const T*, const T*, const T*, T*, \
                                                     T*, T*, int64_t, int64_t, int64_t, void*);  \
  template const char* cross_entropy_double_backward<T>(                                         \
      const T*, const T*, const int64_t*, const T*, T*, T*, int64_t, int64_t, void*);            \
  template const char* rms_norm_double_backward<T>(const T*, const T*, const T*, const T*,       \
                                                   const T*, const T*, const T*, T*, T*, T*,     \
                                                   int64_t, int64_t, int64_t, void*);            \
  template const char* gated_silu_double_backward<T>(const T*, const T*, const T*, const T*,     \
                                                     const T*, T*, T*, T*, int64_t, void*);      \
  template const char* rotary_product<T>(const T*, const T*, const T*, T*, const int64_t*,       \
                                         const int64_t*, const int64_t*, bool, void*);
CURV_INSTANTIATE(float)
CURV_INSTANTIATE(double)
#undef CURV_INSTANTIATE

}  // namespace curv::cuda_kernels
