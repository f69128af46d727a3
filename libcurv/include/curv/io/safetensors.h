// Reading and writing the safetensors format: the pickle-free tensor container through which
// checkpoints, probe vectors and spectra travel between libcurv, its tools and Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace curv {

// One tensor's header record, exactly as stored in the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // safetensors dtype tag: "F32", "BF16", "U16", "F8_E4M3", ...
  std::vector<int64_t> shape;   // empty for a 0-dim scalar
  uint64_t begin = 0, end = 0;  // byte range, relative to the data buffer after the header
};

// A safetensors file, memory-mapped read-only. The whole header is validated on open (dtypes,
// shapes, byte sizes, bounds, overlaps), so tensor() can only fail on a value that does not fit
// the torch dtype it is read into. Movable, not copyable.
//
// Dtypes without a LibTorch 1.13 counterpart are widened on read: U16 -> int32, U32 -> int64,
// U64 -> int64 (FormatError if a value exceeds INT64_MAX), F8_E4M3 (fn variant: no inf, 0x7F/0xFF
// are NaN) and F8_E5M2 -> float32. Other unknown dtypes are rejected on open.
class SafetensorsReader {
 public:
  // Throws FormatError naming `path` (and the tensor key and bad value, where there is one).
  // `offset`: where the safetensors data starts in the file (0 for a .safetensors file; DCP's
  // safetensors shards may hold other records before it).
  explicit SafetensorsReader(const std::string& path, uint64_t offset = 0);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in order of their data offset (ties by name).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const;
  // Throws FormatError naming the file and `name` when the file has no such tensor.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The optional "__metadata__" object (string -> string); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // An owning, contiguous CPU tensor: a copy out of the mapping, so it outlives the reader.
  at::Tensor tensor(const std::string& name) const;
  // The torch dtype tensor(name) returns (after the widening above), without reading it.
  at::ScalarType scalar_type(const std::string& name) const;
  // Drops the mapped pages of tensor `name` from this process's memory once it has been read, so
  // that reading a checkpoint tensor by tensor holds one tensor's pages at a time.
  void release(const std::string& name) const;
  // Every tensor, in names() order.
  std::vector<std::pair<std::string, at::Tensor>> tensors() const;

 private:
  void unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;  // the whole file, from mmap
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // the byte buffer after the header
  uint64_t data_size_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (and `metadata`) to `path` atomically: into PATH.tmp, fsync, then rename, so an
// existing file at `path` is either replaced whole or left untouched. Tensors are written as
// contiguous CPU data in the conventional order (element size descending, then name) after a
// header space-padded to a multiple of 8 bytes. Names must be unique, non-empty, valid UTF-8 and
// not "__metadata__"; dtypes must be float64/32/16, bfloat16, int64/32/16/8, uint8 or bool.
// Throws InvalidArgument for bad input, FormatError when the file cannot be written; both name
// `path`.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace curv
