// ProbeSet: the fixed, ordered list of batches over which every quantity is measured. The loss is
// the size-weighted mean over batches (each batch weighs N_b / N), so results do not depend on how
// the examples were split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "curv/core/objective.h"

namespace curv {

class ProbeSet {
 public:
  ProbeSet() = default;
  explicit ProbeSet(std::vector<Batch> batches);
  // Splits the examples (first dim) into consecutive batches of `batch_size`; the last may be
  // smaller. batch_size <= 0 keeps one batch.
  static ProbeSet split(const at::Tensor& inputs, const at::Tensor& targets, int64_t batch_size);
  // `batch` as `count` consecutive shards of ⌈N / count⌉ examples (fewer when N < count·⌈N/count⌉
  // leaves the last ones empty): one per rank of a data-parallel step; count 1 keeps it whole.
  static ProbeSet shards(const Batch& batch, int count);

  size_t size() const { return batches_.size(); }
  bool empty() const { return batches_.empty(); }
  int64_t num_examples() const { return num_examples_; }
  const Batch& operator[](size_t i) const { return batches_[i]; }
  double weight(size_t i) const;  // N_b / N
  // Floating inputs/targets converted to `dtype`, all tensors moved to `device`.
  ProbeSet to(at::ScalarType dtype, c10::Device device) const;
  // Hex digest of shapes, dtypes and bytes: identifies the probe set in provenance.
  std::string hash() const;

 private:
  std::vector<Batch> batches_;
  int64_t num_examples_ = 0;
};

}  // namespace curv
