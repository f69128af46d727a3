// The pickle virtual machine behind load_torch_file (not public API): it interprets torch.save's
// data.pkl; the archive around it (torch_file.cpp) gives the storages' bytes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "curv/io/torch_file.h"

namespace curv {

// The allow-list: typed storages by global name, and the globals a REDUCE may call.
const std::map<std::string, at::ScalarType>& torch_storage_types();
const std::vector<std::string>& torch_callable_globals();

// A storage's elements as a flat tensor: record data/<key> of the archive, `numel` elements of
// `dtype` (`type_name` is the storage's global, for messages). FormatError naming the file.
using StorageReader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype,
                                               int64_t numel, const std::string& type_name)>;

// Which globals a pickle may name. kTorchSave: torch.save's (torch_callable_globals and the
// typed storages). kDcpMetadata: torch.distributed.checkpoint's .metadata, which adds exactly the
// classes DCP writes (dcp_metadata_classes: instances are kObject values holding their pickled
// state), torch.Size, the dtypes (torch.float32, ... as kGlobal values), torch.strided through
// torch.serialization._get_layout, the memory-format enum and pathlib's paths (as strings).
// kDeepSpeed: torch.save's and the classes DeepSpeed's ZeRO checkpoints pickle (deepspeed_classes:
// kObject values; an enum member holds its value), torch.Size, and
// torch._tensor._rebuild_from_type_v2 of a plain tensor.
enum class PickleGlobals { kTorchSave, kDcpMetadata, kDeepSpeed };

// The classes of PickleGlobals::kDcpMetadata and kDeepSpeed, "module.name".
const std::vector<std::string>& dcp_metadata_classes();
const std::vector<std::string>& deepspeed_classes();

// Values built by C++ code rather than a pickle (a layout assembling torch's optimizer.state_dict()
// form from other files' contents).
PyValue::Ref make_value(PyValue::Kind kind);
PyValue::Ref string_value(const std::string& text);
PyValue::Ref int_value(int64_t value);
PyValue::Ref tensor_value(const at::Tensor& tensor);

// Why the global `name` may not appear in a pickle read with `globals` ("" when it may).
std::string global_refusal(const std::string& name, PickleGlobals globals);

// Calls `fail`, which throws, for a malformed value.
using PickleFail = std::function<void(const std::string& why)>;
// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...): the view, checked to lie
// inside the storage, as a contiguous tensor (the storage itself when the view is all of it).
PyValue::Ref rebuild_tensor(const PyValue& args, const PickleFail& fail);

// What the classes and callables of kDcpMetadata and kDeepSpeed build; FormatError naming `path`.
namespace dcp_pickle {
bool callable(const std::string& name, PickleGlobals globals);
// NEWOBJ of an allowed class: a kObject value.
PyValue::Ref new_object(const std::string& path, const PyValue& cls, const PyValue& args,
                        PickleGlobals globals);
// BUILD: a dict of attributes, a (dict or None, slots dict) pair, or a class's state tuple.
void build_object(const std::string& path, PyValue& object, const PyValue::Ref& state);
// torch.Size (a tuple), _get_layout, _MEM_FORMAT_ENCODING, pathlib's paths (a string), an
// allowed class called (an enum member), _rebuild_from_type_v2 (the plain tensor).
PyValue::Ref reduce(const std::string& path, const std::string& name, const PyValue& args,
                    PickleGlobals globals);
}  // namespace dcp_pickle

// The object tree of `pickle` (the bytes of `path`'s data.pkl). Storages are read by
// `read_storage`; when it is empty, tensors keep only their shape and dtype. FormatError naming
// the file.
PyValue::Ref unpickle(const std::string& path, const std::string& pickle,
                      StorageReader read_storage,
                      PickleGlobals globals = PickleGlobals::kTorchSave);

}  // namespace curv
