#include "curv/io/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join lives here from fmt 11 on
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "core/fmt_torch.h"
#include "curv/core/error.h"
#include "io/float8.h"

// Tensor bytes are copied verbatim between memory and file, which is only right on a
// little-endian host (the format is little-endian).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

namespace curv {
namespace {

// A header longer than this is corruption, not a model: real headers are kilobytes to a few MB,
// and refusing early avoids handing a gigabyte of garbage to the JSON parser.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeInfo {
  const char* tag;
  size_t size;  // bytes per element
};

constexpr std::array<DtypeInfo, 15> kDtypes = {{{"BOOL", 1},
                                                {"U8", 1},
                                                {"I8", 1},
                                                {"F8_E4M3", 1},
                                                {"F8_E5M2", 1},
                                                {"I16", 2},
                                                {"U16", 2},
                                                {"F16", 2},
                                                {"BF16", 2},
                                                {"I32", 4},
                                                {"U32", 4},
                                                {"F32", 4},
                                                {"I64", 8},
                                                {"U64", 8},
                                                {"F64", 8}}};

const DtypeInfo* find_dtype(const std::string& tag) {
  for (const auto& info : kDtypes) {
    if (tag == info.tag) return &info;
  }
  return nullptr;
}

// The torch dtype a safetensors tag is read into without conversion; nullopt for the tags that
// need widening or decoding.
std::optional<at::ScalarType> direct_scalar_type(const std::string& tag) {
  if (tag == "F64") return at::kDouble;
  if (tag == "F32") return at::kFloat;
  if (tag == "F16") return at::kHalf;
  if (tag == "BF16") return at::kBFloat16;
  if (tag == "I64") return at::kLong;
  if (tag == "I32") return at::kInt;
  if (tag == "I16") return at::kShort;
  if (tag == "I8") return at::kChar;
  if (tag == "U8") return at::kByte;
  return std::nullopt;
}

// The safetensors tag for a writable torch dtype; nullptr when it cannot be written.
const char* write_tag(at::ScalarType type) {
  switch (type) {
    case at::kDouble:
      return "F64";
    case at::kFloat:
      return "F32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kShort:
      return "I16";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      return nullptr;
  }
}

template <typename T>
T load_le(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // unaligned-safe; host is little-endian (see above)
  return value;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw FormatError(fmt::format("{}: {}", path, what));
}

[[noreturn]] void fail_key(const std::string& path, const std::string& key,
                           const std::string& what) {
  throw FormatError(fmt::format("{}: tensor '{}': {}", path, key, what));
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& key,
                             const nlohmann::json& value, uint64_t data_size) {
  if (!value.is_object()) {
    fail_key(path, key, fmt::format("header entry must be an object, got {}", value.dump()));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) fail_key(path, key, fmt::format("missing \"{}\"", field));
  }
  SafetensorsEntry entry;
  entry.name = key;

  const auto& dtype = value.at("dtype");
  if (!dtype.is_string())
    fail_key(path, key, fmt::format("dtype must be a string, got {}", dtype.dump()));
  entry.dtype = dtype.get<std::string>();
  const DtypeInfo* info = find_dtype(entry.dtype);
  if (!info) fail_key(path, key, fmt::format("unknown or unsupported dtype '{}'", entry.dtype));

  const auto& shape = value.at("shape");
  if (!shape.is_array())
    fail_key(path, key, fmt::format("shape must be an array, got {}", shape.dump()));
  bool has_zero = false;
  for (const auto& dim : shape) {
    if (!dim.is_number_integer()) {
      fail_key(path, key,
               fmt::format("shape {} has a non-integer dimension {}", shape.dump(), dim.dump()));
    }
    if (dim.is_number_unsigned()) {
      const auto d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_key(path, key,
                 fmt::format("shape {} has a dimension {} beyond int64", shape.dump(), d));
      }
      entry.shape.push_back(static_cast<int64_t>(d));
    } else {
      const auto d = dim.get<int64_t>();
      if (d < 0)
        fail_key(path, key, fmt::format("shape {} has a negative dimension {}", shape.dump(), d));
      entry.shape.push_back(d);
    }
    has_zero = has_zero || entry.shape.back() == 0;
  }

  const auto& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail_key(path, key,
             fmt::format("data_offsets must be [begin, end] of non-negative integers, got {}",
                         offsets.dump()));
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    fail_key(path, key,
             fmt::format("data_offsets [{}, {}] have begin > end", entry.begin, entry.end));
  }
  if (entry.end > data_size) {
    fail_key(path, key,
             fmt::format("data_offsets end {} is past the end of the data buffer ({} bytes)",
                         entry.end, data_size));
  }

  // Expected byte count, with overflow checks: a corrupt shape could otherwise wrap around to
  // match the byte range. A zero dimension makes the tensor empty whatever the others are.
  uint64_t bytes = info->size;
  bool overflow = false;
  if (has_zero) {
    bytes = 0;
  } else {
    for (int64_t d : entry.shape) {
      overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    }
  }
  if (overflow || bytes != entry.end - entry.begin) {
    fail_key(path, key,
             fmt::format("shape {} of dtype {} needs {} bytes, but data_offsets [{}, {}] hold {}",
                         shape_string(entry.shape), entry.dtype,
                         overflow ? std::string("more than 2^64") : std::to_string(bytes),
                         entry.begin, entry.end, entry.end - entry.begin));
  }
  return entry;
}

// Closes a file descriptor on every exit path.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path, uint64_t offset) : path_(path) {
  // O_NONBLOCK so that a FIFO given by mistake is refused below instead of blocking open().
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, fmt::format("cannot open safetensors file: {}", std::strerror(errno)));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory, not a safetensors file");
  if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file");
  if (static_cast<uint64_t>(st.st_size) < offset) {
    fail(path, fmt::format("file is {} bytes, too short for a safetensors blob at byte {}",
                           st.st_size, offset));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size) - offset;
  if (file_size < 8) {
    fail(path, fmt::format("file is {} bytes, too short for the 8-byte header length of a "
                           "safetensors file",
                           file_size));
  }
  // mmap's offset must be a multiple of the page size: map from the page the blob starts in.
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t skip = offset % page;
  void* map = ::mmap(nullptr, file_size + skip, PROT_READ, MAP_PRIVATE, fd,
                     static_cast<off_t>(offset - skip));
  if (map == MAP_FAILED) fail(path, fmt::format("cannot mmap: {}", std::strerror(errno)));
  map_ = map;
  map_size_ = file_size + skip;

  try {
    const auto* bytes = static_cast<const uint8_t*>(map_) + skip;
    const auto header_size = load_le<uint64_t>(bytes);
    if (header_size > kMaxHeaderBytes) {
      fail(path, fmt::format("header length {} is absurd (limit {} bytes); not a safetensors file?",
                             header_size, kMaxHeaderBytes));
    }
    if (header_size > file_size - 8) {
      fail(path, fmt::format("header length {} runs past the end of the file ({} bytes)",
                             header_size, file_size));
    }
    data_ = bytes + 8 + header_size;
    data_size_ = file_size - 8 - header_size;

    // nlohmann keeps the last of duplicate keys silently; a duplicated tensor name would make
    // the file mean two things, so the parser callback records it.
    std::set<std::string> seen;
    std::string duplicate;
    auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && duplicate.empty()) {
        auto key = parsed.get<std::string>();
        if (!seen.insert(key).second) duplicate = std::move(key);
      }
      return true;
    };
    const auto* text = reinterpret_cast<const char*>(bytes + 8);
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text, text + header_size, on_event);
    } catch (const nlohmann::json::exception& e) {
      fail(path, fmt::format("header is not valid JSON: {}", e.what()));
    }
    if (!header.is_object()) {
      fail(path, fmt::format("header must be a JSON object, got {}", header.type_name()));
    }
    if (!duplicate.empty()) fail_key(path, duplicate, "appears twice in the header");

    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        if (!value.is_object()) {
          fail(path,
               fmt::format("{} must be an object of strings, got {}", kMetadataKey, value.dump()));
        }
        for (const auto& [meta_key, meta_value] : value.items()) {
          if (!meta_value.is_string()) {
            fail(path, fmt::format("{} key '{}' must map to a string, got {}", kMetadataKey,
                                   meta_key, meta_value.dump()));
          }
          metadata_[meta_key] = meta_value.get<std::string>();
        }
        continue;
      }
      entries_[key] = parse_entry(path, key, value, data_size_);
    }

    std::vector<const SafetensorsEntry*> order;
    for (const auto& [key, entry] : entries_) order.push_back(&entry);
    std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
      return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
    });
    // Gaps between tensors are accepted (some writers align); overlaps are not, since writing
    // one tensor would then change another. Empty ranges overlap nothing.
    const SafetensorsEntry* previous = nullptr;
    for (const auto* entry : order) {
      names_.push_back(entry->name);
      if (entry->begin == entry->end) continue;
      if (previous && entry->begin < previous->end) {
        fail(path,
             fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", previous->name,
                         previous->begin, previous->end, entry->name, entry->begin, entry->end));
      }
      if (!previous || entry->end > previous->end) previous = entry;
    }
  } catch (...) {
    unmap();  // the destructor does not run for a constructor that throws
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() { unmap(); }

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      data_size_(std::exchange(other.data_size_, 0)),
      entries_(std::move(other.entries_)),
      names_(std::move(other.names_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    data_size_ = std::exchange(other.data_size_, 0);
    entries_ = std::move(other.entries_);
    names_ = std::move(other.names_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsReader::unmap() noexcept {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  data_ = nullptr;
  data_size_ = 0;
}

bool SafetensorsReader::contains(const std::string& name) const { return entries_.count(name) > 0; }

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_key(path_, name, "no such tensor in the file");
  return it->second;
}

namespace {

// memcpy in 256 KiB chunks on ATen's intra-op threads: out of a file's mapping in a warm page
// cache, one thread copies about 3 GB/s, several as fast as the memory allows. The chunks are
// small enough that a transformer layer's matrix (a few MB) keeps 16 threads busy.
void parallel_copy(void* dst, const uint8_t* src, size_t n) {
  constexpr size_t kChunk = size_t{256} << 10;
  if (n <= kChunk) {
    std::memcpy(dst, src, n);
    return;
  }
  // Ask the kernel to read the whole range ahead: threads faulting on pages of their own chunks
  // would otherwise defeat its sequential read-ahead on a cold page cache.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(src) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(first), reinterpret_cast<uintptr_t>(src) + n - first,
            MADV_WILLNEED);
  auto* out = static_cast<uint8_t*>(dst);
  const auto chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t at = static_cast<size_t>(c) * kChunk;
      std::memcpy(out + at, src + at, std::min(kChunk, n - at));
    }
  });
}

}  // namespace

at::ScalarType SafetensorsReader::scalar_type(const std::string& name) const {
  const std::string& tag = entry(name).dtype;
  if (auto type = direct_scalar_type(tag)) return *type;
  if (tag == "BOOL") return at::kBool;
  if (tag == "U16") return at::kInt;
  if (tag == "U32" || tag == "U64") return at::kLong;
  return at::kFloat;  // F8_E4M3, F8_E5M2
}

void SafetensorsReader::release(const std::string& name) const {
  // The whole pages inside the tensor's bytes; the mapping is private and read-only, so
  // dropping them loses nothing (a later read faults them in again).
  const SafetensorsEntry& e = entry(name);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_ + e.begin);
  const auto end = reinterpret_cast<uintptr_t>(data_ + e.end);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

at::Tensor SafetensorsReader::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const uint8_t* src = data_ + e.begin;
  const size_t nbytes = e.end - e.begin;

  if (auto type = direct_scalar_type(e.dtype)) {
    at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(*type));
    if (nbytes > 0) parallel_copy(out.data_ptr(), src, nbytes);
    return out;
  }
  if (e.dtype == "BOOL") {
    // Via uint8 so that a byte other than 0/1 becomes true instead of an invalid bool.
    at::Tensor raw = at::empty(e.shape, at::TensorOptions().dtype(at::kByte));
    if (nbytes > 0) std::memcpy(raw.data_ptr(), src, nbytes);
    return raw.ne(0);
  }
  if (e.dtype == "U16") {
    at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(at::kInt));
    auto* dst = out.data_ptr<int32_t>();
    for (size_t i = 0; i < nbytes / 2; ++i) dst[i] = load_le<uint16_t>(src + 2 * i);
    return out;
  }
  if (e.dtype == "U32") {
    at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(at::kLong));
    auto* dst = out.data_ptr<int64_t>();
    for (size_t i = 0; i < nbytes / 4; ++i) dst[i] = load_le<uint32_t>(src + 4 * i);
    return out;
  }
  if (e.dtype == "U64") {
    at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(at::kLong));
    auto* dst = out.data_ptr<int64_t>();
    for (size_t i = 0; i < nbytes / 8; ++i) {
      const auto v = load_le<uint64_t>(src + 8 * i);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_key(
            path_, name,
            fmt::format("U64 value {} at flat index {} exceeds the int64 range it is read into", v,
                        i));
      }
      dst[i] = static_cast<int64_t>(v);
    }
    return out;
  }
  if (e.dtype == "F8_E4M3" || e.dtype == "F8_E5M2") {
    const Float8Table& table = float8_table(e.dtype == "F8_E4M3");
    at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(at::kFloat));
    auto* dst = out.data_ptr<float>();
    for (size_t i = 0; i < nbytes; ++i) dst[i] = table[src[i]];
    return out;
  }
  // Unreachable: the constructor rejects every tag not handled above.
  fail_key(path_, name, fmt::format("unsupported dtype '{}'", e.dtype));
}

std::vector<std::pair<std::string, at::Tensor>> SafetensorsReader::tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(names_.size());
  for (const auto& name : names_) out.emplace_back(name, tensor(name));
  return out;
}

namespace {

[[noreturn]] void invalid(const std::string& path, const std::string& what) {
  throw InvalidArgument(fmt::format("{}: cannot write safetensors: {}", path, what));
}

// Removes the temporary file unless the write was committed by the rename.
struct TempFile {
  std::string path;
  int fd = -1;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed) ::unlink(path.c_str());
  }
};

void write_all(const std::string& path, const TempFile& tmp, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(tmp.fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, fmt::format("cannot write {}: {}", tmp.path, std::strerror(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  struct Item {
    std::string name;
    at::Tensor data;  // contiguous CPU
    const char* tag;
    size_t element_size;
  };
  // Everything is validated and converted before the temporary file exists, so bad input
  // never touches the disk.
  std::vector<Item> items;
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, tensor] = tensors[i];
    if (name.empty()) invalid(path, fmt::format("tensor #{} has an empty name", i));
    if (name == kMetadataKey) invalid(path, fmt::format("tensor name '{}' is reserved", name));
    if (!seen.insert(name).second) invalid(path, fmt::format("duplicate tensor name '{}'", name));
    if (!tensor.defined()) invalid(path, fmt::format("tensor '{}' is undefined", name));
    if (tensor.layout() != at::kStrided) {
      invalid(path,
              fmt::format("tensor '{}' is not dense (layout {})", name, c10::str(tensor.layout())));
    }
    const char* tag = write_tag(tensor.scalar_type());
    if (!tag) {
      invalid(path, fmt::format("tensor '{}' has dtype {}, which cannot be written (supported: "
                                "float64/32/16, bfloat16, int64/32/16/8, uint8, bool)",
                                name, c10::toString(tensor.scalar_type())));
    }
    items.push_back({name, tensor.detach().to(at::kCPU).contiguous(), tag,
                     static_cast<size_t>(tensor.element_size())});
  }
  // The conventional order: widest elements first keeps every tensor aligned to its element
  // size in the data buffer (given the 8-byte-padded header), which lets readers map in place.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.element_size != b.element_size) return a.element_size > b.element_size;
    return a.name < b.name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& item : items) {
    const uint64_t nbytes = item.data.numel() * item.element_size;
    header[item.name] = {{"dtype", item.tag},
                         {"shape", item.data.sizes().vec()},
                         {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    invalid(path,
            fmt::format("a tensor name or metadata string is not valid UTF-8 ({})", e.what()));
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  TempFile tmp;
  tmp.path = path + ".tmp";
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (tmp.fd < 0) fail(path, fmt::format("cannot create {}: {}", tmp.path, std::strerror(errno)));

  const uint64_t header_size = header_text.size();
  write_all(path, tmp, &header_size, sizeof header_size);  // little-endian host
  write_all(path, tmp, header_text.data(), header_text.size());
  for (const auto& item : items) {
    const size_t nbytes = item.data.numel() * item.element_size;
    if (nbytes > 0) write_all(path, tmp, item.data.data_ptr(), nbytes);
  }
  // fsync before rename: otherwise a crash could leave the new name pointing at a file whose
  // data never reached the disk.
  if (::fsync(tmp.fd) != 0)
    fail(path, fmt::format("cannot fsync {}: {}", tmp.path, std::strerror(errno)));
  const int fd = std::exchange(tmp.fd, -1);
  if (::close(fd) != 0)
    fail(path, fmt::format("cannot close {}: {}", tmp.path, std::strerror(errno)));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) {
    fail(path, fmt::format("cannot rename {} to {}: {}", tmp.path, path, std::strerror(errno)));
  }
  tmp.committed = true;
}

}  // namespace curv
