#include "models/transformer_parts.h"

#include <ATen/ATen.h>

#include "curv/models/fused_ops.h"

namespace curv {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gain, double eps) {
  return gain * (x * at::rsqrt(x.pow(2).mean(-1, true) + eps));
}

at::Tensor rotary_inverse_frequencies(double theta, int64_t dims, const at::TensorOptions& f64) {
  return at::pow(theta, at::arange(0, dims, 2, f64) / static_cast<double>(dims)).reciprocal();
}

RotaryTable rotary_table(const at::Tensor& inverse_frequencies, int64_t T, at::ScalarType dtype) {
  const auto f64 = inverse_frequencies.options();
  auto angles = at::outer(at::arange(T, f64), inverse_frequencies);
  auto emb = at::cat({angles, angles}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype), emb.size(-1)};
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& t) {
  const int64_t D = x.size(-1);
  if (t.dims == D) return x * t.cos + rotate_half(x) * t.sin;
  const auto rot = x.narrow(-1, 0, t.dims);
  return at::cat({rot * t.cos + rotate_half(rot) * t.sin, x.narrow(-1, t.dims, D - t.dims)}, -1);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), group = H / KV;
  auto repeat = [&](const at::Tensor& t) {
    return group == 1 ? t : t.unsqueeze(2).expand({B, KV, group, T, D}).reshape({B, H, T, D});
  };
  auto att = causal_softmax(batched_matmul(q, repeat(k).transpose(-2, -1)), scale);
  return batched_matmul(att, repeat(v)).transpose(1, 2).reshape({B, T, H * D});
}

}  // namespace curv
