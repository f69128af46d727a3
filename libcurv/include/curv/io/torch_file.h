// Reading files written by torch.save (the zip format of PyTorch >= 1.6) without executing them:
// the pickle inside is interpreted by a small virtual machine that knows a fixed set of globals.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace curv {

// One value of an unpickled object tree. Lists, tuples and dicts hold shared references, so two
// keys that pickled the same object (a tied weight) refer to one PyValue.
struct PyValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,
    kTensor,
    kGlobal,
    kStorage,
    kObject
  };
  using Ref = std::shared_ptr<PyValue>;

  PyValue() = default;
  PyValue(const PyValue&) = default;
  PyValue& operator=(const PyValue&) = default;
  // Releases nested values iteratively: a pickle may nest a million levels deep.
  ~PyValue();

  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  // string, bytes, "module.name" of a global or of an object's class; of a tensor left in its
  // file (shape and dtype only, `tensor` undefined), its name in the source that reads it
  std::string text;
  std::vector<Ref> items;  // tuple, list
  // dict, in insertion order; an object's attributes (its pickled state when that is a dict)
  std::vector<std::pair<Ref, Ref>> entries;
  // Tensor: a contiguous CPU copy. Storage: its elements as a flat tensor. Undefined when the file
  // was read without tensors (then `shape` still holds the tensor's size).
  at::Tensor tensor;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::ScalarType::Undefined;

  bool is(Kind k) const { return kind == k; }
  // The entry of a dict (or attribute of an object) whose key is the string `key`, or nullptr
  // (also when this is neither).
  const PyValue* find(const std::string& key) const;
  // "dict", "int", "tensor", ... as in messages.
  std::string type_name() const;
  // A short rendering for messages: 3, 'text', tensor(float32, [2, 3]), dict(5 entries), ...;
  // containers show at most 5 items and 3 levels, so a cyclic list renders too.
  std::string brief() const { return brief_at(0); }
  std::string brief_at(int level) const;
};

struct TorchFileOptions {
  // false: tensors keep only their shape and dtype and no storage is read, for a quick look at a
  // checkpoint's metadata (iter_num, model_args).
  bool load_tensors = true;
  // Also the classes DeepSpeed's ZeRO checkpoints pickle (its loss scaler, ZeRO stage enum and
  // tensor-fragment addresses, read as plain values: docs/checkpoints.md#deepspeed-zero).
  bool deepspeed_classes = false;
};

// Unpickles `path`, a zip archive written by torch.save. Allowed globals (nothing else is looked
// up, nothing is ever called): collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// torch._utils._rebuild_parameter(_with_state), and the typed storages torch.FloatStorage,
// DoubleStorage, HalfStorage, BFloat16Storage, LongStorage, IntStorage, ShortStorage,
// CharStorage, ByteStorage, BoolStorage. Tensors come back contiguous with their view (offset,
// size, stride) applied; views of one storage read the same bytes. FormatError naming the file:
// not a zip (the legacy format gets a hint on re-saving), a corrupt archive, a big-endian archive,
// a storage shorter than its element count or a view outside its storage, a global outside the
// allow-list, an unknown opcode or a malformed pickle.
PyValue::Ref load_torch_file(const std::string& path, const TorchFileOptions& options = {});

// The same for an archive stored at bytes [offset, offset + length) of `path`, as
// torch.distributed.checkpoint writes each record of a shard (`origin` names it in messages).
PyValue::Ref load_torch_record(const std::string& path, uint64_t offset, uint64_t length,
                               const std::string& origin, const TorchFileOptions& options = {});

// The CRC-32 of the archive's central directory, which records every record's CRC-32 and size:
// a digest of the whole archive's content read from its last few kilobytes. FormatError naming
// the file when it is not a zip archive.
uint32_t torch_file_directory_crc(const std::string& path);

// The allowed globals, "module.name", for documentation and messages.
std::vector<std::string> allowed_torch_globals();

}  // namespace curv
