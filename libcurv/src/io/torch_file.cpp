#include "curv/io/torch_file.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/strings.h"
#include "curv/core/error.h"
#include "io/torch_pickle.h"

namespace curv {

const std::map<std::string, at::ScalarType>& torch_storage_types() {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat}, {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},   {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool},
  };
  return types;
}

const std::vector<std::string>& torch_callable_globals() {
  static const std::vector<std::string> names = {
      "collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
      "pytorch_optimizer.optimizer.scion.LMONorm"};
  return names;
}

namespace {

// CRC-32 of `size` bytes in chunks on ATen's intra-op threads, joined with crc32_combine: the
// check of a large record costs its share of the read, not a multiple of it.
uLong parallel_crc32(const Bytef* p, size_t size) {
  constexpr size_t kChunk = size_t{8} << 20;  // also below crc32's 32-bit length
  const auto chunks = static_cast<int64_t>((size + kChunk - 1) / kChunk);
  std::vector<uLong> crcs(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t at = static_cast<size_t>(c) * kChunk;
      const auto n = static_cast<uInt>(std::min(kChunk, size - at));
      crcs[static_cast<size_t>(c)] = crc32(crc32(0L, Z_NULL, 0), p + at, n);
    }
  });
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t at = static_cast<size_t>(c) * kChunk;
    crc = crc32_combine(crc, crcs[static_cast<size_t>(c)],
                        static_cast<z_off_t>(std::min(kChunk, size - at)));
  }
  return crc;
}

using Ref = PyValue::Ref;
using Kind = PyValue::Kind;

// `length` bytes of a file from `offset` (the whole file, or one record of a DCP shard), read with
// pread: what LibTorch's archive reader and the checksums read, and nothing more.
class FileRange : public caffe2::serialize::ReadAdapterInterface {
 public:
  FileRange(const std::string& path, uint64_t offset, std::optional<uint64_t> length)
      : path_(path), offset_(offset) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw FormatError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ::close(fd_);
      throw FormatError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
    }
    const auto file_size = static_cast<uint64_t>(st.st_size);
    if (offset > file_size || (length && *length > file_size - offset)) {
      ::close(fd_);
      throw FormatError(
          fmt::format("{}: bytes {} to {} lie beyond the end of the file ({} bytes; "
                      "truncated file?)",
                      path, offset, offset + length.value_or(0), file_size));
    }
    size_ = length ? *length : file_size - offset;
  }
  ~FileRange() override { ::close(fd_); }
  FileRange(const FileRange&) = delete;
  FileRange& operator=(const FileRange&) = delete;

  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    if (pos >= size_) return 0;
    n = std::min<uint64_t>(n, size_ - pos);
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, static_cast<char*>(buf) + done, n - done,
                                  static_cast<off_t>(offset_ + pos + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }
  // Exactly `n` bytes at `pos`; FormatError naming the file otherwise.
  std::string bytes(uint64_t pos, uint64_t n, const char* what) const {
    std::string out(n, '\0');
    if (pos > size_ || n > size_ - pos || read(pos, out.data(), n) != n) {
      throw FormatError(fmt::format("{}: zip archive: cannot read the {}", path_, what));
    }
    return out;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t offset_;
  uint64_t size_ = 0;
  int fd_ = -1;
};

// The CRC-32 of every record of a zip archive, from its central directory, by the name below the
// archive's top folder ("data.pkl", "data/0"). torch.save writes a CRC-32 for every record and
// LibTorch's reader does not check it, so a flipped bit inside a tensor would load silently.
class ZipChecksums {
 public:
  // `origin` names the archive in messages (the file, or the file and record of a DCP shard).
  ZipChecksums(const FileRange& in, const std::string& origin) : path_(origin) {
    const uint64_t size = in.size();
    // The end-of-central-directory record: 22 bytes and a comment of up to 65535.
    const uint64_t tail_size = std::min<uint64_t>(size, 22 + 65535 + 20);
    const std::string tail = in.bytes(size - tail_size, tail_size, "end of the archive");
    size_t eocd = std::string::npos;
    for (size_t i = tail.size() >= 22 ? tail.size() - 22 + 1 : 0; i-- > 0;) {
      if (u32(tail, i) == 0x06054b50) {
        eocd = i;
        break;
      }
    }
    if (eocd == std::string::npos) fail("no end-of-central-directory record (truncated file?)");
    uint64_t entries = u16(tail, eocd + 10), cd_size = u32(tail, eocd + 12);
    uint64_t cd_offset = u32(tail, eocd + 16);
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
      // ZIP64: a locator just before the record points at the ZIP64 end record.
      if (eocd < 20 || u32(tail, eocd - 20) != 0x07064b50) fail("no ZIP64 end-record locator");
      const std::string end64 = in.bytes(u64(tail, eocd - 20 + 8), 56, "ZIP64 end record");
      if (u32(end64, 0) != 0x06064b50) fail("no ZIP64 end-of-central-directory record");
      entries = u64(end64, 32);
      cd_size = u64(end64, 40);
      cd_offset = u64(end64, 48);
    }
    if (cd_offset > size || cd_size > size - cd_offset) fail("central directory out of the file");
    const std::string cd = in.bytes(cd_offset, cd_size, "central directory");
    // The central directory records every entry's CRC-32 and sizes: its own CRC is a digest of
    // the archive's content that costs one small read.
    directory_crc_ =
        static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(cd.data()),
                                    static_cast<uInt>(std::min<size_t>(cd.size(), 0xFFFFFFFFu))));
    size_t at = 0;
    for (uint64_t k = 0; k < entries; ++k) {
      if (at + 46 > cd.size() || u32(cd, at) != 0x02014b50) fail("damaged central directory");
      const uint32_t crc = u32(cd, at + 16);
      const size_t name_size = u16(cd, at + 28);
      const size_t extra = u16(cd, at + 30), comment = u16(cd, at + 32);
      if (at + 46 + name_size > cd.size()) fail("damaged central directory");
      const std::string name = cd.substr(at + 46, name_size);
      const size_t slash = name.find('/');
      crcs_[slash == std::string::npos ? name : name.substr(slash + 1)] = crc;
      at += 46 + name_size + extra + comment;
    }
  }

  // FormatError naming the file and the record when `bytes` are not what was written.
  void check(const std::string& record, const void* bytes, size_t size) const {
    const auto it = crcs_.find(record);
    if (it == crcs_.end()) {
      throw FormatError(
          fmt::format("{}: record '{}' is not in the zip central directory "
                      "(the file is damaged)",
                      path_, record));
    }
    const uLong crc = parallel_crc32(static_cast<const Bytef*>(bytes), size);
    if (static_cast<uint32_t>(crc) != it->second) {
      throw FormatError(fmt::format(
          "{}: record '{}' fails its CRC-32 check (written {:08x}, read {:08x}): the file is "
          "damaged; re-copy or re-save it",
          path_, record, it->second, static_cast<uint32_t>(crc)));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError(fmt::format("{}: zip archive: {}", path_, why));
  }
  static uint64_t le(const std::string& s, size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
    return v;
  }
  uint32_t u16(const std::string& s, size_t at) const {
    if (at + 2 > s.size()) fail("damaged central directory");
    return static_cast<uint32_t>(le(s, at, 2));
  }
  uint32_t u32(const std::string& s, size_t at) const {
    if (at + 4 > s.size()) fail("damaged central directory");
    return static_cast<uint32_t>(le(s, at, 4));
  }
  uint64_t u64(const std::string& s, size_t at) const {
    if (at + 8 > s.size()) fail("damaged central directory");
    return le(s, at, 8);
  }

  std::string path_;
  std::map<std::string, uint32_t> crcs_;
  uint32_t directory_crc_ = 0;

 public:
  uint32_t directory_crc() const { return directory_crc_; }
};
[[noreturn]] void pickle_error(const std::string& path, const std::string& why) {
  throw FormatError(fmt::format("{}: data.pkl: {}", path, why));
}

// Record data/<key>: its bytes checked against the CRC-32 written with them and owned by the
// returned tensor, so the checkpoint's largest part is never copied twice.
at::Tensor read_storage(const std::string& path, caffe2::serialize::PyTorchStreamReader& archive,
                        const ZipChecksums& checksums, const std::string& key, at::ScalarType dtype,
                        int64_t numel, const std::string& type_name) {
  const std::string record = "data/" + key;
  const size_t element = c10::elementSize(dtype);
  size_t size = 0;
  at::DataPtr bytes;
  try {
    if (!archive.hasRecord(record))
      pickle_error(path, fmt::format("storage record '{}' is missing", record));
    std::tie(bytes, size) = archive.getRecord(record);
  } catch (const c10::Error& e) {
    throw FormatError(
        fmt::format("{}: cannot read storage record '{}': {}", path, record, brief_what(e)));
  }
  checksums.check(record, bytes.get(), size);
  // Compared by division: a forged element count must not overflow the byte count.
  if (static_cast<uint64_t>(numel) > size / element) {
    pickle_error(path, fmt::format("storage record '{}' holds {} bytes, too few for its {} of {} "
                                   "elements of {} bytes (truncated file?)",
                                   record, size, type_name, numel, element));
  }
  const auto options = at::TensorOptions().dtype(dtype);
  if (numel == 0) return at::empty({0}, options);
  auto holder = std::make_shared<at::DataPtr>(std::move(bytes));
  return at::from_blob(
      holder->get(), {numel}, [holder](void*) {}, options);
}

}  // namespace

const PyValue* PyValue::find(const std::string& key) const {
  if (kind != Kind::kDict && kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kString && k->text == key) return v.get();
  }
  return nullptr;
}

std::string PyValue::type_name() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kTensor:
      return "tensor";
    case Kind::kGlobal:
      return "global";
    case Kind::kStorage:
      return "storage";
    case Kind::kObject:
      return text;
  }
  return "?";
}

PyValue::~PyValue() {
  std::vector<Ref> pending;
  auto adopt = [&pending](PyValue& v) {
    for (auto& item : v.items) pending.push_back(std::move(item));
    for (auto& [key, value] : v.entries) {
      pending.push_back(std::move(key));
      pending.push_back(std::move(value));
    }
    v.items.clear();
    v.entries.clear();
  };
  adopt(*this);
  while (!pending.empty()) {
    Ref next = std::move(pending.back());
    pending.pop_back();
    // The last owner takes the children first, so `next` dies with none to recurse into.
    if (next && next.use_count() == 1) adopt(*next);
  }
}

std::string PyValue::brief_at(int level) const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return boolean ? "True" : "False";
    case Kind::kInt:
      return std::to_string(integer);
    case Kind::kFloat:
      return fmt::format("{}", real);
    case Kind::kString:
      return "'" + text + "'";
    case Kind::kBytes:
      return fmt::format("bytes({})", text.size());
    case Kind::kTuple:
    case Kind::kList: {
      const bool tuple = kind == Kind::kTuple;
      if (level >= 3) return tuple ? "(...)" : "[...]";
      std::vector<std::string> parts;
      for (size_t i = 0; i < std::min<size_t>(items.size(), 5); ++i) {
        parts.push_back(items[i]->brief_at(level + 1));
      }
      if (items.size() > 5) parts.push_back("...");
      return (tuple ? "(" : "[") + join(parts, ", ") + (tuple ? ")" : "]");
    }
    case Kind::kDict:
      return fmt::format("dict({} entries)", entries.size());
    case Kind::kTensor:
      return fmt::format("tensor({}, {})", c10::toString(dtype), shape_string(shape));
    case Kind::kGlobal:
      return text;
    case Kind::kStorage:
      return fmt::format("storage('{}')", text);
    case Kind::kObject:
      return fmt::format("{}(...)", text.substr(text.rfind('.') + 1));
  }
  return "?";
}

std::vector<std::string> allowed_torch_globals() {
  std::vector<std::string> out = torch_callable_globals();
  for (const auto& [name, type] : torch_storage_types()) out.push_back(name);
  return out;
}

namespace {

PyValue::Ref load_archive(const std::string& path, uint64_t offset, std::optional<uint64_t> length,
                          const std::string& origin, const TorchFileOptions& options) {
  auto range = std::make_shared<FileRange>(path, offset, length);
  char head[4] = {};
  const size_t got = range->read(0, head, 4);
  if (got < 4 || std::memcmp(head, "PK\x03\x04", 4) != 0) {
    // The legacy format (PyTorch < 1.6, or _use_new_zipfile_serialization=False) starts with a
    // pickled magic number; reading it would need the unrestricted unpickler.
    const bool legacy = got >= 2 && static_cast<uint8_t>(head[0]) == 0x80;
    throw FormatError(fmt::format(
        "{}: not a zip archive written by torch.save{}", origin,
        legacy ? ": this is the legacy (pre-1.6) torch.save format; re-save it in Python with "
                 "torch.save(torch.load(path), path) on PyTorch >= 1.6"
               : " (corrupt or not a PyTorch checkpoint)"));
  }
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  std::unique_ptr<ZipChecksums> checksums;
  std::string pickle;
  try {
    checksums = std::make_unique<ZipChecksums>(*range, origin);
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(range);
    if (!archive->hasRecord("data.pkl")) {
      throw FormatError(fmt::format("{}: the archive has no data.pkl record", origin));
    }
    if (archive->hasRecord("byteorder")) {
      auto [bytes, size] = archive->getRecord("byteorder");
      checksums->check("byteorder", bytes.get(), size);
      const std::string order(static_cast<const char*>(bytes.get()), size);
      if (order != "little") {
        throw FormatError(
            fmt::format("{}: byteorder is '{}'; only little-endian checkpoints are "
                        "read (re-save it on a little-endian machine)",
                        origin, order));
      }
    }
    auto [bytes, size] = archive->getRecord("data.pkl");
    checksums->check("data.pkl", bytes.get(), size);
    pickle.assign(static_cast<const char*>(bytes.get()), size);
  } catch (const c10::Error& e) {
    throw FormatError(fmt::format("{}: corrupt torch.save archive: {}", origin, brief_what(e)));
  }
  const PickleGlobals globals =
      options.deepspeed_classes ? PickleGlobals::kDeepSpeed : PickleGlobals::kTorchSave;
  if (!options.load_tensors) return unpickle(origin, pickle, nullptr, globals);
  caffe2::serialize::PyTorchStreamReader& zip = *archive;
  const ZipChecksums& crcs = *checksums;
  return unpickle(
      origin, pickle,
      [&](const std::string& key, at::ScalarType dtype, int64_t numel,
          const std::string& type_name) {
        return read_storage(origin, zip, crcs, key, dtype, numel, type_name);
      },
      globals);
}

}  // namespace

PyValue::Ref load_torch_file(const std::string& path, const TorchFileOptions& options) {
  return load_archive(path, 0, std::nullopt, path, options);
}

PyValue::Ref load_torch_record(const std::string& path, uint64_t offset, uint64_t length,
                               const std::string& origin, const TorchFileOptions& options) {
  return load_archive(path, offset, length, origin, options);
}

uint32_t torch_file_directory_crc(const std::string& path) {
  const FileRange range(path, 0, std::nullopt);
  return ZipChecksums(range, path).directory_crc();
}

}  // namespace curv
