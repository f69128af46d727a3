// Dot products of whole tensors for the engine's per-tensor and per-block sums.
#pragma once

#include <ATen/core/Tensor.h>

namespace curv {

// a·b for tensors of one shape, accumulated in float64, as a 0-dim float64 tensor on their
// device; undefined when either is. On the CPU, for float32/float64 operands, one pass over both
// without temporaries, in fixed chunks of eight running sums each (the value does not depend on
// the thread count); elsewhere at::sum(a.to(kDouble) * b).
at::Tensor float64_dot(const at::Tensor& a, const at::Tensor& b);

}  // namespace curv
