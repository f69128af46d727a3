// torch.distributed.checkpoint folders: .metadata unpickled and checked, chunks read from the
// __<rank>_<n>.distcp shards in either storage format.
#include "curv/io/dcp.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/strings.h"
#include "curv/core/error.h"
#include "curv/io/safetensors.h"
#include "io/builtin_layouts.h"
#include "io/torch_pickle.h"

namespace curv {

namespace {

namespace fs = std::filesystem;
using Kind = PyValue::Kind;

constexpr const char* kMetadataFile = ".metadata";

// Reads the checked pieces of .metadata's object tree; every message names the file.
class MetadataWalker {
 public:
  explicit MetadataWalker(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError(fmt::format("{}: {}", path_, why));
  }
  const PyValue& object(const PyValue& v, const std::string& cls, const std::string& what) const {
    if (!v.is(Kind::kObject) || v.text.substr(v.text.rfind('.') + 1) != cls) {
      fail(fmt::format("{} is {}, expected a {}", what, v.brief(), cls));
    }
    return v;
  }
  const PyValue& attribute(const PyValue& v, const std::string& key,
                           const std::string& what) const {
    const PyValue* a = v.find(key);
    if (a == nullptr) fail(fmt::format("{} has no '{}'", what, key));
    return *a;
  }
  std::vector<int64_t> ints(const PyValue& v, const std::string& what) const {
    if (!v.is(Kind::kTuple) && !v.is(Kind::kList)) {
      fail(fmt::format("{} is {}, expected a tuple of integers", what, v.brief()));
    }
    std::vector<int64_t> out;
    for (const auto& item : v.items) {
      if (!item->is(Kind::kInt)) fail(fmt::format("{} holds {}", what, item->brief()));
      out.push_back(item->integer);
    }
    return out;
  }
  at::ScalarType dtype(const PyValue& properties, const std::string& key) const {
    // TensorProperties pickles a tuple (dtype, layout, requires_grad, memory_format, pin_memory,
    // ...); older writers pickled its attributes.
    const PyValue* d =
        properties.items.empty() ? properties.find("dtype") : properties.items.front().get();
    static const std::map<std::string, at::ScalarType> types = {
        {"torch.float64", at::kDouble}, {"torch.float32", at::kFloat},
        {"torch.float16", at::kHalf},   {"torch.bfloat16", at::kBFloat16},
        {"torch.int64", at::kLong},     {"torch.int32", at::kInt},
        {"torch.int16", at::kShort},    {"torch.int8", at::kChar},
        {"torch.uint8", at::kByte},     {"torch.bool", at::kBool}};
    if (d == nullptr || !d->is(Kind::kGlobal) || !types.count(d->text)) {
      fail(fmt::format("'{}': dtype {} is not one libcurv reads", key, d ? d->brief() : "missing"));
    }
    return types.at(d->text);
  }

 private:
  std::string path_;
};

std::string box_string(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
  return fmt::format("offsets {} sizes {}", shape_string(offsets), shape_string(sizes));
}

// FormatError unless `chunks` tile the tensor `e` exactly: inside it, disjoint, covering it.
void check_tiling(const std::string& meta, const TensorEntry& e,
                  const std::vector<DcpChunk>& chunks) {
  int64_t covered = 0;
  for (const auto& c : chunks) {
    bool inside = c.offsets.size() == e.shape.size() && c.sizes.size() == e.shape.size();
    int64_t volume = 1;
    for (size_t d = 0; inside && d < e.shape.size(); ++d) {
      inside = c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] <= e.shape[d] &&
               c.sizes[d] <= e.shape[d] - c.offsets[d];
      volume *= c.sizes[d];
    }
    if (!inside) {
      throw FormatError(fmt::format("{}: '{}' of shape {}: the chunk at {} in {} lies outside it",
                                    meta, e.name, shape_string(e.shape),
                                    box_string(c.offsets, c.sizes), c.file));
    }
    covered += volume;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (size_t j = i + 1; j < chunks.size(); ++j) {
      const auto &a = chunks[i], &b = chunks[j];
      bool meet = true;
      for (size_t d = 0; meet && d < e.shape.size(); ++d) {
        meet = std::max(a.offsets[d], b.offsets[d]) <
               std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
      }
      if (meet && a.sizes != std::vector<int64_t>(a.sizes.size(), 0)) {
        throw FormatError(fmt::format("{}: '{}': the chunks at {} in {} and at {} in {} overlap",
                                      meta, e.name, box_string(a.offsets, a.sizes), a.file,
                                      box_string(b.offsets, b.sizes), b.file));
      }
    }
  }
  if (covered != e.numel()) {
    std::vector<std::string> listed;
    for (const auto& c : chunks) listed.push_back(box_string(c.offsets, c.sizes) + " in " + c.file);
    throw FormatError(fmt::format(
        "{}: '{}' of shape {}: its {} chunk(s) cover {} of its {} elements, leaving a gap ({})",
        meta, e.name, shape_string(e.shape), chunks.size(), covered, e.numel(),
        join(listed, "; ")));
  }
}

std::string chunk_origin(const std::string& key, const DcpChunk& c) {
  return fmt::format("{} ['{}' at {}]", c.file, key, shape_string(c.offsets));
}

}  // namespace

bool is_dcp_folder(const std::string& folder) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(folder) / kMetadataFile, ec);
}

DcpReader::DcpReader(const std::string& folder) : folder_(folder) {
  const std::string meta = (fs::path(folder) / kMetadataFile).string();
  const PyValue::Ref root =
      unpickle(meta, read_text_file(meta), nullptr, PickleGlobals::kDcpMetadata);
  const MetadataWalker walk(meta);
  walk.object(*root, "Metadata", "the pickled object");
  const PyValue& tensors = walk.attribute(*root, "state_dict_metadata", "Metadata");
  const PyValue& storage = walk.attribute(*root, "storage_data", "Metadata");
  if (!tensors.is(Kind::kDict) || !storage.is(Kind::kDict)) {
    walk.fail("state_dict_metadata and storage_data must be dicts");
  }
  // storage_data: MetadataIndex(fqn, offset, index) → _StorageInfo(relative_path, offset, length).
  std::map<std::pair<std::string, std::vector<int64_t>>, DcpChunk> records;
  for (const auto& [index, info] : storage.entries) {
    walk.object(*index, "MetadataIndex", "a storage_data key");
    walk.object(*info, "_StorageInfo", "a storage_data value");
    const PyValue& fqn = walk.attribute(*index, "fqn", "MetadataIndex");
    // Bytes entries have no offset (None, or left out of the pickled state).
    const PyValue* at = index->find("offset");
    const PyValue& file = walk.attribute(*info, "relative_path", "_StorageInfo");
    const PyValue& offset = walk.attribute(*info, "offset", "_StorageInfo");
    const PyValue& length = walk.attribute(*info, "length", "_StorageInfo");
    if (!fqn.is(Kind::kString) || !file.is(Kind::kString) || !offset.is(Kind::kInt) ||
        !length.is(Kind::kInt) || offset.integer < 0 || length.integer < 0) {
      walk.fail(fmt::format("storage record {} → {} is malformed", index->brief(), info->brief()));
    }
    if (const PyValue* t = info->find("transform_descriptors"); t && !t->is(Kind::kNone)) {
      walk.fail(
          fmt::format("'{}' is stored through transforms {} (compressed or encrypted), "
                      "which libcurv does not read",
                      fqn.text, t->brief()));
    }
    if (file.text.find('/') != std::string::npos || file.text.empty() || file.text[0] == '.') {
      walk.fail(
          fmt::format("'{}': shard '{}' is not a file name in the folder", fqn.text, file.text));
    }
    DcpChunk c;
    c.file = (fs::path(folder) / file.text).string();
    c.offset = static_cast<uint64_t>(offset.integer);
    c.length = static_cast<uint64_t>(length.integer);
    const std::vector<int64_t> box = at == nullptr || at->is(Kind::kNone)
                                         ? std::vector<int64_t>{}
                                         : walk.ints(*at, "MetadataIndex.offset");
    records[{fqn.text, box}] = c;
  }
  // Every shard must exist and hold every record that .metadata places in it.
  std::map<std::string, uint64_t> sizes;
  auto check_record = [&](const std::string& key, const DcpChunk& c) {
    auto it = sizes.find(c.file);
    if (it == sizes.end()) {
      std::error_code ec;
      const auto size = fs::file_size(c.file, ec);
      if (ec) {
        throw FormatError(fmt::format("{}: '{}' is stored in {}, which {}", meta, key, c.file,
                                      fs::exists(c.file) ? "cannot be read" : "does not exist"));
      }
      it = sizes.emplace(c.file, size).first;
    }
    if (c.offset > it->second || c.length > it->second - c.offset) {
      throw FormatError(
          fmt::format("{}: '{}' is stored at bytes {} to {}, beyond its end ({} bytes; "
                      "truncated shard?)",
                      c.file, key, c.offset, c.offset + c.length, it->second));
    }
  };
  for (const auto& [key, value] : tensors.entries) {
    if (!key->is(Kind::kString)) walk.fail("a state_dict_metadata key is not a string");
    const std::string& name = key->text;
    if (value->is(Kind::kObject) && value->text.size() >= 20 &&
        value->text.substr(value->text.rfind('.') + 1) == "BytesStorageMetadata") {
      const auto it = records.find({name, {}});
      if (it == records.end()) walk.fail(fmt::format("'{}' has no storage record", name));
      check_record(name, it->second);
      object_keys_.push_back(name);
      objects_[name] = it->second;
      continue;
    }
    walk.object(*value, "TensorStorageMetadata", fmt::format("'{}'", name));
    TensorEntry e;
    e.name = name;
    e.dtype = walk.dtype(walk.attribute(*value, "properties", name), name);
    e.shape = walk.ints(walk.attribute(*value, "size", name), fmt::format("'{}' size", name));
    const PyValue& list = walk.attribute(*value, "chunks", name);
    if (!list.is(Kind::kList)) walk.fail(fmt::format("'{}' chunks is {}", name, list.brief()));
    std::vector<DcpChunk> chunks;
    for (const auto& item : list.items) {
      walk.object(*item, "ChunkStorageMetadata", fmt::format("a chunk of '{}'", name));
      const auto offsets = walk.ints(walk.attribute(*item, "offsets", name), name + " offsets");
      const auto sizes_ = walk.ints(walk.attribute(*item, "sizes", name), name + " sizes");
      const auto it = records.find({name, offsets});
      if (it == records.end()) {
        walk.fail(fmt::format("'{}': the chunk at {} has no storage record", name,
                              shape_string(offsets)));
      }
      DcpChunk c = it->second;
      c.offsets = offsets;
      c.sizes = sizes_;
      chunks.push_back(c);
    }
    check_tiling(meta, e, chunks);
    for (const auto& c : chunks) check_record(name, c);
    entries_.push_back(e);
    chunks_[name] = std::move(chunks);
  }
  // FileSystemWriter(serialization_format=SAFETENSORS) writes a file's tensors as one
  // safetensors blob after its other records; every tensor record of that file starts where the
  // blob does. The default format writes each record as a torch.save archive ("PK\3\4").
  for (auto& [name, chunks] : chunks_) {
    for (auto& c : chunks) {
      char head[4] = {};
      std::ifstream in(c.file, std::ios::binary);
      in.seekg(static_cast<std::streamoff>(c.offset));
      in.read(head, 4);
      c.safetensors = !(in.gcount() == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0);
    }
  }
}

bool DcpReader::has_object(const std::string& key) const { return objects_.count(key) > 0; }

PyValue::Ref DcpReader::object(const std::string& key) const {
  const auto it = objects_.find(key);
  if (it == objects_.end()) {
    throw InvalidArgument(fmt::format("{}: no object '{}' in .metadata", folder_, key));
  }
  const DcpChunk& c = it->second;
  return load_torch_record(c.file, c.offset, c.length, fmt::format("{} ['{}']", c.file, key));
}

const std::vector<DcpChunk>& DcpReader::chunks(const std::string& name) const {
  const auto it = chunks_.find(name);
  if (it == chunks_.end()) throw InvalidArgument(fmt::format("{}: no tensor '{}'", folder_, name));
  return it->second;
}

std::vector<std::string> DcpReader::shard_files() const {
  std::set<std::string> files;
  for (const auto& [name, chunks] : chunks_) {
    for (const auto& c : chunks) files.insert(c.file);
  }
  for (const auto& [name, c] : objects_) files.insert(c.file);
  return {files.begin(), files.end()};
}

void DcpReader::read_into(const std::string& name, const std::vector<int64_t>& offsets,
                          at::Tensor dest) const {
  const TensorEntry* e = find(name);
  if (e == nullptr) throw InvalidArgument(fmt::format("{}: no tensor '{}'", folder_, name));
  const std::vector<int64_t> at =
      offsets.empty() ? std::vector<int64_t>(e->shape.size(), 0) : offsets;
  bool inside = dest.dim() == static_cast<int64_t>(e->shape.size()) && at.size() == e->shape.size();
  for (size_t d = 0; inside && d < at.size(); ++d) {
    inside = at[d] >= 0 && at[d] + dest.size(static_cast<int64_t>(d)) <= e->shape[d];
  }
  if (!inside) {
    throw InvalidArgument(fmt::format(
        "{}: tensor '{}' of shape {}: the box at {} of size {} does "
        "not lie inside it",
        folder_, name, shape_string(e->shape), shape_string(at), shape_string(dest.sizes().vec())));
  }
  int64_t copied = 0;
  for (const auto& c : chunks(name)) {
    bool meets = true;
    for (size_t d = 0; meets && d < at.size(); ++d) {
      meets = std::max(c.offsets[d], at[d]) <
              std::min(c.offsets[d] + c.sizes[d], at[d] + dest.size(static_cast<int64_t>(d)));
    }
    if (!meets && e->numel() > 0) continue;
    const std::string origin = chunk_origin(name, c);
    at::Tensor chunk;
    if (c.safetensors) {
      std::shared_ptr<const SafetensorsReader> reader;
      {
        const std::lock_guard<std::mutex> lock(blobs_mutex_);
        auto& cached = blobs_[{c.file, c.offset}];
        if (!cached) cached = std::make_shared<const SafetensorsReader>(c.file, c.offset);
        reader = cached;
      }
      chunk = reader->tensor(name);
      reader->release(name);
    } else {
      const PyValue::Ref v = load_torch_record(c.file, c.offset, c.length, origin);
      if (!v->is(Kind::kTensor)) {
        throw FormatError(fmt::format("{}: holds {}, expected a tensor", origin, v->brief()));
      }
      chunk = v->tensor;
    }
    if (chunk.sizes().vec() != c.sizes || chunk.scalar_type() != e->dtype) {
      throw FormatError(fmt::format("{}: holds a {} tensor of shape {}; .metadata says {} {}",
                                    origin, c10::toString(chunk.scalar_type()),
                                    shape_string(chunk.sizes().vec()), c10::toString(e->dtype),
                                    shape_string(c.sizes)));
    }
    copied += copy_box_overlap(chunk, c.offsets, dest, at);
  }
  if (copied != dest.numel()) {
    throw FormatError(
        fmt::format("{}: tensor '{}': its chunks filled {} of the {} elements asked "
                    "for",
                    folder_, name, copied, dest.numel()));
  }
}

}  // namespace curv
