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

// The object tree of `pickle` (the bytes of `path`'s data.pkl). Storages are read by
// `read_storage`; when it is empty, tensors keep only their shape and dtype. FormatError naming
// the file.
PyValue::Ref unpickle(const std::string& path, const std::string& pickle,
                      StorageReader read_storage);

}  // namespace curv
