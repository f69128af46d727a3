// Folders written by torch.distributed.checkpoint (DCP: FSDP2, torchtitan, Accelerate and the
// Hugging Face Trainer under FSDP): a pickled .metadata and the shards __<rank>_<n>.distcp, read
// as a tensor source without running any code and without assembling more than one tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "curv/io/safetensors.h"
#include "curv/io/tensor_source.h"
#include "curv/io/torch_file.h"

namespace curv {

// One saved chunk of a tensor (one rank's shard): its box in the whole tensor and its bytes.
struct DcpChunk {
  std::vector<int64_t> offsets, sizes;
  std::string file;     // the shard's path
  uint64_t offset = 0;  // where the chunk's record starts in `file`
  uint64_t length = 0;  // its bytes
  bool safetensors =
      false;  // FileSystemWriter's SAFETENSORS format: a tensor of a blob at `offset`
};

// A DCP folder. Opening reads .metadata through the allow-list unpickler (curv/io/torch_file.h,
// extended by exactly the classes DCP writes: docs/checkpoints.md) and checks every tensor's
// chunks: each lies inside the tensor, none overlaps another, together they cover it, each has a
// record in a shard that exists and is long enough. Both storage formats of FileSystemWriter are
// read: torch.save records (the default) and SerializationFormat.SAFETENSORS. FormatError naming
// the folder's .metadata (or the shard), the key, the file and the offsets.
class DcpReader : public TensorSource {
 public:
  explicit DcpReader(const std::string& folder);

  // The tensors (TensorStorageMetadata), in .metadata's order.
  const std::vector<TensorEntry>& entries() const override { return entries_; }
  std::string origin() const override { return folder_; }
  // Reads the chunks that meet the box, one at a time, each copied into `dest` and released.
  void read_into(const std::string& name, const std::vector<int64_t>& offsets,
                 at::Tensor dest) const override;

  const std::string& folder() const { return folder_; }
  // The keys of the other entries (BytesStorageMetadata: numbers, strings, lists a writer saved
  // with torch.save, e.g. optimizer param_groups), in .metadata's order.
  const std::vector<std::string>& object_keys() const { return object_keys_; }
  bool has_object(const std::string& key) const;
  // The object saved under `key`, unpickled by load_torch_file's allow-list; FormatError naming
  // the shard and the key.
  PyValue::Ref object(const std::string& key) const;
  // A tensor's chunks, in .metadata's order.
  const std::vector<DcpChunk>& chunks(const std::string& name) const;
  // The shard files .metadata names, sorted.
  std::vector<std::string> shard_files() const;

 private:
  std::string folder_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::vector<DcpChunk>> chunks_;
  std::vector<std::string> object_keys_;
  std::map<std::string, DcpChunk> objects_;
  // The safetensors blobs opened so far, by (shard, offset): a shard holds many tensors, and its
  // header is parsed once, not once per tensor.
  mutable std::mutex blobs_mutex_;
  mutable std::map<std::pair<std::string, uint64_t>, std::shared_ptr<const SafetensorsReader>>
      blobs_;
};

// Whether `folder` holds a DCP save (a .metadata file). A folder without one is an incomplete save.
bool is_dcp_folder(const std::string& folder);

}  // namespace curv
