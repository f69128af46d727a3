// Parameter space: the named, ordered parameter tensors of a model, and vectors in that space
// (one tensor per parameter) with the dot products, norms and axpy that every algorithm needs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace curv {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // position of the first element in the flat (concatenated) vector
};

// The layout of a model's parameters: names, shapes, order. Cheap to copy.
class ParamSpace {
 public:
  ParamSpace() = default;
  ParamSpace(const std::vector<std::string>& names, const std::vector<at::Tensor>& like);

  size_t size() const { return params_.size(); }
  int64_t numel() const { return numel_; }
  const ParamInfo& operator[](size_t i) const { return params_[i]; }
  const std::vector<ParamInfo>& params() const { return params_; }
  std::vector<std::string> names() const;
  std::optional<size_t> find(const std::string& name) const;
  // Index of `name`; throws InvalidArgument naming the closest existing names if absent.
  size_t index(const std::string& name) const;

 private:
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> by_name_;
  int64_t numel_ = 0;
};

// A vector in parameter space: tensors aligned with a ParamSpace, in its order.
using ParamVector = std::vector<at::Tensor>;

// "float64", "float32", "bfloat16", "float16" (the names torch and the command lines use).
std::string dtype_name(at::ScalarType dtype);
// The floating dtype dtype_name gives `name`; nullopt for any other text.
std::optional<at::ScalarType> floating_dtype_named(const std::string& name);
// Whether `dtype` is a 16-bit floating type (bfloat16, float16).
bool is_16_bit(at::ScalarType dtype);
// The dtype parameter-space vectors (directions, gradients, HVPs) are kept in for parameters of
// dtype `params` unless a program declares another: the parameters' own, and float32 for 16-bit
// parameters, whose 8- or 11-bit mantissas would round a direction, or a sum over batches, far
// more than the model's own arithmetic does.
at::ScalarType default_vector_dtype(at::ScalarType params);
// `text` as a vector dtype: "auto" (default_vector_dtype(params)), "float64", "float32",
// "bfloat16" or "float16"; `option` names the setting in the error for anything else.
at::ScalarType parse_vector_dtype(const std::string& text, at::ScalarType params,
                                  const std::string& option);
// x with every defined tensor in `dtype`, detached: the tensors themselves where they already are.
ParamVector converted(const ParamVector& x, at::ScalarType dtype);

// a·b for tensors of one shape, accumulated in float64, as a 0-dim float64 tensor on their
// device; undefined when either is. On the CPU, for float32/float64 operands, one pass over both
// without temporaries, in fixed chunks of eight running sums each (the value does not depend on
// the thread count); elsewhere ATen's sums of chunks of 2^24 products converted to float64, so
// the scratch memory is bounded whatever the size (a 7B-entry vector's float64 copy would be
// 56 GB).
at::Tensor float64_dot(const at::Tensor& a, const at::Tensor& b);

// Elementwise helpers. Reductions accumulate in float64 whatever the tensors' dtype; in dot(), an
// undefined tensor counts as zero.
double dot(const ParamVector& a, const ParamVector& b);
double squared_norm(const ParamVector& a);
double norm(const ParamVector& a);
// Dot product restricted to the parameters listed in `indices`.
double dot(const ParamVector& a, const ParamVector& b, const std::vector<size_t>& indices);
// a_i·b_i of every tensor i (of those in `indices` when given; the others are 0), all computed on
// the tensors' device before one transfer to the host, so that per-block sums cost one
// synchronisation rather than one per tensor. sum_over adds a block's entries in index order:
// the same double as dot(a, b, block).
std::vector<double> dots_per_tensor(const ParamVector& a, const ParamVector& b,
                                    const std::vector<size_t>* indices = nullptr);
double sum_over(const std::vector<double>& per_tensor, const std::vector<size_t>& indices);
void axpy(double alpha, const ParamVector& x, ParamVector& y);  // y += alpha * x (in place)
ParamVector scaled(const ParamVector& x, double alpha);         // alpha * x (new tensors)
ParamVector add(const ParamVector& a, const ParamVector& b);    // a + b (new tensors)
// a − b (new tensors), on b's device: a may live on the host beside b on a GPU (a next
// checkpoint kept in host memory), whose tensors then cross one at a time.
ParamVector sub(const ParamVector& a, const ParamVector& b);
// a − b computed and kept in `dtype`, on b's device: the difference of two 16-bit checkpoints
// without a 16-bit rounding of its own.
ParamVector sub(const ParamVector& a, const ParamVector& b, at::ScalarType dtype);
ParamVector zeros_like(const ParamVector& x);
ParamVector clone(const ParamVector& x);  // detached copies
ParamVector detached(const ParamVector& x);
// x restricted to `indices`: the other parameters become zero tensors.
ParamVector masked(const ParamVector& x, const std::vector<size_t>& indices);
bool all_finite(const ParamVector& x);

// The entries of x concatenated in order into one float64 tensor on x's device (an undefined
// tensor has none: x must be complete).
at::Tensor flat_float64(const ParamVector& x);

// Conversion to and from one contiguous float64 buffer of length space.numel(), as Spectra and
// Eigen expect. `like` supplies dtype and device of the tensors created by from_flat.
void to_flat(const ParamVector& x, double* out);
ParamVector from_flat(const double* data, const ParamSpace& space, const ParamVector& like);

}  // namespace curv
