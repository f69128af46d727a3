// A checkpoint's tensors as a source rather than a value: the names, shapes and dtypes are listed
// without reading any tensor, and each tensor, or a box of one, is read on demand straight into a
// destination tensor of any device and dtype. Layouts return sources (CheckpointLayoutReader),
// so a model is filled in place from files of any size, one tensor at a time, and a rebuilt
// optimizer step reads each parameter's state when it takes that parameter's step. The files'
// sources are in curv/io/tensor_source.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace curv {

// One tensor of a source: what is known without reading it.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::ScalarType::Undefined;

  int64_t numel() const;
  int64_t bytes() const;  // numel × the dtype's element size
};

class TensorSource {
 public:
  TensorSource() = default;
  virtual ~TensorSource() = default;
  TensorSource(const TensorSource&) = delete;
  TensorSource& operator=(const TensorSource&) = delete;
  // Every tensor, in the order the files hold them. Names are unique, and the list does not
  // change once find() has been called.
  virtual const std::vector<TensorEntry>& entries() const = 0;
  // Where the tensors come from, for messages: "<folder>/model.safetensors", "<step>/ (DCP)".
  virtual std::string origin() const = 0;
  // Reads the box of tensor `name` that starts at `offsets` (one per dimension; empty: at 0) and
  // has `dest`'s sizes into `dest`, on dest's device, converted to dest's dtype as
  // Tensor::copy_ converts. A destination of the tensor's shape receives the whole tensor.
  // InvalidArgument naming the tensor when it is not listed or the box does not lie inside it;
  // FormatError naming the file and the tensor when the bytes cannot be read.
  virtual void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                         at::Tensor dest) const = 0;

  // The entry named `name`, or nullptr. Constant time: an index of entries() is built on the
  // first call (a model has thousands of tensors, and every one is looked up), safely from
  // several threads.
  const TensorEntry* find(const std::string& name) const;
  // The whole tensor, on the CPU in its stored dtype.
  at::Tensor read(const std::string& name) const;
  // Sum of every entry's bytes.
  int64_t total_bytes() const;

 private:
  mutable std::once_flag index_once_;
  mutable std::unordered_map<std::string, size_t> index_;  // name → entries() position
};

using SharedTensorSource = std::shared_ptr<const TensorSource>;

// Tensors already in memory (views kept, nothing copied), in the given order; `origin` names
// them in messages. InvalidArgument for a repeated name.
SharedTensorSource memory_tensor_source(std::vector<std::pair<std::string, at::Tensor>> tensors,
                                        std::string origin);
// A view of `base` holding the tensors `names` lists, (new name, name in base), in that order:
// renamed, or a subset (a state dict's saved buffers left out). InvalidArgument naming a base name
// `base` does not list.
SharedTensorSource renamed_tensor_source(SharedTensorSource base,
                                         std::vector<std::pair<std::string, std::string>> names);
// A part of one of a base source's tensors under a name of its own: the box of `shape` at
// `offsets` (one per dimension of `in_base`) in tensor `in_base`, whose leading
// offsets.size() − shape.size() dimensions are dropped, each selecting the one index its offset
// gives (expert e of a fused [E, rows, cols] tensor: offsets {e, row, 0}, shape {rows, cols}).
// Empty offsets and shape: the whole tensor.
struct TensorSlice {
  std::string name;
  std::string in_base;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
};
// A view of `base` holding the slices, in that order. InvalidArgument naming the base tensor when
// it is not listed or a slice does not lie inside it, and for a name given twice.
SharedTensorSource sliced_tensor_source(SharedTensorSource base, std::vector<TensorSlice> slices);
// Every tensor of `source`, in entries() order (the whole-checkpoint convenience).
std::vector<std::pair<std::string, at::Tensor>> read_all(const TensorSource& source);

// For sources' read_into: InvalidArgument naming the source and the tensor when `entry` is null
// (the tensor is not listed) or the box of `dest`'s sizes at `offsets` does not lie inside it.
void check_read_box(const TensorSource& source, const TensorEntry* entry, const std::string& name,
                    const std::vector<int64_t>& offsets, const at::Tensor& dest);
// The box of the whole tensor `t` at `offsets` (empty: all of it) into `dest`.
void copy_read_box(const at::Tensor& t, const std::vector<int64_t>& offsets, at::Tensor& dest);

// Copies the part of `chunk`, a box of a larger tensor starting at `chunk_offsets`, that lies in
// the box of `dest` starting at `dest_offsets`, into `dest`; nothing when they do not meet.
// Returns the number of elements copied. For sources assembled from chunks (DCP's shards).
int64_t copy_box_overlap(const at::Tensor& chunk, const std::vector<int64_t>& chunk_offsets,
                         at::Tensor& dest, const std::vector<int64_t>& dest_offsets);

}  // namespace curv
